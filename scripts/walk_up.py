"""Trace one local 1P1D `pdlaunch up` (the tests' stand-in engine and router, no vLLM) and
count what issues 23 and 33 ask of the walk from the CLI to the hosts: the pdlaunch modules it
enters from the lifecycle's ``up`` on (in order; ``WALK_FROM=pdlaunch.cli.launch`` starts at the
command), the distinct (caller module -> callee module) steps, the steps that climb to a
higher layer, and the distinct steps whose callee is already on the same thread's call stack,
i.e. a call that comes back into a module it had left (a callback, a base class, a closure
handed down).

    python scripts/walk_up.py            # prints JSON: modules, comes_back, both lists
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install(src: Path, dest: Path) -> Path:
    body = src.read_text().split("\n", 1)[1]
    dest.write_text(f"#!{sys.executable} -S\n{body}")
    dest.chmod(0o755)
    return dest


def main(fakes: Path = REPO / "tests" / "support") -> None:
    tmp = Path(tempfile.mkdtemp(prefix="walk-"))
    os.environ["PDLAUNCH_STATE_DIR"] = str(tmp / "state")
    vllm = install(fakes / "fake_vllm.py", tmp / "fake-vllm")
    router = install(fakes / "fake_router.py", tmp / "fake-router")
    p = {k: free_port() for k in ("prefill", "decode", "router", "side")}
    spec = {
        "deployment": "walk",
        "model": {"name": "fake-model"},
        "defaults": {"work_dir": str(tmp / "work"), "vllm_bin": str(vllm)},
        "prefill": [
            {"host": "127.0.0.1", "device": "cpu", "port": p["prefill"], "bind": "127.0.0.1"}
        ],
        "decode": [
            {"host": "127.0.0.1", "device": "cpu", "port": p["decode"], "bind": "127.0.0.1"}
        ],
        "kv_connector": {"side_channel_port": p["side"]},
        "router": {
            "host": "127.0.0.1",
            "bind": "127.0.0.1",
            "port": p["router"],
            "binary": str(router),
        },
    }
    topo = tmp / "walk.yaml"
    topo.write_text(yaml.safe_dump(spec))

    from typer.testing import CliRunner

    from pdlaunch.cli import app

    entered: list[str] = []
    back: dict[tuple[str, str], int] = {}
    steps: dict[tuple[str, str], int] = {}  # caller module -> callee module, each call
    started = threading.Event()
    lock = threading.Lock()

    def mod(frame) -> str | None:
        name = frame.f_globals.get("__name__", "")
        return name if name.startswith("pdlaunch") else None

    def prof(frame, event, arg):
        if event != "call":
            return
        m = mod(frame)
        if m is None:
            return
        if not started.is_set():
            if m == os.environ.get("WALK_FROM", "pdlaunch.runtime.lifecycle.up"):
                started.set()
            else:
                return
        chain = []
        f = frame.f_back
        while f is not None:
            cm = mod(f)
            if cm is not None and (not chain or chain[-1] != cm):
                chain.append(cm)
            f = f.f_back
        with lock:
            if m not in entered:
                entered.append(m)
            if chain and chain[0] != m:
                steps[(chain[0], m)] = steps.get((chain[0], m), 0) + 1
            if chain and chain[0] != m and m in chain[1:]:
                key = (chain[0], m)
                back[key] = back.get(key, 0) + 1

    runner = CliRunner()
    threading.setprofile(prof)
    sys.setprofile(prof)
    try:
        res = runner.invoke(app, ["up", str(topo), "--skip-check", "--timeout", "120"])
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    down = runner.invoke(app, ["down", str(topo)])
    if down.exit_code == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    # A climb: a call from a module into one of a higher layer (tests/packaging/test_layers.py
    # has the order), which only a callback handed down can make once imports point down.
    from tests.packaging.test_layers import layer_of

    climbs = sorted((a, b) for a, b in steps if layer_of(b) > layer_of(a))
    out = {
        "up_exit": res.exit_code,
        "down_exit": down.exit_code,
        "modules": len(entered),
        "steps": len(steps),
        "climbs": len(climbs),
        "comes_back": len(back),
        "module_order": entered,
        "back_edges": [f"{a} -> {b} ({n}x)" for (a, b), n in sorted(back.items())],
        "climb_edges": [f"{a} -> {b} ({steps[(a, b)]}x)" for a, b in climbs],
    }
    print(json.dumps(out, indent=1))
    if res.exit_code:
        print(res.output, file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(*(Path(a) for a in sys.argv[1:2]))
