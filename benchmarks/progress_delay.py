"""Stock NIXL (progress thread spinning) vs kv_connector.progress_delay_us, same run.

For each shape (1P1D, 1P2D of topologies/local-cpu.yaml) and each variant (``stock``:
``progress_delay_us: 0``; ``setting``: the CPU default, 1000 us): `pdlaunch up`, the busiest
engine thread's share of a core over 5 s at idle, then ``benchmarks/pd_direct.py`` at
concurrency 1 and 4 (TTFT p50/p90/p99 through the router and direct), then `pdlaunch down`.
One JSON line per (shape, variant, concurrency); the load average before and after each.

    python benchmarks/progress_delay.py --model /tmp/pdlaunch/tiny-model -n 40

It refuses to start on a machine whose 1-minute load average is above --max-load (3): the
numbers would measure the other work, not the setting. Engines start: run it under
`flock /tmp/pdl-engine.lock` where others share the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PD = [sys.executable, "-m", "pdlaunch"]


def _topology(dst: Path, model: str, decodes: int, delay: int | str, base: int) -> Path:
    data = yaml.safe_load((ROOT / "topologies" / "local-cpu.yaml").read_text())
    data["deployment"] = f"pd-delay-{decodes}-{delay}"
    data["model"]["name"] = model
    data["defaults"]["work_dir"] = str(dst / "work")
    # the vLLM of the venv running this (check's probes and the engines use it)
    data["defaults"]["vllm_bin"] = str(Path(sys.executable).parent / "vllm")
    data["prefill"][0]["port"] = base
    decode = data["decode"][0]
    data["decode"] = [{**decode, "port": base + 1 + i} for i in range(decodes)]
    data["kv_connector"].update(side_channel_port=base + 10, progress_delay_us=delay)
    data["router"].update(
        port=base + 20,
        prometheus_port=base + 21,
        binary=str(Path(sys.executable).parent / "vllm-router"),
    )
    path = dst / f"{data['deployment']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _threads(work: Path) -> dict[str, tuple[int, str]]:
    """utime+stime of every thread of the processes whose command line names ``work``."""
    out = {}
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit():
                continue
            # vLLM's workers retitle themselves (VLLM::Worker): their cwd is the work dir
            cwd = os.readlink(proc / "cwd")
            if cwd.startswith(str(work)) or str(work) in (proc / "cmdline").read_text():
                for task in (proc / "task").iterdir():
                    stat = (task / "stat").read_text()
                    fields = stat[stat.rindex(")") + 2 :].split()
                    name = stat[stat.index("(") + 1 : stat.rindex(")")]
                    out[f"{proc.name}/{task.name}"] = (int(fields[11]) + int(fields[12]), name)
        except (OSError, ValueError):
            continue
    return out


def busiest_idle(work: Path, seconds: float = 5.0) -> list:
    """The three busiest threads (share of a core, name) of the deployment at idle."""
    before = _threads(work)
    time.sleep(seconds)
    after = _threads(work)
    hz = os.sysconf("SC_CLK_TCK")
    shares = sorted(
        (
            (round((t - before.get(k, (t, ""))[0]) / hz / seconds, 3), n)
            for k, (t, n) in after.items()
        ),
        reverse=True,
    )
    return shares[:3]


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the tiny model (tests/support/tiny_model.py)")
    ap.add_argument("-n", "--num-prompts", type=int, default=40)
    ap.add_argument("--base-port", type=int, default=18100)
    ap.add_argument("--max-load", type=float, default=3.0)
    ap.add_argument("--decodes", type=int, nargs="+", default=[1, 2], help="shapes: 1P<n>D")
    a = ap.parse_args()
    if _loadavg() > a.max_load:
        sys.exit(f"load average {_loadavg()} is above {a.max_load}: not measuring (--max-load)")
    for decodes in a.decodes:
        for variant, delay in (("stock", 0), ("setting", "auto")):
            with tempfile.TemporaryDirectory(prefix="pd-delay-") as tmp:
                topo = _topology(Path(tmp), a.model, decodes, delay, a.base_port)
                if subprocess.run([*PD, "up", str(topo)], timeout=1800).returncode != 0:
                    sys.exit(f"pdlaunch up {topo.name} failed (its output above)")
                try:
                    idle = busiest_idle(Path(tmp) / "work")
                    for conc in (1, 4):
                        b = a.base_port
                        res = subprocess.run(
                            [sys.executable, str(ROOT / "benchmarks" / "pd_direct.py"),
                             "--router", f"http://127.0.0.1:{b + 20}",
                             "--prefill", f"http://127.0.0.1:{b}",
                             *[f"--decode=http://127.0.0.1:{b + 1 + i}" for i in range(decodes)],
                             "-n", str(a.num_prompts), "-c", str(conc)],
                            check=True, capture_output=True, text=True, timeout=3600,
                        )  # fmt: skip
                        row = {"shape": f"1P{decodes}D", "variant": variant, "delay_us": delay,
                               "idle_busiest_threads": idle, **json.loads(res.stdout)}  # fmt: skip
                        print(json.dumps(row), flush=True)
                finally:
                    subprocess.run([*PD, "down", str(topo)], timeout=600)


if __name__ == "__main__":
    main()
