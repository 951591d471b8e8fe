"""One judgement of an accelerator inventory for every vendor: enough devices, the planned
ones present, enough memory free. Each vendor module parses its own tool into
:class:`Accel` rows and hands them here."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdlaunch.check.probes.base import Call, HostFacts, ProbeContext, row
from pdlaunch.check.results import CheckResult, Status


@dataclass(frozen=True)
class Accel:
    index: int
    name: str
    total_mib: float | None
    free_mib: float | None

    @property
    def free_fraction(self) -> float | None:
        if not self.total_mib or self.free_mib is None:
            return None
        return self.free_mib / self.total_mib


def _num(s: str) -> float | None:
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)", s)
    return float(m.group(1)) if m else None


def parse_smi_csv(text: str) -> list[Accel]:
    """``index,name,memory.total,memory.free`` CSV (nvidia-smi / hl-smi, noheader, nounits).

    Header lines and units (``81559 MiB``) are tolerated; ``[N/A]`` becomes None.
    """
    devs = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        devs.append(Accel(int(parts[0]), parts[1], _num(parts[2]), _num(parts[3])))
    return devs


def eval_accelerators(kind: str, devs: list[Accel], ctx: ProbeContext) -> list[CheckResult]:
    """params: ``need`` (devices the plan uses here, TP x local DP), ``devices`` (explicit
    indices, optional), ``min_free_fraction`` (default 0.9)."""
    need = int(ctx.params.get("need", 1))
    min_free = float(ctx.params.get("min_free_fraction", 0.9))
    idx = ctx.params.get("devices")
    by_index = {d.index: d for d in devs}
    results = []
    if len(devs) < need:
        # Which process wants how many (TP x --data-parallel-size-local each: the GB200
        # guide's DP 8 over two 4-GPU nodes is 4 per node).
        pinned = ctx.params.get("pinned") or {}
        who = ", ".join(f"{n} {c}" for n, c in sorted(pinned.items()))
        results.append(
            row(
                ctx,
                Status.FAIL,
                f"{len(devs)} {kind} device(s) visible, plan needs {need}"
                + (f" ({who}; TP x local DP each)" if who else ""),
                "lower TP or dp.local_size (data-parallel ranks per node) for this host, "
                "spread dp.size over more hosts, or fix device visibility",
                count=len(devs),
                need=need,
            )
        )
    chosen = [by_index[i] for i in idx if i in by_index] if idx else devs
    if idx:
        for i in idx:
            if i not in by_index:
                results.append(
                    row(
                        ctx,
                        Status.FAIL,
                        f"planned {kind} device {i} not present",
                        "fix the device list / *_VISIBLE_DEVICES in the topology",
                    )
                )
    busy = []
    for d in chosen:
        frac = d.free_fraction
        if frac is not None and frac < min_free:
            busy.append(d)
    usable = [d for d in chosen if d.free_fraction is None or d.free_fraction >= min_free]
    for d in busy:
        status = Status.FAIL if (idx or len(usable) < need) else Status.WARN
        results.append(
            row(
                ctx,
                status,
                f"{kind} {d.index} ({d.name}): {d.free_mib:.0f}/{d.total_mib:.0f} MiB "
                f"free ({d.free_fraction:.0%} < {min_free:.0%})",
                "another process holds device memory: find it with the vendor smi "
                "tool and stop it, or lower gpu_memory_utilization",
                index=d.index,
                free_fraction=d.free_fraction,
            )
        )
    if not any(r.status is Status.FAIL for r in results):
        results.insert(
            0,
            row(
                ctx,
                Status.OK,
                f"{len(devs)} {kind} device(s), {len(usable)} with >= "
                f"{min_free:.0%} memory free (need {need})",
                count=len(devs),
                need=need,
                names=sorted({d.name for d in devs}),
            ),
        )
    return results


def inventory_calls(family: str) -> Callable[[HostFacts], list[Call]]:
    """Parameter builder of a family's inventory probe: the devices its engines pin here
    and the largest memory fraction one of them will take."""

    def calls(facts: HostFacts) -> list[Call]:
        procs = facts.engines_of(family)
        devs = sorted({d for x in procs for d in x.devices})
        params: dict[str, Any] = {"need": len(devs), "devices": devs}
        params["pinned"] = {x.name: len(x.devices) for x in procs}
        utils = [u for u in (x.gpu_memory_utilization for x in procs) if u is not None]
        if utils:
            params["min_free_fraction"] = max(utils)
        return [Call(params)]

    return calls
