"""The command line imports only what the command it runs needs (issue 31): `validate` never
loads SSH (paramiko, fabric), the runtimes, bench or doctor; `--help` loads no command module.
Each case runs the console script's `main` in a fresh interpreter and lists what it loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import json, sys
from pdlaunch.cli import main
sys.argv = ["pdlaunch", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit:
    pass
sys.stdout = sys.__stdout__
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def loaded(*args: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(list(args))],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


def pdlaunch_modules(mods: set[str], prefix: str) -> set[str]:
    return {m for m in mods if m == prefix or m.startswith(prefix + ".")}


def test_help_loads_no_command_module() -> None:
    mods = loaded("--help")
    commands = {m for m in pdlaunch_modules(mods, "pdlaunch.cli")}
    assert commands <= {"pdlaunch.cli", "pdlaunch.cli.common"}, commands
    assert not pdlaunch_modules(mods, "pdlaunch.spec"), "the topology schema was loaded"
    assert "paramiko" not in mods and "pydantic" not in mods


def test_validate_loads_no_ssh_runtime_bench_or_doctor() -> None:
    mods = loaded("validate", str(ROOT / "topologies" / "local-cpu.yaml"))
    assert "pdlaunch.rules" in mods  # it did validate
    for heavy in ("paramiko", "fabric", "invoke", "jinja2"):
        assert heavy not in mods, heavy
    for area in ("pdlaunch.runtime", "pdlaunch.backends", "pdlaunch.observe", "pdlaunch.doctor",
                 "pdlaunch.check"):  # fmt: skip
        assert not pdlaunch_modules(mods, area), pdlaunch_modules(mods, area)
    # The shared options name ConnectOptions (a dataclass) and the package binds its thread
    # map; the hosts themselves (transports, SSH) stay unloaded.
    light = {"pdlaunch.hosts", "pdlaunch.hosts.options", "pdlaunch.hosts.parallel"}
    assert pdlaunch_modules(mods, "pdlaunch.hosts") <= light


def test_a_command_that_reaches_hosts_does_load_them() -> None:
    # Negative control: the check above can see a module load.
    mods = loaded("down", "no-such-deployment")
    assert pdlaunch_modules(mods, "pdlaunch.runtime")
