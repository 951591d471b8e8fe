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


# Linux's largest CPU count (NR_CPUS, 8192 in distribution kernels; 2^13 in Kconfig's range)
# with room to spare: a mask naming more is not a real host's, and would cost memory to expand.
MAX_CPUS = 1 << 16


def parse_cpu_list(text: str) -> set[int]:
    """``0-3,8,10-11`` -> {0, 1, 2, 3, 8, 10, 11}. ValueError for anything else: a range
    backwards, a core beyond :data:`MAX_CPUS`, a part that is not a number."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo_s, _, hi_s = part.partition("-")
        lo, hi = int(lo_s), int(hi_s or lo_s)
        if not 0 <= lo <= hi < MAX_CPUS:
            raise ValueError(f"not a CPU range: {part[:40]!r}")
        out.update(range(lo, hi + 1))
    return out


def parse_affinity(stdout: str) -> tuple[int, int, str, set[int]]:
    """:data:`COMMAND`'s output: (usable cores, all cores, the mask as written, the mask's
    cores). ValueError (IndexError included) when it is not that output."""
    lines = stdout.strip().splitlines()
    usable, total = int(lines[0]), int(lines[1])
    mask = lines[2].split(":", 1)[1].strip()
    return usable, total, mask, parse_cpu_list(mask)


def eval_cores(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``bound`` {engine: [cores]} (derived within `hosts.H.cpus` where given),
    ``busy`` threads the engines keep busy."""
    try:
        usable, total, mask, allowed = parse_affinity(out.stdout)
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
