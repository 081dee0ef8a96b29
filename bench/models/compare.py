#!/usr/bin/python3
"""Runs bench_models (cleave) and torch_models.py (PyTorch CPU) for each model, one after the
other in one run, and prints both sides and the ratios cleave/pytorch against the targets:
images/s >= 1.2x for every model (>= 2x for lenet5), peak RSS cleave <= pytorch, and with
--epochs the one-epoch test accuracy within 1 point for resnet18 and mobilenetv2.

With --epochs, PyTorch starts from cleave's initial weights and draws cleave's sample order
(--start same, the default), so the two sides differ only in arithmetic and the accuracy check
compares one training, not two seeds' luck; --start own gives each side its own seeded weights
and order. In both, cleave's trained weights are also evaluated by PyTorch: that accuracy equals
cleave's own where both sides are the same network.

Wall time and peak RSS are measured here for both processes alike (os.wait4's rusage of each
child); each side also reports its own. Called by run.sh.
"""
import argparse, json, os, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def run(cmd, env):
    """(the JSON line, wall seconds, peak RSS in MiB) of one child; JSON None where it failed."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)  # this child's own rusage, not all children's
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            sys.stderr.write(err.read().decode(errors="replace"))
            return None, wall, None
        line = out.read().decode().strip().splitlines()[-1]
    return json.loads(line), wall, ru.ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleave", required=True, help="the bench_models binary")
    ap.add_argument("--models", default="lenet5,resnet8,resnet18,mobilenetv2,vgg11-bn")
    ap.add_argument("--data", default=FASHION_MNIST, help="IDX or CIFAR-10/100 binary directory")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=0, help="train whole epochs and compare test accuracy")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                    help="cosine: from --lr to 0 over the run, on both sides")
    ap.add_argument("--start", choices=("same", "own"), default="same",
                    help="with --epochs: PyTorch from cleave's initial weights and order (same), or its own")
    a = ap.parse_args()
    work = tempfile.TemporaryDirectory(prefix="compare-")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(a.threads))
    common = ["--data", a.data, "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup),
              "--epochs", str(a.epochs), "--lr", str(a.lr), "--seed", str(a.seed), "--lr-schedule", a.lr_schedule]
    rows, failed = [], []
    for m in a.models.split(","):
        torch_base = ["/usr/bin/python3", os.path.join(HERE, "torch_models.py"), "--model", m, "--threads", str(a.threads)]
        torch_cmd = torch_base + common
        cleave_cmd = [a.cleave, "--model", m, "--backend", f"onednn:{a.threads}"] + common
        files = {k: os.path.join(work.name, f"{m}.{k}") for k in ("init", "order", "final")}
        if a.epochs:
            cleave_cmd += ["--final-out", files["final"]]
        if a.epochs and a.start == "same":
            print(f"{m}: cleave onednn:{a.threads}, then PyTorch CPU from its weights and order ...",
                  file=sys.stderr, flush=True)
            cleave_cmd += ["--init-out", files["init"], "--order-out", files["order"]]
            c, c_wall, c_rss = run(cleave_cmd, env)
            t, t_wall, t_rss = (run(torch_cmd + ["--init", files["init"], "--order", files["order"]], env)
                                if c is not None and "skipped" not in c else (None, None, None))
        else:
            print(f"{m}: PyTorch CPU, then cleave onednn:{a.threads} ...", file=sys.stderr, flush=True)
            t, t_wall, t_rss = run(torch_cmd, env)
            c, c_wall, c_rss = run(cleave_cmd, env)
        if a.epochs and c is not None and "skipped" not in c:
            e, _, _ = run(torch_base + ["--data", a.data, "--eval-weights", files["final"]], env)
            c["torch_eval"] = e["test_accuracy"] if e else None
        if c is not None and "skipped" in c:
            print(f"{m}: cleave skipped ({c['skipped']})", file=sys.stderr)
            rows.append((m, t, t_wall, t_rss, None, None, None, c["skipped"]))
            continue
        if t is None or c is None:
            failed.append(m)
            rows.append((m, t, t_wall, t_rss, c, c_wall, c_rss, "failed"))
            continue
        rows.append((m, t, t_wall, t_rss, c, c_wall, c_rss, None))

    print(f"batch {a.batch}, {a.threads} threads, SGD lr {a.lr} ({a.lr_schedule}) momentum 0.9, data {a.data}, "
          + (f"{a.epochs} epoch(s), " + ("PyTorch from cleave's initial weights and sample order" if a.start == "same"
                                         else "each side its own initial weights and order")
             if a.epochs else f"{a.steps} timed steps after {a.warmup} warm-up"))
    print(f"{'model':12} {'params':>9} {'torch img/s':>11} {'cleave img/s':>12} {'ratio':>6} {'target':>6}  "
          f"{'torch RSS':>9} {'cleave RSS':>10} {'ratio':>5}  {'torch wall':>10} {'cleave wall':>11}"
          + ("  torch acc  cleave acc (difference; cleave's weights in PyTorch)" if a.epochs else ""))
    misses = []
    for m, t, t_wall, t_rss, c, c_wall, c_rss, note in rows:
        if note:
            tr = f"{t['images_per_s']:>11.1f}" if t else f"{'-':>11}"
            print(f"{m:12} {'':>9} {tr} {'-':>12}  ({note})")
            continue
        target = 2.0 if m == "lenet5" else 1.2
        ratio = c["images_per_s"] / t["images_per_s"]
        rss = c_rss / t_rss
        line = (f"{m:12} {c['params']:>9} {t['images_per_s']:>11.1f} {c['images_per_s']:>12.1f} {ratio:>5.2f}x "
                f"{target:>5.1f}x  {t_rss:>7.0f} M {c_rss:>8.0f} M {rss:>5.2f}  {t_wall:>9.1f}s {c_wall:>10.1f}s")
        if t["params"] != c["params"]:
            line += f"  (PARAMETERS DIFFER: torch {t['params']})"
        if ratio < target:
            misses.append(f"{m} img/s {ratio:.2f}x < {target}x")
        if rss > 1.0:
            misses.append(f"{m} peak RSS {rss:.2f}x > 1")
        if a.epochs:
            diff = 100 * (c["test_accuracy"] - t["test_accuracy"])
            te = c.get("torch_eval")
            line += (f"  {t['test_accuracy']:>9.4f} {c['test_accuracy']:>10.4f} ({diff:+.2f} points; "
                     + (f"{te:.4f})" if te is not None else "not evaluated)"))
            if te is None or abs(te - c["test_accuracy"]) > 0.002:
                misses.append(f"{m}: cleave's weights evaluate to {te} in PyTorch, {c['test_accuracy']:.4f} in cleave")
            if m in ("resnet18", "mobilenetv2") and abs(diff) > 1.0:
                misses.append(f"{m} accuracy {diff:+.2f} points")
        print(line)
    print("targets missed: " + ("; ".join(misses) if misses else "none"))
    if failed:
        raise SystemExit(f"compare: failed for {', '.join(failed)}")


if __name__ == "__main__":
    main()
