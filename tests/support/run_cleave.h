// Runs the cleave binary (CLEAVE_BINARY, defined by the test's CMake target) or another program
// as a child process and collects its exit status and its output (stdout and stderr together).
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace cleave::testing {

struct outcome {
  int status = -1;     // exit status (-1: killed by a signal)
  std::string output;  // stdout and stderr
};

// Runs `binary` with these arguments.
inline outcome run_program(const std::string& binary, const std::vector<std::string>& args) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> argv{const_cast<char*>(binary.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  outcome o;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) o.output.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

#ifdef CLEAVE_BINARY
inline outcome run_cleave(const std::vector<std::string>& args) {
  return run_program(CLEAVE_BINARY, args);
}
#endif

}  // namespace cleave::testing
