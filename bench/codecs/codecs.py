"""Runs `cleave demo` per model, codec and seed and prints accuracy against f32 (see run.sh)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# Accuracy targets: the largest drop (points) against f32 each codec may cost.
TARGETS = {"f16": 0.2, "bf16": 0.2, "int8": 0.5, "topk": 1.0}
# Per model: rounds and local steps (ResNet-8 is ~20x LeNet-5's compute per step).
SIZES = {"lenet5": (8, 150), "resnet8": (4, 60), "resnet18": (3, 40)}


def codec_flags(codec):
    """The server's --codecs for one codec under test: activations and gradients both use it
    (topk carries gradients only; its activations stay f32)."""
    return codec


def run(cleave, model, codec, seed, rounds, steps):
    work = tempfile.mkdtemp(prefix="cleave-codecs-")
    try:
        cmd = [cleave, "demo", "--no-emulation", "--no-adapt", "--devices", "4", "--edges", "1", "--partition",
               "dirichlet:0.5", "--model", model, "--codecs", codec_flags(codec), "--seed", str(seed),
               "--rounds", str(rounds), "--local-steps", str(steps), "--work", work]
        t0 = time.monotonic()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        secs = time.monotonic() - t0
        if p.returncode != 0:
            sys.stderr.write(p.stdout[-3000:])
            raise SystemExit(f"codecs.py: {' '.join(cmd)} failed with status {p.returncode}")
        rounds_log = []
        with open(os.path.join(work, "rounds.jsonl")) as f:
            for line in f:
                line = line.strip()
                if line:
                    j = json.loads(line)
                    if "test_accuracy" in j:
                        rounds_log.append(j)
        last = rounds_log[-1]
        moved = sum(r.get("bytes_moved", 0) for r in rounds_log)
        return float(last["test_accuracy"]), moved, secs
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--models", default="lenet5,resnet8")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--codecs", default="f32,f16,bf16,int8,topk:0.1")
    ap.add_argument("--rounds", type=int, default=0, help="0: the model's default")
    ap.add_argument("--local-steps", type=int, default=0, help="0: the model's default")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    codecs = a.codecs.split(",")
    if codecs[0] != "f32":
        codecs.insert(0, "f32")
    print(f"cut codecs: cleave demo --no-adapt, 4 devices, 1 edge, Dirichlet 0.5, seeds {a.seeds}", flush=True)
    failed = False
    for model in a.models.split(","):
        rounds, steps = SIZES.get(model, (4, 60))
        rounds = a.rounds or rounds
        steps = a.local_steps or steps
        print(f"\n{model}: {rounds} rounds x {steps} local steps", flush=True)
        print(f"  {'codec':<12} {'accuracy (per seed)':<28} {'mean':>7} {'vs f32':>8} {'bytes':>9} {'target':>10}")
        base = None
        for codec in codecs:
            results = [run(a.cleave, model, codec, s, rounds, steps) for s in seeds]
            accs = [r[0] for r in results]
            mean = statistics.mean(accs)
            moved = statistics.mean(r[1] for r in results)
            if base is None:
                base, base_moved = mean, moved
            name = codec.split(":")[0]
            drop = (base - mean) * 100
            target = TARGETS.get(name)
            verdict = "-" if target is None else (f"<= {target:.1f} " + ("met" if drop <= target else "MISSED"))
            failed |= target is not None and drop > target
            per = " ".join(f"{x:.4f}" for x in accs)
            print(f"  {codec:<12} {per:<28} {mean:7.4f} {-drop:+7.2f}p {moved / base_moved:8.2f}x {verdict:>10}",
                  flush=True)
    print("\nvs f32: mean accuracy difference in points; bytes: all channels' bytes relative to f32")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
