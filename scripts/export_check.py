#!/usr/bin/env python3
"""Loads `cleave export` files into PyTorch modules of the zoo architectures (mlp, lenet5,
resnet8, resnet18, vgg11-bn), evaluates them on an IDX test split and compares with `cleave eval` on the same
checkpoint. Exits 77 (skipped) where torch cannot be imported.

Each model is trained for a few steps with `cleave train`, evaluated with `cleave eval`,
exported with `cleave export`, then read here (with our own safetensors parser; with
safetensors.torch as well when it is installed) and evaluated by PyTorch. Without --data a
small synthetic data set with class-dependent patterns is written to the work directory.

  scripts/export_check.py --cleave build/apps/cleave [--data fashion-mnist|DIR] [--work DIR]
"""
import argparse
import gzip
import json
import math
import os
import random
import re
import struct
import subprocess
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print(f"export_check: torch is not importable ({e}): skipped")
    sys.exit(77)

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


# ---- the zoo's architectures as PyTorch modules (names as core/include/cleave/core/torch_export.h maps them)

class MLP(nn.Module):
    def __init__(self, in_shape, classes):
        super().__init__()
        c, h, w = in_shape
        self.fc1 = nn.Linear(c * h * w, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, classes)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class LeNet5(nn.Module):
    def __init__(self, in_shape, classes):
        super().__init__()
        c, h, w = in_shape
        self.conv1 = nn.Conv2d(c, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        ph, pw = ((h // 2) - 4) // 2, ((w // 2) - 4) // 2
        self.fc1 = nn.Linear(16 * ph * pw, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class ResNet8(nn.Module):
    def __init__(self, in_shape, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(in_shape[0], 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(BasicBlock(16, 16, 1))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2))
        self.layer3 = nn.Sequential(BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class ResNet18(nn.Module):
    """He et al. ResNet-18 with the CIFAR stem (3x3 conv stride 1, no max pool), torchvision's names."""

    def __init__(self, in_shape, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(in_shape[0], 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        cin, stages = 64, []
        for i, width in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(cin, width, stride), BasicBlock(width, width, 1)))
            cin = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


class VGG11BN(nn.Module):
    """VGG-11 with batch norm, CIFAR classifier (one linear layer). As cleave's zoo, a max pool
    that would take a side below 1 is left out (the fifth on 28x28 inputs)."""

    def __init__(self, in_shape, classes):
        super().__init__()
        c, h, w = in_shape
        layers = []
        for v in VGG11:
            if v == "M":
                if h >= 2 and w >= 2:
                    layers.append(nn.MaxPool2d(2))
                    h, w = h // 2, w // 2
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                c = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c * h * w, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


LARGE = {"resnet18", "vgg11-bn"}  # trained for at most 8 steps: the check is of names and values
ZOO = {"mlp": MLP, "lenet5": LeNet5, "resnet8": ResNet8, "resnet18": ResNet18, "vgg11-bn": VGG11BN}


# ---- safetensors, read by hand

DTYPES = {"F32": torch.float32, "I64": torch.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    payload = data[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        raw = bytearray(payload[begin:end])
        dtype = DTYPES[t["dtype"]]
        if raw:
            v = torch.frombuffer(raw, dtype=dtype)
        else:
            v = torch.empty(0, dtype=dtype)
        tensors[name] = v.reshape(t["shape"]).clone()
    return tensors, meta


# ---- IDX data, normalised as cleave does it (per channel, the training split's statistics)

def open_maybe_gz(path):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def idx_file(directory, base):
    for ext in (".gz", ""):
        p = os.path.join(directory, base + ext)
        if os.path.exists(p):
            return p
    raise SystemExit(f"export_check: {directory}: no {base}[.gz]")


def read_images(path):
    with open_maybe_gz(path) as f:
        data = f.read()
    (magic,) = struct.unpack(">I", data[:4])
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    n, h, w = dims[:3]
    c = dims[3] if len(dims) == 4 else 1
    x = torch.frombuffer(bytearray(data[4 + 4 * len(dims):]), dtype=torch.uint8)
    return x.reshape(n, h, w, c).permute(0, 3, 1, 2).contiguous()


def read_labels(path):
    with open_maybe_gz(path) as f:
        data = f.read()
    return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).long()


def load_test_split(directory):
    """The test images scaled to [0,1], their labels, and the training split's per-channel mean
    and standard deviation computed here (to check the exported model's metadata against)."""
    train = read_images(idx_file(directory, "train-images-idx3-ubyte")).float() * (1.0 / 255.0)
    test = read_images(idx_file(directory, "t10k-images-idx3-ubyte")).float() * (1.0 / 255.0)
    labels = read_labels(idx_file(directory, "t10k-labels-idx1-ubyte"))
    means, stds = [], []
    for ch in range(train.shape[1]):
        v = train[:, ch].double()
        mean = v.mean().item()
        var = (v * v).mean().item() - mean * mean
        means.append(mean)
        stds.append(math.sqrt(max(1e-12, var)))
    return test, labels, means, stds


def normalised(test, meta, means, stds):
    """The test images normalised as the exported model's metadata says its inputs were in
    training; the metadata must be there and agree with the statistics computed here."""
    if "input_mean" not in meta or "input_std" not in meta:
        raise SystemExit("export_check: the exported model carries no input_mean/input_std metadata")
    mean, std = json.loads(meta["input_mean"]), json.loads(meta["input_std"])
    if len(mean) != test.shape[1] or len(std) != test.shape[1]:
        raise SystemExit(f"export_check: input_mean {mean} / input_std {std} for {test.shape[1]} channels")
    for ch in range(test.shape[1]):
        if abs(mean[ch] - means[ch]) > 1e-5 or abs(std[ch] / stds[ch] - 1) > 1e-5:
            raise SystemExit(f"export_check: channel {ch}: metadata mean {mean[ch]} std {std[ch]}, "
                             f"the training split's {means[ch]} {stds[ch]}")
    x = torch.empty(test.shape, dtype=torch.float32)
    for ch in range(test.shape[1]):
        x[:, ch] = ((test[:, ch].double() - mean[ch]) / std[ch]).float()
    return x


def write_synthetic(directory, n_train=600, n_test=200, classes=10, seed=3):
    """28x28 u8 images: a bright 7x7 square whose place depends on the class, over noise."""
    os.makedirs(directory, exist_ok=True)
    rnd = random.Random(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        pixels = bytearray()
        labels = bytearray()
        for i in range(n):
            k = rnd.randrange(classes)
            r0, c0 = 3 + 7 * (k // 4), 3 + 6 * (k % 4)
            for r in range(28):
                for c in range(28):
                    on = r0 <= r < r0 + 7 and c0 <= c < c0 + 7
                    pixels.append(min(255, (200 if on else 0) + rnd.randrange(56)))
            labels.append(k)
        with open(os.path.join(directory, f"{prefix}-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, 28, 28) + pixels)
        with open(os.path.join(directory, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + labels)
    return directory


# ---- the check

def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout)
        raise SystemExit(f"export_check: {' '.join(cmd)} failed with status {r.returncode}")
    return r.stdout


def torch_eval(model, x, y, batch=500):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            logits = model(x[i:i + batch])
            loss += F.cross_entropy(logits, y[i:i + batch], reduction="sum").item()
            correct += (logits.argmax(1) == y[i:i + batch]).sum().item()
    return loss / len(y), correct / len(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleave", required=True, help="the cleave binary")
    ap.add_argument("--data", help="'fashion-mnist' or a directory of IDX files (default: synthetic)")
    ap.add_argument("--work", default="export-check", help="directory for checkpoints and exports")
    ap.add_argument("--models", default="mlp,lenet5,resnet8,resnet18,vgg11-bn")
    ap.add_argument("--steps", type=int, default=40, help="training steps per model (at most 8 for the large ones)")
    ap.add_argument("--backend", default="auto", help="cleave's backend for training and evaluation")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    data = a.data or write_synthetic(os.path.join(a.work, "data"))
    data_dir = FASHION_MNIST if data == "fashion-mnist" else data
    raw, y, means, stds = load_test_split(data_dir)
    classes = int(max(y.max().item(), read_labels(idx_file(data_dir, "train-labels-idx1-ubyte")).max().item())) + 1
    torch.manual_seed(0)

    failures = []
    for name in a.models.split(","):
        ckpt = os.path.join(a.work, name + ".ckpt")
        out = os.path.join(a.work, name + ".safetensors")
        steps = min(a.steps, 8) if name in LARGE else a.steps
        run([a.cleave, "train", "--model", name, "--data", data, "--backend", a.backend, "--epochs", "1",
             "--max-steps", str(steps), "--batch", "32", "--lr", "0.02", "--checkpoint", ckpt])
        log = run([a.cleave, "eval", "--checkpoint", ckpt, "--data", data, "--backend", a.backend])
        m = re.search(r"test loss ([0-9.]+), test accuracy ([0-9.]+) \((\d+) images\)", log)
        if not m:
            raise SystemExit(f"export_check: no result in `cleave eval` output:\n{log}")
        c_loss, c_acc, c_n = float(m.group(1)), float(m.group(2)), int(m.group(3))
        run([a.cleave, "export", "--checkpoint", ckpt, "--out", out, "--model", name])

        state, meta = read_safetensors(out)
        try:
            from safetensors.torch import load_file  # optional: the reference reader agrees
            ref = load_file(out)
            assert ref.keys() == state.keys() and all(torch.equal(ref[k], state[k]) for k in ref), \
                "safetensors.torch reads other tensors"
        except ImportError:
            pass
        x = normalised(raw, meta, means, stds)
        model = ZOO[name](tuple(x.shape[1:]), classes)
        model.load_state_dict(state, strict=True)
        t_loss, t_acc = torch_eval(model, x, y)
        ok = c_n == len(y) and abs(t_acc - c_acc) <= 0.00051 + 2.0 / len(y) and \
            abs(t_loss - c_loss) <= 0.00051 + 1e-3 * c_loss
        print(f"{name:8s} cleave eval: loss {c_loss:.4f} accuracy {c_acc:.4f} | "
              f"torch: loss {t_loss:.4f} accuracy {t_acc:.4f} ({len(y)} images, model {meta.get('model')}) "
              f"{'ok' if ok else 'MISMATCH'}")
        if not ok:
            failures.append(name)
    if failures:
        raise SystemExit(f"export_check: PyTorch disagrees with cleave eval for {', '.join(failures)}")


if __name__ == "__main__":
    main()
