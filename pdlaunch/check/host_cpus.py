"""The cores of the hosts whose CPU engines the topology binds without saying how many cores
the host has (`hosts.<host>.cpus`): read from each host's own affinity mask, the one the
engines inherit, so `up` and `check` bind within it (issue 31: a 1-prefill + 2-decode CPU
topology on a 2-core laptop). `render` and `plan` reach no host and bind as written."""

from __future__ import annotations

from pdlaunch.check.probes.cpu import COMMAND, parse_affinity
from pdlaunch.hosts import HostError, HostPool, parallel
from pdlaunch.plan.build import Plan
from pdlaunch.plan.cpu import usable_cores


def measure_cpus(plan: Plan, hosts: list[str], pool: HostPool) -> dict[str, int]:
    """{host: usable cores} for each of ``hosts`` that answers; a host that cannot be reached,
    or answers with something that is not the command's output (the cpu probe's own parser
    judges it), is left out: the preflight says why."""
    first = {}
    for p in plan.processes:
        if p.host in hosts and p.host not in first:
            first[p.host] = p

    def read(host: str) -> tuple[str, int | None]:
        p = first[host]
        try:
            res = pool.get(p.host, p.local, p.ssh.model_dump()).run(COMMAND, timeout=30)
            _, _, _, allowed = parse_affinity(res.stdout)
        except (HostError, IndexError, ValueError):
            return host, None
        n = usable_cores(allowed)
        return host, n or None

    return {h: n for h, n in parallel(read, list(first)) if n is not None}
