#!/usr/bin/python3
"""PyTorch CPU peer of bench_models: the zoo's architectures, the same data, normalisation,
batch and optimizer; prints one JSON line like bench_models.

lenet5, resnet8, resnet18 and vgg11-bn are the modules scripts/export_check.py loads cleave's
exported weights into (so they are checked to be the same networks); MobileNetV2 (CIFAR style)
is defined here. Images stay u8 in memory and each batch is normalised when drawn, as cleave
does, so both sides hold the same data. Batches are sliced from in-memory tensors (no
DataLoader): both sides measure the training loop, not data plumbing.

  torch_models.py --model resnet18 [--data DIR] [--steps 20] [--warmup 3] [--epochs 0]
                  [--init F] [--order F] [--eval-weights F]

--init starts from cleave's initial weights (bench_models --init-out) and --order draws the
epochs' samples in cleave's order (bench_models --order-out), so both sides run the same
training and differ only in arithmetic. --eval-weights only evaluates the given weights (cleave's
trained model, bench_models --final-out) on the test split: the same accuracy as cleave's own
evaluation shows that both sides are the same network.
"""
import argparse, gzip, json, math, os, resource, struct, sys, time

t_start = time.perf_counter()
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from export_check import LeNet5, ResNet8, ResNet18, VGG11BN, read_safetensors  # noqa: E402


