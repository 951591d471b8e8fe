"""Fakes for testing automation built on pdlaunch, the way ``fabric.testing`` fakes
connections: :class:`FakeRuntime` (the Runtime interface in memory; the real lifecycle runs
on it) and :class:`FakeSlurm` (stand-in Slurm client commands that record every call).

    from pdlaunch.runtime import lifecycle
    from pdlaunch.testing import FakeRuntime, plan_from

    fake = FakeRuntime()
    fake.behave("decode-0", exits_after=2)
    with pytest.raises(lifecycle.LaunchError) as err:
        lifecycle.up(fake, plan_from("topology.yaml"), lifecycle.UpOptions(timeout=30))
    assert err.value.rolled_back and fake.running() == []

The lifecycle takes the deployment's lock in pdlaunch's state directory: point
``PDLAUNCH_STATE_DIR`` at a temporary directory in tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pdlaunch.plan.build import Plan

from .runtime import Behaviour, FakeProcess, FakeRecord, FakeRuntime
from .slurm import FakeSlurm

__all__ = ["Behaviour", "FakeProcess", "FakeRecord", "FakeRuntime", "FakeSlurm", "plan_from"]


def plan_from(topology: str | Path | dict[str, Any]) -> Plan:
    """The plan of a topology (a file, YAML text or a dict), validated as `pdlaunch up` does;
    ValueError listing the errors when the rules refuse it."""
    from pdlaunch import rules
    from pdlaunch.plan.build import build_plan
    from pdlaunch.spec.load import load_text

    if isinstance(topology, dict):
        text, name = yaml.safe_dump(topology, sort_keys=False), "topology.yaml"
    elif isinstance(topology, Path) or "\n" not in topology:
        text, name = Path(topology).read_text(), str(topology)
    else:
        text, name = topology, "topology.yaml"
    topo, source = load_text(text, name)
    findings = rules.validate(topo, source)
    if rules.has_errors(findings):
        errors = [f"{f.where}: {f.message}" for f in findings if f.severity == "error"]
        raise ValueError(f"{name}: invalid topology: " + "; ".join(errors))
    return build_plan(topo)
