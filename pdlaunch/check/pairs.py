"""Pair probes: per prefill -> decode pair, the probes that need phase-1 facts of the peer
(e.g. Ascend NPU pings at the decode NPU addresses) and, with ``--bandwidth``,
``ib_write_bw`` per prefill host -> decode host pair."""

from __future__ import annotations

import threading
import time
from typing import Any

from pdlaunch.check import probes as registry
from pdlaunch.check.batch import Job, probe_job, run_jobs
from pdlaunch.check.probes import Call, Probe, families_of
from pdlaunch.check.probes.bandwidth import IB_WRITE_BW, server_command
from pdlaunch.check.probes.rdma import planned_hcas
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.check.targets import HostTarget
from pdlaunch.hosts import Host, HostError, parallel
from pdlaunch.plan.build import Plan, Process


def skip_pair(label: str, probe: str, why: str) -> CheckResult:
    return CheckResult(probe, label, Status.SKIP, f"not run: {why}")


def _pair_applies(probe: Probe, src: HostTarget, dst: HostTarget, a: Process, b: Process) -> bool:
    families = families_of([a.device] if a.device else []) & families_of(
        [b.device] if b.device else []
    )
    return probe.needs.matches(probe.family, families, src.transports & dst.transports)


def pair_probes(
    plan: Plan,
    by_proc: dict[str, HostTarget],
    opened: dict[tuple, Host],
    results: list[CheckResult],
    pairs: list[str],
    *,
    fast: bool,
    bandwidth: bool,
) -> list[CheckResult]:
    """Pair probes with a ``pair_call``, per prefill -> decode process pair both of whose
    device kinds (and hosts' transports) the probe needs; run on the prefill host. ``fast``
    keeps the probes marked fast; optional ones run only with ``bandwidth``. New pair labels
    are appended to ``pairs``."""
    jobs: dict[tuple, list[Job]] = {}
    out: list[CheckResult] = []
    for probe in registry.PROBES:
        if probe.scope != "pair" or probe.pair_call is None:
            continue
        if (probe.optional and not bandwidth) or (fast and not probe.fast):
            continue
        for pf in plan.by_role("prefill"):
            for d in plan.by_role("decode"):
                src, dst = by_proc[pf.name], by_proc[d.name]
                if not _pair_applies(probe, src, dst, pf, d):
                    continue
                label = f"{pf.name} -> {d.name}"
                if label not in pairs:
                    pairs.append(label)
                if not src.reachable:
                    out.append(skip_pair(label, probe.id, f"{src.label} unreachable"))
                    continue
                on_dst = [r for r in results if r.target == dst.label]
                call = probe.pair_call(pf, d, dst.label, on_dst)
                if isinstance(call, str):
                    out.append(skip_pair(label, probe.id, call))
                    continue
                jobs.setdefault(src.key, []).append(probe_job(probe, label, call))

    def one(key: tuple) -> list[CheckResult]:
        return run_jobs(opened[key], jobs[key], "")

    for rs in parallel(one, list(jobs)):
        out += rs
    return out


def bandwidth_probes(
    plan: Plan,
    by_proc: dict[str, HostTarget],
    opened: dict[tuple, Host],
    pairs: list[str],
    min_gbps: float | None,
) -> list[CheckResult]:
    """``ib_write_bw`` per prefill host -> decode host (server on decode), one at a time:
    the server listens on perftest's default port and measurements must not overlap."""
    probe = IB_WRITE_BW
    out: list[CheckResult] = []
    done: set[tuple] = set()
    for pf in plan.by_role("prefill"):
        for d in plan.by_role("decode"):
            src, dst = by_proc[pf.name], by_proc[d.name]
            if not _pair_applies(probe, src, dst, pf, d):
                continue
            if (src.key, dst.key) in done:
                continue
            done.add((src.key, dst.key))
            label = f"{pf.name} -> {d.name}"
            if label not in pairs:
                pairs.append(label)
            if not (src.reachable and dst.reachable):
                out.append(skip_pair(label, probe.id, "a host of the pair is unreachable"))
                continue
            out += _one_bandwidth(
                label, opened[src.key], opened[dst.key], src, dst, d.host, min_gbps
            )
    return out


def _first_hca(t: HostTarget) -> dict[str, Any]:
    hcas = planned_hcas(t.engines)
    return {"device": hcas[0].split(":")[0]} if hcas else {}


def _one_bandwidth(
    label: str,
    client: Host,
    server: Host,
    src: HostTarget,
    dst: HostTarget,
    server_address: str,
    min_gbps: float | None,
) -> list[CheckResult]:
    probe = IB_WRITE_BW
    server_cmd = server_command(_first_hca(dst))
    box: dict[str, Any] = {}

    def serve() -> None:
        try:
            box["res"] = server.run(server_cmd, timeout=60)
        except HostError as exc:
            box["err"] = str(exc)

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    time.sleep(1.0)
    params: dict[str, Any] = {"server": server_address, **_first_hca(src)}
    if min_gbps is not None:
        params["min_gbps"] = min_gbps
    if "res" in box and box["res"].rc == 127:
        th.join()
        return [
            CheckResult(
                probe.id, label, Status.SKIP, f"ib_write_bw not found on {dst.label} (server)"
            )
        ]
    job = probe_job(probe, label, Call(params, required=False))
    res = run_jobs(client, [job], label)
    th.join(timeout=70)
    return res
