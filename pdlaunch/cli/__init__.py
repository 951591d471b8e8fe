"""The command line: parse options, call the layers, print.

- :mod:`.app`: the typer app, exit codes, consoles and the bad-input helpers;
- :mod:`.options`: the options several commands share, declared once;
- :mod:`.reports`: tables more than one command prints;
- :mod:`.targets`: which deployment a command means;
- :mod:`.slurm`: the `--backend slurm` flags and what the commands do with them;
- :mod:`.watch_cmd`: `status --watch` on any backend, through the deployment's record;
- one module per command group, each registering its commands on the app when imported:
  :mod:`.spec` (validate, plan, render, schema), :mod:`.launch` (up, down, status, logs),
  :mod:`.check`, :mod:`.bench`, :mod:`.doctor`, :mod:`.export`, :mod:`.canary`.

Only this package root imports the command modules, so `app` is complete once
``pdlaunch.cli`` is imported (tests/packaging/test_imports.py checks that, and that every
module imports on its own) and no module below imports one above it.
"""

from __future__ import annotations

from pdlaunch.cli import bench, canary, check, doctor, export, launch, spec
from pdlaunch.cli.app import app

__all__ = ["app", "main"]

# The command modules are imported for what importing them does: each adds its commands.
COMMAND_MODULES = (spec, launch, check, bench, doctor, export, canary)


def main() -> None:
    """The `pdlaunch` console script."""
    app()
