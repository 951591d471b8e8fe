"""The CPU budget of the engines pdlaunch places on a host: which cores each CPU engine's
OpenMP threads are bound to, and whether a host's engines ask for more than it has.

A CPU engine's cost per host is data in devices.py (`CpuBudget`); a host's core count is
the topology's `hosts: {H: {cpus: N}}` (`pdlaunch check` compares it with the host's real
affinity). Without it the cores are unknown and each CPU engine rank gets the next core in
topology order, as before. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdlaunch.plan.nixl_progress import progress_delay_us
from pdlaunch.plan.ports import Node, all_nodes
from pdlaunch.spec.addresses import host_key
from pdlaunch.spec.devices import CpuBudget, profile
from pdlaunch.spec.topology import HostSettings, Topology


@dataclass(frozen=True)
class HostBudget:
    host: str
    # Cores the topology says the host has (None: not given).
    cpus: int | None
    engines: tuple[str, ...]
    # Threads that want a core at all times: one OMP thread per bound core plus each
    # engine's busy threads (devices.py CpuBudget.busy_threads).
    busy_threads: int
    # Engines whose KV connector is NIXL: each moves its worker's main thread to the last
    # core of every NUMA node (vllm nixl/base_worker.py:701-714).
    nixl_engines: tuple[str, ...]


def host_cpus(topo: Topology, host: str) -> int | None:
    return topo.settings_of(host).cpus  # keyed like every host setting (by address)


def _budget(node: Node) -> CpuBudget | None:
    return profile(node.instance.device).cpu_budget


def assign_cores(topo: Topology) -> dict[str, list[int]]:
    """Cores per CPU engine node without `devices:`: the next ones on its host in topology
    order; where the host's `cpus` is known, wrapped round it, so no engine is bound to a
    core the host does not have (two engines then share a core: `validate` warns)."""
    next_core: dict[str, int] = {}
    out: dict[str, list[int]] = {}
    for n in all_nodes(topo):
        budget = _budget(n)
        if budget is None:
            continue
        machine = host_key(n.host)  # localhost and 127.0.0.1 share their cores
        start = next_core.get(machine, 0)
        want = n.device_count * budget.cores_per_rank
        cpus = host_cpus(topo, n.host)
        if cpus is None:
            cores = list(range(start, start + want))
        else:
            cores = [(start + i) % cpus for i in range(min(want, cpus))]
            # A rank needs at least one core; with fewer cores than ranks they repeat.
            while len(cores) < want:
                cores.append(cores[len(cores) % cpus])
        out[n.name] = cores
        next_core[machine] = start + want
    return out


def host_budgets(topo: Topology, cores_of) -> list[HostBudget]:
    """One entry per host that runs CPU engines; ``cores_of(node)`` gives a node's cores."""
    by_host: dict[str, list[Node]] = {}
    for n in all_nodes(topo):
        if _budget(n) is not None:
            by_host.setdefault(host_key(n.host), []).append(n)
    out = []
    for nodes in by_host.values():
        busy = 0
        for n in nodes:
            budget = _budget(n)
            assert budget is not None
            busy += len(cores_of(n)) + budget.busy_threads
            if progress_delay_us(topo, n.instance):
                # NIXL's progress thread sleeps in poll() between events: not a busy thread
                # (measured idle: under 2 % of a core; docs/cpu-pd-recipe.md, gotcha 7).
                busy -= 1
        nixl = tuple(n.name for n in nodes) if topo.kv_connector.kind == "nixl" else ()
        out.append(
            HostBudget(
                host=nodes[0].host,
                cpus=host_cpus(topo, nodes[0].host),
                engines=tuple(n.name for n in nodes),
                busy_threads=busy,
                nixl_engines=nixl,
            )
        )
    return out


def hosts_without_cpus(topo: Topology) -> list[str]:
    """Hosts (as written) that run CPU engines bound by pdlaunch and whose `cpus` the topology
    does not give: `up` and `check` read their cores from the host itself."""
    out: list[str] = []
    for n in all_nodes(topo):
        if _budget(n) is None or n.instance.devices is not None:
            continue
        if host_cpus(topo, n.host) is None and n.host not in out:
            out.append(n.host)
    return out


def with_host_cpus(topo: Topology, measured: dict[str, int]) -> Topology:
    """``topo`` with `hosts.<host>.cpus` set to ``measured`` where the topology leaves it
    unset (a declared value always wins), as if the user had written it."""
    hosts = dict(topo.hosts)
    for host, cpus in measured.items():
        key = topo.settings_key(host) or host
        current = hosts.get(key, HostSettings())
        if current.cpus is None:
            hosts[key] = current.model_copy(update={"cpus": cpus})
    new = topo.model_copy(update={"hosts": hosts})
    new.__pydantic_private__["_derived"] = {}  # the copy shares the old cache otherwise
    return new


def usable_cores(allowed: set[int]) -> int:
    """How many cores `cpus: N` (cores 0..N-1) may name on a host whose affinity mask is
    ``allowed``: the run of cores from 0 it holds (0 when core 0 is not allowed)."""
    n = 0
    while n in allowed:
        n += 1
    return n
