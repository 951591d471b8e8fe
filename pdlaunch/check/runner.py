"""Run the `pdlaunch check` probes of a plan on its hosts.

Flow (:func:`run_check`)::

    group the plan's processes by host (address + how to reach it)        -> targets.py
    plan, per host, the jobs of every probe it needs: the probe families its device kinds'
        entries in devices.py name, the transports its plan uses, and each probe's own
        parameter builder over the plan's typed facts
    phase 1, one thread per host:  connect -> ONE shell round trip that runs, in parallel on
        the host, every planned job                                         -> batch.py
        (the software probes of engines in a docker/podman container as one job per image
        that runs them inside it                                            -> inside.py)
    phase 1b: the reachability probes each host is the source of (decode -> prefill NIXL
        side channel / Mooncake port, router -> every instance HTTP port, DP node -> master
        RPC), with every free target port held by a listener meanwhile       -> reach.py
    phase 2:                       pair probes that need phase-1 facts (Ascend NPU pings at
        the decode NPU addresses learnt in phase 1; --fast keeps only these fast ones), and
        with --bandwidth ``ib_write_bw`` per prefill -> decode host pair      -> pairs.py
    cluster:                       each probe's cross-host comparison (versions equal, Ascend
        TLS identical)
    report                                                                  -> report.py

A host that cannot be reached gives one FAIL row (``host.connect``) with the HostError
message; the other hosts are checked all the same. What a probe runs and how its output is
judged is its module's job (:mod:`pdlaunch.check.probes`); the runner modules only decide
where, run it through the hosts layer and attach the results to hosts and pairs. They name
no probe id and no device kind, and read only typed plan facts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pdlaunch.check import probes as registry
from pdlaunch.check.batch import Job, probe_job, run_jobs
from pdlaunch.check.inside import image_jobs
from pdlaunch.check.pairs import bandwidth_probes, pair_probes, skip_pair
from pdlaunch.check.probes import select_probes
from pdlaunch.check.probes.ports import REACH
from pdlaunch.check.reach import (
    hold_ports,
    reach_job,
    reach_pairs,
    release_ports,
    resolved_reaches,
)
from pdlaunch.check.report import CheckReport
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.check.targets import HostTarget, group_hosts, host_facts, probe_python
from pdlaunch.hosts import ConnectOptions, Host, HostError, HostPool, parallel
from pdlaunch.plan.build import Plan

__all__ = ["CheckOptions", "CheckReport", "group_hosts", "host_jobs", "run_check"]


@dataclass
class CheckOptions:
    """fast: the quick subset `up` runs (NPU pings included, no bandwidth).
    bandwidth: add ``ib_write_bw`` between every prefill -> decode host pair (RDMA plans).
    connect: how hosts are reached (unused when ``run_check`` is handed a connected pool).
    reach_timeout: seconds a reachability connect may take before it counts as filtered.
    min_bandwidth_gbps: WARN below it (``--bandwidth``)."""

    fast: bool = False
    bandwidth: bool = False
    connect: ConnectOptions = field(default_factory=ConnectOptions)
    reach_timeout: float = 3.0
    min_bandwidth_gbps: float | None = None


def host_jobs(plan: Plan, t: HostTarget, opts: CheckOptions) -> list[Job]:
    """Every job the plan needs on host ``t``: the probes its families and transports
    select, each with the calls its parameter builder makes of the host's plan facts; the
    probes of the software inside, for engines in a container, in their image (inside.py)."""
    probes = select_probes(t.families, t.transports, scope="host", fast_only=opts.fast)
    facts, own = host_facts(plan, t), host_facts(plan, t, t.on_host)
    jobs = [
        probe_job(probe, t.label, call)
        for probe in probes
        for call in probe.calls(own if probe.inside else facts)
    ]
    return jobs + image_jobs(plan, t, [p for p in probes if p.inside])


class _Pool:
    """The hosts of one check: the caller's connected HostPool (`up` hands its own, so its
    preflight opens no second connection per host), else one opened here and closed after."""

    def __init__(self, opts: CheckOptions, pool: HostPool | None = None):
        self._own = pool is None
        self.pool = HostPool(opts.connect) if pool is None else pool

    def get(self, t: HostTarget) -> Host:
        return self.pool.get(t.address, t.local, t.ssh)

    def close(self) -> None:
        if self._own:
            self.pool.close()


def _connect_fail(t: HostTarget) -> CheckResult:
    port = t.ssh.get("port")
    user = t.ssh.get("user")
    login = f"{user + '@' if user else ''}{t.address}"
    return CheckResult(
        "host.connect",
        t.label,
        Status.FAIL,
        t.error,
        "check the address and SSH settings in the topology, then try "
        f"`ssh {f'-p {port} ' if port else ''}{login} true`",
    )


def run_check(
    plan: Plan, opts: CheckOptions | None = None, *, pool: HostPool | None = None
) -> CheckReport:
    """Check every host and pair of ``plan``; never raises for host problems. ``pool``:
    hosts already connected (left open); without it the check opens and closes its own."""
    opts = opts or CheckOptions()
    t0 = time.monotonic()
    hosts = group_hosts(plan)
    jobs = {t.key: host_jobs(plan, t, opts) for t in hosts}
    by_proc = {proc.name: t for t in hosts for proc in t.processes}
    reaches = reach_pairs(plan)
    pairs: list[str] = []
    for r in reaches:
        if r.label not in pairs:
            pairs.append(r.label)
    pools = _Pool(opts, pool)
    opened: dict[tuple, Host] = {}
    lock = threading.Lock()
    try:
        # -- phase 1: connect + host probes, one thread per host
        def phase1(t: HostTarget) -> list[CheckResult]:
            mine = [r for r in reaches if by_proc[r.source] is t]
            try:
                host = pools.get(t)
            except HostError as exc:
                t.reachable, t.error = False, str(exc)
                return [_connect_fail(t)] + [
                    skip_pair(r.label, REACH.id, f"{t.label} unreachable") for r in mine
                ]
            t.reachable = True
            with lock:
                opened[t.key] = host
            return run_jobs(host, list(jobs[t.key]), t.label)

        results = [r for rs in parallel(phase1, hosts) for r in rs]
        reaches = resolved_reaches(reaches, by_proc, results)

        # -- phase 1b: reachability, after the free-port probes: every target port that is
        # free is held by a listener while its peers connect, then released
        held, holders = hold_ports(reaches, by_proc, opened, opts.reach_timeout)
        try:

            def reach(t: HostTarget) -> list[CheckResult]:
                mine = [r for r in reaches if by_proc[r.source] is t]
                if not mine or t.key not in opened:  # phase 1 said why for unreachable ones
                    return []
                job = reach_job(mine, probe_python(t), opts.reach_timeout, held)
                return run_jobs(opened[t.key], [job], t.label)

            results += [r for rs in parallel(reach, hosts) for r in rs]
        finally:
            release_ports(holders)

        # -- phase 2: pairs that need phase-1 facts or a peer process (with --fast, only
        # the pair probes marked fast: the Ascend NPU ping the guide runs before PD)
        results += pair_probes(
            plan, by_proc, opened, results, pairs, fast=opts.fast, bandwidth=opts.bandwidth
        )
        if opts.bandwidth and not opts.fast:
            results += bandwidth_probes(plan, by_proc, opened, pairs, opts.min_bandwidth_gbps)

        # -- cluster-wide
        results += _cluster(hosts, jobs, results)
    finally:
        pools.close()
    return CheckReport(results, hosts, pairs, time.monotonic() - t0, opts.fast)


def _cluster(
    hosts: list[HostTarget], jobs: Mapping[tuple, list[Job]], results: list[CheckResult]
) -> list[CheckResult]:
    """Each probe's cross-host comparison, over the hosts it was planned on (reachable or
    not: a host that never reported is part of what the comparison says)."""
    out: list[CheckResult] = []
    for probe in registry.PROBES:
        if probe.cluster is None:
            continue
        planned = [t.label for t in hosts if any(probe in j.probes() for j in jobs[t.key])]
        if planned:
            out += probe.cluster(planned, [r for r in results if r.probe == probe.id])
    return out
