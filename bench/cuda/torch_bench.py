#!/usr/bin/env python3
# The networks of cuda_bench.cpp (LeNet-5, ResNet-8) in PyTorch on the same GPU: ms per training
# step (forward + loss + backward). With --cleave FILE (cuda_bench --json output) it prints
# cleave's figures beside PyTorch's and the ratio.
import argparse
import json
import sys
import time


def build(torch, which, in_ch=3):
    nn = torch.nn
    if which == "lenet5":
        return nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10)), (1, 28, 28)

    class block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.main = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                          if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return torch.relu(self.main(x) + self.short(x))

    return nn.Sequential(
        nn.Conv2d(in_ch, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        block(16, 16, 1), block(16, 32, 2), block(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)), (in_ch, 32, 32)


def time_net(torch, which, batch, seconds):
    model, item = build(torch, which)
    model = model.cuda().train()
    x = torch.rand((batch,) + item, device="cuda") * 2 - 1
    y = torch.arange(batch, device="cuda") % 10
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        loss = loss_fn(model(x), y)
        loss.backward()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while n < 20 or time.perf_counter() - t0 < seconds:
        step()
        n += 1
        if n >= 20:
            torch.cuda.synchronize()
        if n >= 2000:
            break
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0 / n, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--cleave", help="JSON written by cleave_bench_cuda --json")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_bench: PyTorch not installed; nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("torch_bench: PyTorch sees no CUDA device; nothing measured")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.backends.cudnn.benchmark = True  # measured algorithm choice, as cleave's cudnnFind
    torch.manual_seed(0)
    cleave = {}
    if a.cleave:
        with open(a.cleave) as f:
            data = json.load(f)
        cleave = {r["net"]: r for r in data["results"]}
        if data.get("batch") != a.batch or bool(data.get("tf32")) != a.tf32:
            print("torch_bench: warning: cleave ran with batch %s tf32 %s" % (data.get("batch"), data.get("tf32")))
    print("torch_bench: PyTorch %s, %s, batch %d, tf32 %s" %
          (torch.__version__, torch.cuda.get_device_name(0), a.batch, a.tf32))
    print("%-8s %12s %8s %12s %16s" % ("net", "torch ms", "steps", "cleave ms", "cleave/torch"))
    for which in ("lenet5", "resnet8"):
        ms, n = time_net(torch, which, a.batch, a.seconds)
        if which in cleave:
            c = cleave[which]["cuda_ms"]
            print("%-8s %12.3f %8d %12.3f %15.2fx" % (which, ms, n, c, c / ms))
        else:
            print("%-8s %12.3f %8d %12s %16s" % (which, ms, n, "-", "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
