"""The command line: parse options, call the layers, print.

- :mod:`.common`: the typer app, exit codes, consoles and the bad-input helpers;
- :mod:`.options`: the options several commands share, declared once;
- :mod:`.reports`: tables more than one command prints;
- :mod:`.targets`: which deployment a command means;
- :mod:`.slurm`: the `--backend slurm` flags and what the commands do with them;
- :mod:`.watch_cmd`: `status --watch` on any backend, through the deployment's record;
- one module per command group, each registering its commands on the app when imported
  (:data:`COMMANDS` says which).

The console script (:func:`main`) imports only the module of the command it runs, so
``pdlaunch validate`` never loads the SSH, Slurm or bench code, and ``pdlaunch --help`` lists
the commands from :data:`COMMANDS` without importing any. ``from pdlaunch.cli import app``
gives the whole app, every command registered (tests/packaging/test_imports.py checks both).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["COMMANDS", "app", "main"]

# command -> (its module under pdlaunch.cli, the one line the command list shows)
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("spec", "Check a topology against every rule; start nothing."),
    "plan": ("spec", "Show every process the topology resolves to."),
    "render": ("spec", "Write one script per process (or a Slurm job, or Kubernetes manifests)."),
    "schema": ("spec", "Print the topology's JSON Schema (for editors)."),
    "up": ("launch", "Start the deployment, wait for health, prove KV moves, record it."),
    "down": ("launch", "Stop a deployment (router, decode, prefill) and prove it gone."),
    "status": ("launch", "Show every recorded process: alive, healthy, where (--watch: live)."),
    "logs": ("launch", "Print or follow one process's log."),
    "check": ("check", "Preflight every host and prefill->decode pair; start nothing."),
    "bench": ("bench", "Benchmark a running deployment and break its time down per hop."),
    "doctor": ("doctor", "Match logs and metrics against known failures: what, where, fix."),
    "canary": ("canary", "Prove every prefill->decode pair of a running deployment."),
    "export": ("export", "Write the deployment for another orchestrator (export k8s)."),
}


def summary(name: str) -> str:
    return COMMANDS[name][1]


def _load_all() -> Any:
    from pdlaunch.cli.common import app, reflow_help

    for module in dict.fromkeys(m for m, _ in COMMANDS.values()):
        importlib.import_module(f"pdlaunch.cli.{module}")
    reflow_help(app)
    return app


def __getattr__(name: str) -> Any:
    if name == "app":  # the whole app: every command module imported, so registered
        return _load_all()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command_named(argv: list[str]) -> str | None:
    """The command ``argv`` runs: its first word that is not an option (the app's own
    options take no value)."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def main() -> None:
    """The `pdlaunch` console script: imports only what the command it runs needs."""
    from pdlaunch.cli.common import app, reflow_help

    name = _command_named(sys.argv[1:])
    loaded = COMMANDS[name][0] if name in COMMANDS else None
    if loaded is not None:
        importlib.import_module(f"pdlaunch.cli.{loaded}")
        reflow_help(app)
    # Every other command by its name and one line, with no module loaded: the command list
    # is whole whatever was asked (`pdlaunch --help`, `pdlaunch --help up`, a mistyped name).
    for command, (module, line) in COMMANDS.items():
        if module != loaded:
            app.command(command, help=line, short_help=line)(_listed_only)
    order = list(COMMANDS)
    app.registered_commands.sort(key=lambda c: order.index(c.name) if c.name in order else 0)
    app()


def _listed_only() -> None:  # pragma: no cover - never run: a named command loads its module
    raise SystemExit(2)