def make_divisible(v, divisor=8):
    """torchvision's rounding: to a multiple of divisor, never below 90% of v."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, t):
        super().__init__()
        hidden = cin * t
        layers = []
        if t != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True)]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                   nn.ReLU6(inplace=True), nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.use_res = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """CIFAR-style MobileNetV2: stem 3x3 stride 1, the paper's (t,c,n,s) settings, 1280 head."""
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]

    def __init__(self, in_shape, classes, width=1.0):
        super().__init__()
        cin = make_divisible(32 * width)
        layers = [nn.Conv2d(in_shape[0], cin, 3, 1, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(inplace=True)]
        for t, c, n, s in self.SETTINGS:
            cout = make_divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        head = make_divisible(1280 * max(1.0, width))
        layers += [nn.Conv2d(cin, head, 1, bias=False), nn.BatchNorm2d(head), nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(head, classes)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


ZOO = {"lenet5": LeNet5, "resnet8": ResNet8, "resnet18": ResNet18, "vgg11-bn": VGG11BN, "mobilenetv2": MobileNetV2}


def load_weights(model, path):
    """Loads a bench_models safetensors file. Names are PyTorch's for the models `cleave export`
    maps; a model it does not map (MobileNetV2) keeps cleave's names, and is loaded layer by layer
    in the order the layers appear on both sides, each layer's tensors checked by name and shape."""
    tensors, _ = read_safetensors(path)
    state = model.state_dict()
    if set(tensors) == set(state):
        model.load_state_dict(tensors, strict=True)
        return
    def layers(named):  # {layer prefix: {suffix: tensor}} in the order the layers first appear
        out = {}
        for name, t in named:
            prefix, _, suffix = name.rpartition(".")
            out.setdefault(prefix, {})[suffix] = t
        return list(out.items())

    ours, theirs = layers(state.items()), layers(tensors.items())
    if len(ours) != len(theirs):
        raise SystemExit(f"torch_models: {path}: {len(theirs)} layers, the model has {len(ours)}")
    mapped = {}
    for (prefix, ts), (cprefix, cs) in zip(ours, theirs):
        if set(ts) != set(cs) or any(tuple(ts[k].shape) != tuple(cs[k].shape) for k in ts):
            raise SystemExit(f"torch_models: {path}: layer '{cprefix}' "
                             f"{ {k: tuple(v.shape) for k, v in cs.items()} } does not match '{prefix}' "
                             f"{ {k: tuple(v.shape) for k, v in ts.items()} }")
        mapped.update({f"{prefix}.{k}": v for k, v in cs.items()})
    model.load_state_dict(mapped, strict=True)


# ---- data: IDX (Fashion-MNIST) or CIFAR-10/100 binary, u8 (N,C,H,W) with labels

def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def idx_path(root, base):
    for ext in (".gz", ""):
        if os.path.exists(os.path.join(root, base + ext)):
            return os.path.join(root, base + ext)
    raise SystemExit(f"torch_models: {root}: no {base}[.gz]")


def read_cifar(paths, label_bytes):
    raw = np.concatenate([np.fromfile(p, dtype=np.uint8) for p in paths]).reshape(-1, label_bytes + 3072)
    return raw[:, label_bytes:].reshape(-1, 3, 32, 32), raw[:, label_bytes - 1].astype(np.int64)


def load(root):
    """u8 images (N,C,H,W) and i64 labels of both splits, and per-channel (mean, std) of train."""
    if os.path.exists(os.path.join(root, "data_batch_1.bin")):
        x_tr, y_tr = read_cifar([os.path.join(root, f"data_batch_{i}.bin") for i in range(1, 6)], 1)
        x_te, y_te = read_cifar([os.path.join(root, "test_batch.bin")], 1)
    elif os.path.exists(os.path.join(root, "train.bin")):
        x_tr, y_tr = read_cifar([os.path.join(root, "train.bin")], 2)
        x_te, y_te = read_cifar([os.path.join(root, "test.bin")], 2)
    else:
        x_tr = read_idx(idx_path(root, "train-images-idx3-ubyte"))
        y_tr = read_idx(idx_path(root, "train-labels-idx1-ubyte")).astype(np.int64)
        x_te = read_idx(idx_path(root, "t10k-images-idx3-ubyte"))
        y_te = read_idx(idx_path(root, "t10k-labels-idx1-ubyte")).astype(np.int64)
        x_tr, x_te = x_tr[:, None], x_te[:, None]
    stats = []  # from a histogram of the u8 values: no float copy of the images
    for c in range(x_tr.shape[1]):
        h = np.bincount(x_tr[:, c].reshape(-1), minlength=256).astype(np.float64)
        v = np.arange(256) / 255.0
        mean = (h * v).sum() / h.sum()
        stats.append((mean, np.sqrt(max(1e-12, (h * v * v).sum() / h.sum() - mean * mean))))
    own = lambda a: torch.from_numpy(np.array(a, copy=True, order="C"))  # writable, contiguous
    return own(x_tr), own(y_tr), own(x_te), own(y_te), stats


def normaliser(stats):
    mean = torch.tensor([m for m, _ in stats], dtype=torch.float32).view(1, -1, 1, 1)
    inv = torch.tensor([1.0 / s for _, s in stats], dtype=torch.float32).view(1, -1, 1, 1)
    return lambda x: (x.float() * (1.0 / 255.0) - mean) * inv


def main():
    p = argparse.ArgumentParser(description="PyTorch CPU peer of bench_models")
    p.add_argument("--model", required=True, choices=sorted(ZOO))
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20, help="timed steps (after the warm-up)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--epochs", type=int, default=0, help="instead: train whole epochs, report test accuracy")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                   help="cosine: from --lr to 0 over every step of the run, as cleave's trainer")
    p.add_argument("--init", help="initial weights (bench_models --init-out)")
    p.add_argument("--order", help="the epochs' sample order (bench_models --order-out)")
    p.add_argument("--eval-weights", help="only evaluate these weights on the test split")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x_tr, y_tr, x_te, y_te, stats = load(a.data)
    norm = normaliser(stats)
    classes = int(max(y_tr.max(), y_te.max())) + 1
    model = ZOO[a.model](tuple(x_tr.shape[1:]), classes)
    if a.init or a.eval_weights:
        load_weights(model, a.eval_weights or a.init)
    orders = None
    if a.order:
        orders = torch.from_numpy(np.fromfile(a.order, dtype="<i8").astype(np.int64))
        if a.epochs <= 0 or orders.numel() != a.epochs * len(y_tr):
            raise SystemExit(f"torch_models: {a.order}: {orders.numel()} indices, expected --epochs x "
                             f"{len(y_tr)} samples")
        orders = orders.view(a.epochs, len(y_tr))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    g = torch.Generator().manual_seed(a.seed)
    # Steps of the run as cleave counts them (a last partial batch is a step).
    total = a.epochs * -(-len(y_tr) // a.batch) if a.epochs > 0 else a.warmup + a.steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 0.5 * (1 + math.cos(math.pi * min(1.0, t / total))) if a.lr_schedule == "cosine" else 1.0)

    def step(idx):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(norm(x_tr[idx])), y_tr[idx])
        loss.backward()
        opt.step()
        sched.step()
        return loss

    def evaluate():
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(y_te), 500):
                correct += int((model(norm(x_te[i:i + 500])).argmax(1) == y_te[i:i + 500]).sum())
        return correct / len(y_te)

    model.train()
    images, secs, acc = 0, 0.0, None
    if a.eval_weights:
        print(json.dumps({"framework": "pytorch", "version": torch.__version__, "model": a.model,
                          "params": params, "weights": a.eval_weights, "test_accuracy": evaluate()}))
        return
    if a.epochs > 0:
        for e in range(a.epochs):
            model.train()
            order = orders[e] if orders is not None else torch.randperm(len(y_tr), generator=g)
            t0 = time.perf_counter()
            for i in range(0, len(order), a.batch):
                step(order[i:i + a.batch])
                images += len(order[i:i + a.batch])
            secs += time.perf_counter() - t0
        acc = evaluate()
    else:
        order = torch.randperm(len(y_tr), generator=g)
        batch = lambda s: order[(s * a.batch) % (len(order) - a.batch):][:a.batch]
        for s in range(a.warmup):
            step(batch(s))
        t0 = time.perf_counter()
        for s in range(a.steps):
            loss = step(batch(a.warmup + s))
        float(loss)
        secs = time.perf_counter() - t0
        images = a.steps * a.batch
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "model": a.model, "params": params,
                      "batch": a.batch, "images": images, "train_seconds": round(secs, 3),
                      "images_per_s": round(images / secs, 1), "test_accuracy": acc,
                      "wall_s": round(time.perf_counter() - t_start, 3),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


if __name__ == "__main__":
    main()
