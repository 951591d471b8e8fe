"""How fast the command line answers, as ratios to the floor each command cannot go below,
measured in one run with the runs paired (a reference run, then the command, repeated), so
load on the machine moves both alike. Median of --repeat pairs.

    python benchmarks/bench_cli_start.py [--repeat 7] [--json]

- ``pdlaunch --help`` against ``python -c pass`` (goal, issue 31: at most 10x);
- ``pdlaunch validate topologies/local-cpu.yaml`` against
  ``python -c 'import pydantic, yaml, typer'`` (goal: at most 2x).
- one constrained pydantic model built and validated, plus ``import yaml, typer, rich.console``,
  against the same reference, no goal: the floor under `validate` of any CLI that judges its
  input with pydantic models and prints with rich (``import pydantic`` alone loads no model
  machinery).
Both run as the console script runs them (``python -m pdlaunch``), in a fresh interpreter.
pdlaunch's modules are byte-compiled first, as ``pip install`` does for an installed package
(a machine with PYTHONDONTWRITEBYTECODE set would otherwise compile them on every run, which
the reference's site-packages never pay).
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
# One constrained model built and used, as any pydantic schema does: that alone loads pydantic's
# model machinery, pydantic.types, annotated_types and its plugin loader (importlib.metadata).
FLOOR = (
    "from pydantic import BaseModel, Field\n"
    "class M(BaseModel):\n    x: int = Field(ge=1)\n"
    "M(x=1)\nimport yaml, typer, rich.console"
)
PAIRS = {
    "help": ([PY, "-c", "pass"], [PY, "-m", "pdlaunch", "--help"], 10.0),
    "validate": (
        [PY, "-c", "import pydantic, yaml, typer"],
        [PY, "-m", "pdlaunch", "validate", str(ROOT / "topologies" / "local-cpu.yaml")],
        2.0,
    ),
    "floor": (
        [PY, "-c", "import pydantic, yaml, typer"],
        [PY, "-c", FLOOR],
        None,
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
    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "pdlaunch")], check=True)
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
        goal = f" (goal <= {res['goal']:g}x)" if res["goal"] else ""
        print(f"{name:9} {res['command_s']:.3f} s vs {res['reference_s']:.3f} s: "
              f"{res['ratio']:.2f}x{goal}")  # fmt: skip


if __name__ == "__main__":
    main()
