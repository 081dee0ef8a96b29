"""Round time of `cleave demo` plain and with --secure-aggregation (see run.sh)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(cleave, devices, rounds, steps, secure):
    work = tempfile.mkdtemp(prefix="cleave-secagg-")
    try:
        cmd = [cleave, "demo", "--no-emulation", "--no-adapt", "--virtual", "--devices", str(devices),
               "--edges", "0", "--partition", "dirichlet:0.5", "--rounds", str(rounds), "--local-steps", str(steps),
               "--work", work]
        if secure:
            cmd.append("--secure-aggregation")
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stdout[-3000:])
            raise SystemExit(f"secagg_round.py: {' '.join(cmd)} failed with status {p.returncode}")
        rows = []
        with open(os.path.join(work, "rounds.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return rows, [r for r in rows if r.get("secure_devices", 0) > 0]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", required=True)
    ap.add_argument("devices", nargs="?", type=int, default=16)
    ap.add_argument("rounds", nargs="?", type=int, default=4)
    ap.add_argument("steps", nargs="?", type=int, default=20)
    a = ap.parse_args()
    result = {}
    for secure in (False, True):
        rows, lines = run(a.cleave, a.devices, a.rounds, a.steps, secure)
        times = [r["seconds"] for r in rows[1:]] or [r["seconds"] for r in rows]
        result[secure] = (statistics.mean(times), rows[-1].get("test_accuracy", float("nan")), len(lines))
        name = "secure" if secure else "plain"
        print(f"{name:6s}: {a.devices} devices, mean round {result[secure][0]:.2f} s over rounds 2-{len(rows)}, "
              f"final test accuracy {result[secure][1]:.4f}" +
              (f", {result[secure][2]} rounds aggregated securely" if secure else ""))
    ratio = result[True][0] / result[False][0]
    print(f"secure / plain round time: {ratio:.2f}x (target <= 2x: {'met' if ratio <= 2 else 'NOT met'})")
    if result[True][2] < a.rounds:
        raise SystemExit("secagg_round.py: not every secure round was aggregated securely")


if __name__ == "__main__":
    main()
