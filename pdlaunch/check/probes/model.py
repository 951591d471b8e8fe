"""The model directory a topology names by path exists on the host and holds a model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Probe,
    ProbeContext,
    q,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status


def eval_model_path(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """``ls -1 -- PATH``; params: ``path``."""
    path = ctx.params.get("path", "?")
    if out.rc != 0:
        if "No such file" in out.stderr:
            return [
                row(
                    ctx,
                    Status.FAIL,
                    f"model path {path} does not exist",
                    "copy/download the model to this host or use a shared mount",
                )
            ]
        if "Permission denied" in out.stderr:
            return [
                row(
                    ctx,
                    Status.FAIL,
                    f"model path {path} not readable",
                    "fix permissions for the service user",
                )
            ]
        return [unparsed(ctx, "ls", out)]
    names = {n.strip() for n in out.stdout.splitlines() if n.strip()}
    if "config.json" not in names:
        return [
            row(
                ctx,
                Status.WARN,
                f"{path} exists but has no config.json",
                "point the topology at the model directory (the one with config.json)",
            )
        ]
    weights = sorted(n for n in names if n.endswith((".safetensors", ".bin", ".gguf")))
    return [row(ctx, Status.OK, f"{path}: config.json and {len(weights)} weight file(s)")]


def is_local_path(path: str) -> bool:
    """A file-system path rather than a hub id (which each node downloads itself)."""
    return path.startswith(("/", "~", "./", "../"))


def _cmd(params: Mapping[str, Any]) -> str:
    return f"ls -1 -- {q(params['path'])}"


def _calls(facts: HostFacts) -> list[Call]:
    paths = sorted({x.model_path for x in facts.engines if x.model_path})
    return [Call({"path": m}) for m in paths if is_local_path(m)]


# inside: an engine in a container opens the path through its mounts
PATH = Probe(
    "model.path", "local model path", _cmd, eval_model_path, "ls", calls=_calls, inside=True
)

PROBES = (PATH,)
