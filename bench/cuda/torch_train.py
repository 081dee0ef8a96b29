#!/usr/bin/env python3
# PyTorch on the GPU, peer of bench/lenet/bench_train --backend cuda: trains LeNet-5 or ResNet-8
# (torch_bench.py's definitions) on Fashion-MNIST with the same normalisation, batch, SGD and
# epochs, batches sliced from tensors already on the GPU, and prints one JSON line like it.
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench  # noqa: E402


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = struct.unpack(">I", data[:4])[0] & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--model", default="lenet5", choices=["lenet5", "resnet8"])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--max-steps", type=int, default=-1, help="stop each epoch early")
    p.add_argument("--device", default="cuda", help="cpu checks the script without a GPU")
    a = p.parse_args()
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_train: PyTorch sees no CUDA device; nothing measured", file=sys.stderr)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    x_tr = read_idx(f"{a.data}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y_tr = read_idx(f"{a.data}/train-labels-idx1-ubyte.gz").astype(np.int64)
    x_te = read_idx(f"{a.data}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y_te = read_idx(f"{a.data}/t10k-labels-idx1-ubyte.gz").astype(np.int64)
    mean, std = float(x_tr.mean()), float(x_tr.std())
    to_dev = lambda x: torch.from_numpy((x - mean) / std).unsqueeze(1).contiguous().to(dev)
    x_tr, x_te = to_dev(x_tr), to_dev(x_te)
    y_tr, y_te = torch.from_numpy(y_tr).to(dev), torch.from_numpy(y_te).to(dev)
    model, _ = torch_bench.build(torch, a.model, in_ch=1)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = x_tr.shape[0]
    images, secs = 0, 0.0
    for epoch in range(a.epochs):
        model.train()
        order = torch.randperm(n, device=dev)
        sync()
        t0 = time.perf_counter()
        for step, i in enumerate(range(0, n - a.batch + 1, a.batch)):
            if step == a.max_steps:
                break
            idx = order[i:i + a.batch]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x_tr[idx]), y_tr[idx]).backward()
            opt.step()
            images += a.batch
        sync()
        secs += time.perf_counter() - t0
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x_te.shape[0], 500):
            correct += int((model(x_te[i:i + 500]).argmax(1) == y_te[i:i + 500]).sum())
    print(json.dumps({"framework": "pytorch", "backend": a.device, "model": a.model, "epochs": a.epochs,
                      "images": images, "train_seconds": round(secs, 3), "images_per_s": round(images / secs, 1),
                      "test_accuracy": round(correct / x_te.shape[0], 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
