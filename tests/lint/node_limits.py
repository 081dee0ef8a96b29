#!/usr/bin/env python3
"""Checks the node layer's size limits: no source file over 500 lines, no function (or lambda)
body over 80 lines, no class with over 25 member functions, and no asio::detached (a coroutine's
exception would vanish).

Usage: node_limits.py ROOT [DIR ...]   (default dirs: device edge server runtime)
Prints every breach as FILE:LINE: what, and exits 1 if there is any.
"""
import os
import re
import sys

MAX_FILE, MAX_FUNCTION, MAX_METHODS = 500, 80, 25
SOURCES = (".h", ".cpp")
CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else)\b\s*(\(|$)")


def code_of(text):
    """The text with comments and string/char literals blanked, newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(code):
    """(line, length, head) of every function or lambda body longer than MAX_FUNCTION lines."""
    found, stack, head_start = [], [], 0
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            head = code[head_start:i].strip()
            is_function = head.endswith(")") or re.search(r"\)\s*(const|noexcept|override|mutable|->[^{;]*)\s*$", head)
            if is_function and not CONTROL.search(head.split("\n")[-1]):
                stack.append((line, head.split("\n")[-1].strip()))
            else:
                stack.append(None)
            head_start = i + 1
        elif c == "}":
            if stack:
                opened = stack.pop()
                if opened and line - opened[0] + 1 > MAX_FUNCTION:
                    found.append((opened[0], line - opened[0] + 1, opened[1]))
            head_start = i + 1
        elif c == ";":
            head_start = i + 1
    return found


CLASS_HEAD = re.compile(r"\b(class|struct)\s+(\w+)(\s+final)?\s*(:[^{;]*)?$")
METHOD = re.compile(r"(operator\s*\S+|~?\w+)\s*\((?:[^()]|\([^()]*\))*\)\s*(const)?\s*(noexcept)?\s*"
                    r"(override|final)?\s*(=\s*(0|default|delete))?\s*(->[^;{]*)?$")


def fat_classes(code):
    """(line, name, count) of every class or struct whose body declares more than MAX_METHODS
    member functions (constructors included, deleted ones not; nested classes count on their own)."""
    found = []
    stack = []  # per open brace: None, or [name, line, count] for a class body
    head_start, line = 0, 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c in "{;":
            head = " ".join(code[head_start:i].split())
            head = re.sub(r"^(public|private|protected)\s*:\s*", "", head)
            cls = stack[-1] if stack else None
            skip = ("using ", "friend ", "static_assert", "typedef ")
            if cls is not None and head and not head.startswith(skip) and not re.search(r"=\s*delete$", head):
                if METHOD.search(head) and "=" not in re.sub(r"=\s*(0|default|delete)\s*$", "", head):
                    cls[2] += 1
            if c == "{":
                m = CLASS_HEAD.search(head)
                stack.append([m.group(2), line, 0] if m and "(" not in head else None)
            head_start = i + 1
        elif c == "}":
            if stack:
                cls = stack.pop()
                if cls is not None and cls[2] > MAX_METHODS:
                    found.append((cls[1], cls[0], cls[2]))
            head_start = i + 1
        elif c == ":" and code[i - 1 : i + 1] != "::" and code[i : i + 2] != "::":
            if re.search(r"(public|private|protected)\s*$", code[head_start:i]):
                head_start = i + 1
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    dirs = sys.argv[2:] or ["device", "edge", "server", "runtime"]
    breaches = []
    for d in dirs:
        for base, _, files in os.walk(os.path.join(root, d)):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(base, f)
                text = open(path, encoding="utf-8").read()
                rel = os.path.relpath(path, root)
                n = text.count("\n")
                if n > MAX_FILE:
                    breaches.append(f"{rel}:1: {n} lines (at most {MAX_FILE})")
                code = code_of(text)
                if "detached" in code:
                    breaches.append(f"{rel}:{code[:code.index('detached')].count(chr(10)) + 1}: asio::detached")
                for at, length, head in long_functions(code):
                    breaches.append(f"{rel}:{at}: a body of {length} lines (at most {MAX_FUNCTION}): {head[:80]}")
                for at, name, count in fat_classes(code):
                    breaches.append(f"{rel}:{at}: class {name} has {count} member functions (at most {MAX_METHODS})")
    for b in breaches:
        print(b)
    if not breaches:
        print("node layer within limits: files <= %d lines, bodies <= %d lines, classes <= %d member functions, "
              "no asio::detached" % (MAX_FILE, MAX_FUNCTION, MAX_METHODS))
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
