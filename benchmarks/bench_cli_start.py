"""How fast the command line answers, as ratios to the floor each command cannot go below,
measured in one run with the runs paired (a reference run, then the command, repeated), so
load on the machine moves both alike. Median of --repeat pairs.

    python benchmarks/bench_cli_start.py [--repeat 7] [--json]

- ``pdlaunch --help`` against ``python -c pass`` (goal, issue 31: at most 10x);
- ``pdlaunch validate topologies/local-cpu.yaml`` against
  ``python -c 'import pydantic, yaml, typer'`` (goal: at most 2x).
Both run as the console script runs them (``python -m pdlaunch``), in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PAIRS = {
    "help": ([PY, "-c", "pass"], [PY, "-m", "pdlaunch", "--help"], 10.0),
    "validate": (
        [PY, "-c", "import pydantic, yaml, typer"],
        [PY, "-m", "pdlaunch", "validate", str(ROOT / "topologies" / "local-cpu.yaml")],
        2.0,
    ),
}


def wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)  # fmt: skip
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = {}
    for name, (ref, cmd, goal) in PAIRS.items():
        wall(ref), wall(cmd)  # warm the file cache
        refs, cmds = [], []
        for _ in range(args.repeat):
            refs.append(wall(ref))
            cmds.append(wall(cmd))
        r, c = statistics.median(refs), statistics.median(cmds)
        results[name] = {
            "reference": " ".join(ref[1:]),
            "command": " ".join(cmd[1:]),
            "reference_s": round(r, 4),
            "command_s": round(c, 4),
            "ratio": round(c / r, 2),
            "goal": goal,
        }
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for name, res in results.items():
        print(f"{name:9} {res['command_s']:.3f} s vs {res['reference_s']:.3f} s: "
              f"{res['ratio']:.2f}x (goal <= {res['goal']:g}x)")  # fmt: skip


if __name__ == "__main__":
    main()
