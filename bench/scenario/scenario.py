"""Time to a target test accuracy on the demo's emulated deployment, per plan policy (see run.sh)."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time


def run(cleave, args, a):
    work = tempfile.mkdtemp(prefix="cleave-scenario-")
    try:
        cmd = [cleave, "demo", "--rounds", str(a.rounds), "--local-steps", str(a.local_steps), "--seed",
               str(a.seed), "--work", work, "--no-compare"] + args
        t0 = time.monotonic()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            sys.stderr.write(p.stdout[-3000:])
            raise SystemExit(f"scenario.py: {' '.join(cmd)} failed with status {p.returncode}")
        rounds = []
        with open(os.path.join(work, "rounds.jsonl")) as f:
            for line in f:
                line = line.strip()
                if line:
                    j = json.loads(line)
                    if "test_accuracy" in j and "seconds" in j:
                        rounds.append(j)
        trained, reached = 0.0, None
        for r in rounds:
            trained += r["seconds"]
            acc = r["test_accuracy"]
            if reached is None and isinstance(acc, (int, float)) and acc >= a.target:
                reached = (r["round"], trained)
        final = rounds[-1]["test_accuracy"]
        steps = [r.get("step_seconds", 0) for r in rounds]
        # The cost model's step against the measured one, from round 2 (round 1 holds the
        # boards' profiling and warm-up); none where no plan is priced (no adaptive splitter).
        errors = [r["predicted_step_seconds"] / r["step_seconds"] - 1.0 for r in rounds
                  if r["round"] >= 2 and r.get("predicted_step_seconds", 0) > 0 and r.get("step_seconds", 0) > 0]
        # The server's per-round route line: "round 8: devices 1-4: device[0,3) edge[3,8) ...".
        routes = [m.group(1) for m in re.finditer(r"round \d+: devices? [\d,-]+: (.*)", p.stdout)]
        last_route = routes[-1] if routes else "?"
        return reached, trained, final, sum(steps) / max(1, len(steps)), last_route, wall, errors
    finally:
        shutil.rmtree(work, ignore_errors=True)


def show(name, res, a):
    reached, trained, final, step, route, wall, errors = res
    to = f"{reached[1]:7.1f} s (round {reached[0]})" if reached else f"not in {trained:.1f} s"
    model = (f"  predicted {min(errors) * 100:+.0f}% to {max(errors) * 100:+.0f}% (rounds 2-)" if errors else "")
    print(f"  {name:<34} {to:<22} final {final:.4f}  step {step * 1e3:6.1f} ms{model}  {route}", flush=True)
    return reached[1] if reached else float("inf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("--target", type=float, default=0.80)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--local-steps", type=int, default=150)
    ap.add_argument("--plans", default="3,8:4,8:6,12:3,12", help="candidate fixed edge cuts, ':'-separated")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print(f"scenario: cleave demo (emulated boards on Wi-Fi), time to test accuracy {a.target:.2f}; "
          f"{a.rounds} rounds x {a.local_steps} steps, seed {a.seed}", flush=True)
    fixed = ["--no-adapt", "--codecs", "f32", "--micro-batches", "1"]
    t_a = show("(a) all blocks on the devices", run(a.cleave, fixed + ["--edge-cuts", "12,12"], a), a)
    best_b, best_plan = float("inf"), None
    for plan in a.plans.split(":"):
        t = show(f"(b) fixed edge cuts {plan}", run(a.cleave, fixed + ["--edge-cuts", plan], a), a)
        if t < best_b:
            best_b, best_plan = t, plan
    t_c = show("(c) adaptive, f32, 1 micro-batch", run(a.cleave, ["--codecs", "f32", "--micro-batches", "1"], a), a)
    t_d = show("(d) adaptive, 4 micro-batches, codecs", run(a.cleave, [], a), a)

    def ratio(x, y):
        return f"{x / y:.2f}x" if y < float("inf") and x < float("inf") else "n/a"

    print(f"\n(d) against (a): {ratio(t_a, t_d)} faster; against the best fixed split (b, {best_plan}): "
          f"{ratio(best_b, t_d)} faster (target 2x each); (c): {ratio(t_c, t_d)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
