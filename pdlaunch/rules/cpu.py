"""CPU budget rules: a CPU engine bound to a core its host does not have, and a host whose
CPU engines want more cores than it has (cpubudget.py, devices.py CpuBudget)."""

from __future__ import annotations

from collections.abc import Iterator

from pdlaunch.plan.cpu import host_budgets, host_cpus
from pdlaunch.plan.env import devices_of
from pdlaunch.plan.ports import all_nodes
from pdlaunch.rules.base import Finding, error, rule, warning
from pdlaunch.spec.topology import Topology

SOURCE = "vllm/utils/ompmultiprocessing.py:78,123-170; docs/cpu-pd-recipe.md (CPU budget)"
NIXL_PIN = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:701-714"


@rule("cpu-cores", "CPU engines are bound only to cores their host has", SOURCE)
def cpu_cores(topo: Topology) -> Iterator[Finding]:
    for node in all_nodes(topo):
        if node.instance.device != "cpu":
            continue
        cpus = host_cpus(topo, node.host)
        if cpus is None:
            continue
        missing = [c for c in devices_of(topo, node) if c >= cpus]
        if missing:
            yield error(
                "cpu-cores",
                (*node.path, "devices"),
                f"{node.name} is bound to core(s) {', '.join(map(str, missing))} but "
                f"{node.host} has {cpus} (hosts.{topo.settings_key(node.host)}.cpus): OpenMP would "
                "bind to a core that does not exist",
                f"list cores below {cpus} in `devices`, or correct `cpus`",
                SOURCE,
            )


@rule("cpu-budget", "a host's CPU engines fit its cores", SOURCE)
def cpu_budget(topo: Topology) -> Iterator[Finding]:
    for b in host_budgets(topo, lambda n: devices_of(topo, n)):
        field = ("hosts", topo.settings_key(b.host) or b.host, "cpus")
        engines = ", ".join(b.engines)
        if b.cpus is not None and b.busy_threads > b.cpus:
            yield warning(
                "cpu-budget",
                field,
                f"{b.host} has {b.cpus} cores but its CPU engines ({engines}) keep "
                f"{b.busy_threads} threads busy (one OpenMP thread per bound core, plus the "
                "worker's busy loop each, and NIXL's progress thread where "
                "kv_connector.progress_delay_us is 0): requests queue "
                "behind each other's threads and the tail latency grows (measured: "
                "docs/cpu-pd-recipe.md, CPU budget)",
                "place fewer CPU engines on this host, or give it more cores",
                SOURCE,
            )
        if len(b.nixl_engines) > 1:
            yield warning(
                "cpu-budget",
                field,
                f"{len(b.nixl_engines)} NIXL CPU engines on {b.host} ({engines}): vLLM's "
                "NixlConnector moves each worker's main thread, which runs the model, to the "
                "last core of each NUMA node whatever the binding, so they all compute on "
                "the same core",
                "one CPU engine per host (or per NUMA node) for disaggregated serving that "
                "is measured; several on one host only for functional tests",
                NIXL_PIN,
            )
