"""Every pdlaunch module imports on its own, and importing the CLI gives every command.

A module that only imports after some other module was imported first (an import cycle
broken by import order, a name another module injects) works in the full CLI and fails
the day someone imports it directly. Each module is therefore imported in a process of its
own. To stay fast on a 2-core machine, one driver process imports the third-party
libraries pdlaunch uses (never a pdlaunch module) and forks a child per module: each child
starts from the same pdlaunch-free state a fresh interpreter has, and imports one module.

The control host never imports torch, vLLM or NIXL (README): every module but the node-only
KV connector code must import without pulling them in.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Loaded by vLLM on prefill nodes through kv_connector_module_path (pdlaunch/kv/__init__.py):
# they import torch (and vLLM, NIXL) at the top on purpose.
NODE_ONLY = {
    "pdlaunch.kv.adapters",
    "pdlaunch.kv.blocks",
    "pdlaunch.kv.connector",
    "pdlaunch.kv.cpu_blocks",
    "pdlaunch.kv.handshake",
    "pdlaunch.kv.settings",
    "pdlaunch.kv.vllm_check",
}
HEAVY = ("torch", "vllm", "nixl")

# Imported by the driver before forking, only to save each child the time: a child still
# runs every import statement of its module, so a missing dependency still fails it.
PRELOAD = (
    "click",
    "fabric",
    "invoke",
    "jinja2",
    "paramiko",
    "pydantic",
    "rich.console",
    "rich.live",
    "rich.markup",
    "rich.table",
    "rich.text",
    "typer",
    "typer.testing",
    "yaml",
)

DRIVER = textwrap.dedent(
    """
    import importlib, json, os, sys, traceback
    modules, preload, heavy, prefix = json.loads(sys.argv[1])
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a child that needs it reports the failure itself
    loaded = sorted(m for m in sys.modules if m == prefix or m.startswith(prefix + "."))
    if loaded:
        sys.exit(f"the driver imported {loaded} before forking")
    failures = {}
    for module in modules:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                importlib.import_module(module)
                pulled = sorted(h for h in heavy if h in sys.modules)
                msg = f"pulls in {pulled} (the control host never imports them)" if pulled else ""
            except BaseException:
                msg = traceback.format_exc()
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        msg = b"".join(chunks).decode()
        if status != 0 and not msg:
            msg = f"the child exited with status {status}"
        if msg:
            failures[module] = msg
    print(json.dumps(failures))
    """
)


def package_modules(root: Path, package: str) -> list[str]:
    """Every module of ``package`` under ``root``, descending only into real packages (a
    directory with ``__init__.py``), as an installed wheel would have them."""
    found: list[str] = []

    def walk(directory: Path, dotted: str) -> None:
        found.append(dotted)
        for path in sorted(directory.iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file():
                walk(path, f"{dotted}.{path.name}")
            elif path.suffix == ".py" and path.name != "__init__.py":
                found.append(f"{dotted}.{path.stem}")

    walk(root / package, package)
    return found


def import_each_alone(
    modules: list[str], *, prefix: str, cwd: Path, preload: tuple[str, ...] = PRELOAD
) -> dict[str, str]:
    """{module: why it failed} for each module that does not import on its own."""
    arg = json.dumps([modules, list(preload), list(HEAVY), prefix])
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, arg],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_module_imports_alone():
    modules = package_modules(ROOT, "pdlaunch")
    assert set(modules) >= NODE_ONLY, "NODE_ONLY names a module that no longer exists"
    # `python -m` modules run the CLI only under __main__, so importing them is harmless.
    assert {"pdlaunch.__main__", "pdlaunch.cli.__main__", "pdlaunch.cli.common"} <= set(modules)
    failures = import_each_alone(
        [m for m in modules if m not in NODE_ONLY], prefix="pdlaunch", cwd=ROOT
    )
    assert not failures, "\n\n".join(f"{m}:\n{why}" for m, why in failures.items())


def test_harness_reports_a_module_that_needs_another_imported_first(tmp_path):
    # Negative control: a cycle that works from one side only. Importing `cyc.a` first runs
    # b, which finds `a` half-initialised without A; importing `cyc.b` first works.
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc.b import B\nA = 1\n")
    (pkg / "b.py").write_text("B = 2\nfrom cyc.a import A\n")
    (pkg / "heavy.py").write_text(
        "import json as torch\nimport sys\nsys.modules['torch'] = torch\n"
    )
    failures = import_each_alone(
        package_modules(tmp_path, "cyc"), prefix="cyc", cwd=tmp_path, preload=()
    )
    assert set(failures) == {"cyc.a", "cyc.heavy"}, failures
    assert "partially initialized" in failures["cyc.a"]
    assert "pulls in ['torch']" in failures["cyc.heavy"]


# -- the CLI's commands -----------------------------------------------------------------------
README = ROOT / "README.md"

# In a fresh interpreter: what importing pdlaunch.cli registers, and each command's --help.
REGISTERED = textwrap.dedent(
    """
    import json
    import typer
    from typer.testing import CliRunner
    from pdlaunch.cli import app
    runner = CliRunner()
    commands = typer.main.get_command(app).commands
    print(json.dumps({name: runner.invoke(app, [name, "--help"]).exit_code for name in commands}))
    """
)


def readme_commands() -> set[str]:
    """The commands the README's command table names (the first word of each backticked
    command in a row's first cell)."""
    text = README.read_text()
    table = text[text.index("| command | what it does | exit codes |") :].split("\n\n", 1)[0]
    found: set[str] = set()
    for row in table.splitlines()[2:]:
        found.update(re.findall(r"`([a-z]+)", row.split("|")[1]))
    return found


def test_importing_the_cli_gives_every_documented_command():
    # Each command module registers its commands when imported and only the package root
    # imports them all: `pdlaunch.cli` alone must give the whole app, and every command the
    # README documents must be there (and none it does not), its --help answering.
    proc = subprocess.run(
        [sys.executable, "-c", REGISTERED], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    exits = json.loads(proc.stdout)
    # `export k8s`: render --backend k8s under its old name, documented in the render row.
    assert "`export k8s FILE" in README.read_text()
    assert set(exits) == readme_commands() | {"export"}
    assert all(code == 0 for code in exits.values()), exits
