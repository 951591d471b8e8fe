"""The cores the plan binds CPU engines to exist on the host and are in its affinity, and
the host has a core for each thread the engines keep busy (the CPU budget, cpubudget.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Needs,
    Probe,
    ProbeContext,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.spec.devices import PROFILES

# `nproc` honours the affinity mask the engines will inherit; `nproc --all` counts the
# machine; Cpus_allowed_list is the mask itself (proc(5)).
COMMAND = "nproc; nproc --all; grep '^Cpus_allowed_list' /proc/self/status"


def parse_cpu_list(text: str) -> set[int]:
    """``0-3,8,10-11`` -> {0, 1, 2, 3, 8, 10, 11}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def eval_cores(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``bound`` {engine: [cores]} (derived within `hosts.H.cpus` where given),
    ``busy`` threads the engines keep busy."""
    lines = out.stdout.strip().splitlines()
    try:
        usable, total = int(lines[0]), int(lines[1])
        mask = lines[2].split(":", 1)[1].strip()
        allowed = parse_cpu_list(mask)
    except (IndexError, ValueError):
        return [unparsed(ctx, "nproc", out)]
    bound: dict[str, list[int]] = ctx.params.get("bound", {})
    rows: list[CheckResult] = []
    for engine, cores in sorted(bound.items()):
        missing = sorted(set(cores) - allowed)
        if missing:
            rows.append(
                row(
                    ctx,
                    Status.FAIL,
                    f"{engine} is bound to core(s) {', '.join(map(str, missing))}, which this "
                    f"host does not let it use (allowed {mask}, "
                    f"{total} in all)",
                    "set `hosts.<host>.cpus` to the host's core count (the plan then binds "
                    "within it) or list existing cores in `devices`",
                    usable=usable,
                    total=total,
                )
            )
    busy = int(ctx.params.get("busy", 0))
    if busy > usable:
        rows.append(
            row(
                ctx,
                Status.WARN,
                f"CPU engines here keep {busy} threads busy on {usable} usable cores: "
                "requests will queue behind each other's threads",
                "place fewer CPU engines on this host (docs/cpu-pd-recipe.md, CPU budget)",
                usable=usable,
                total=total,
            )
        )
    if not rows:
        rows.append(row(ctx, Status.OK, f"{usable} usable cores; bound cores exist", usable=usable))
    return rows


def _calls(facts: HostFacts) -> list[Call]:
    engines = facts.engines_of("cpu")
    if not engines:
        return []
    busy = 0
    for x in engines:
        budget = PROFILES[x.device].cpu_budget if x.device else None
        busy += len(x.devices) + (budget.busy_threads if budget else 0)
    params: Mapping[str, Any] = {
        "bound": {x.name: list(x.devices) for x in engines},
        "busy": busy,
    }
    return [Call(params)]


CORES = Probe(
    "cpu.cores",
    "CPU cores for the engines",
    COMMAND,
    eval_cores,
    "nproc",
    tool="nproc",
    install="install coreutils",
    needs=Needs(device=True),
    calls=_calls,
)

PROBES = (CORES,)
