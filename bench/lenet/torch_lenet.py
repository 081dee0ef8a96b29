#!/usr/bin/python3
"""PyTorch CPU peer of bench_train: the same LeNet-5, data, normalisation, batch and optimizer.

Prints one JSON line like bench_train. Batches are sliced from in-memory tensors (no
DataLoader) so both sides measure the training loop, not data plumbing.
"""
import argparse, gzip, json, struct, time

import numpy as np
import torch
import torch.nn as nn


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(root):
    x_tr = read_idx(f"{root}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y_tr = read_idx(f"{root}/train-labels-idx1-ubyte.gz").astype(np.int64)
    x_te = read_idx(f"{root}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y_te = read_idx(f"{root}/t10k-labels-idx1-ubyte.gz").astype(np.int64)
    mean, std = float(x_tr.mean()), float(x_tr.std())
    norm = lambda x: torch.from_numpy((x - mean) / std).unsqueeze(1).contiguous()
    return norm(x_tr), torch.from_numpy(y_tr), norm(x_te), torch.from_numpy(y_te)


def lenet5(classes=10):
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, classes))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x_tr, y_tr, x_te, y_te = load(a.data)
    model = lenet5()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(a.seed)
    images, secs, acc = 0, 0.0, 0.0
    for epoch in range(a.epochs):
        model.train()
        order = torch.randperm(len(y_tr), generator=g)
        t0 = time.perf_counter()
        for i in range(0, len(order), a.batch):
            idx = order[i:i + a.batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x_tr[idx]), y_tr[idx])
            loss.backward()
            opt.step()
            images += len(idx)
        secs += time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            acc = float((model(x_te).argmax(1) == y_te).float().mean())
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "model": "lenet5",
                      "epochs": a.epochs, "images": images, "train_seconds": round(secs, 3),
                      "images_per_s": round(images / secs, 1), "test_accuracy": round(acc, 4)}))


if __name__ == "__main__":
    main()
