"""Rules about backend settings in the topology (pdlaunch/spec/backend_settings.py)."""

from __future__ import annotations

from collections.abc import Iterator

from pdlaunch.rules.base import Finding, rule, warning
from pdlaunch.spec.topology import Topology

UNUSED_BACKEND_BLOCK = "unused-backend-block"


@rule(
    UNUSED_BACKEND_BLOCK,
    "a slurm: block is read by --backend slurm only (Slurm skips this rule)",
    "pdlaunch",
)
def slurm_block_unused(topo: Topology) -> Iterator[Finding]:
    # A warning, not an error: one topology for both backends is the intended use (its rules
    # and plan are the same), so over SSH (or for Kubernetes) the block is said to be unused,
    # never silently ignored, and never a reason to keep two copies of the topology.
    if topo.slurm is not None:
        yield warning(
            UNUSED_BACKEND_BLOCK,
            ("slurm",),
            "the slurm: block is not read by this backend (only by --backend slurm)",
            "run with --backend slurm to use it, or remove the block",
            "pdlaunch",
        )
