"""Which deployment a command means: a topology file, a recorded name, or the only one."""

from __future__ import annotations

import re
from pathlib import Path

from pdlaunch.cli.common import bad_input, load_or_exit
from pdlaunch.runtime.record_store import list_deployments
from pdlaunch.runtime.state import state_root

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def resolve_deployment(target: str | None, as_json: bool = False) -> str:
    """A topology file (its `deployment`), a deployment name, or, when omitted, the only
    deployment recorded on this control host."""
    if target is None:
        names = list_deployments()
        if len(names) == 1:
            return names[0]
        if not names:
            bad_input(f"no deployment is recorded in {state_root()}")
        bad_input("several deployments are recorded; name one: " + ", ".join(names))
    path = Path(target)
    if path.is_file():
        topo, _ = load_or_exit(path, as_json)
        return topo.deployment
    if _NAME.fullmatch(target) and not target.endswith((".yaml", ".yml")):
        return target
    bad_input(f"{target}: no such topology file")
