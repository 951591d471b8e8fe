"""Nodes and the ports each one opens, derived once for rules (conflicts) and plan (flags).

A *node* is one `vllm serve` process: an instance has one per host it spans
(multi-node data parallel, as in the GB200 guide).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdlaunch.topology import Instance, Role, Topology, instance_name

FieldPath = tuple[str | int, ...]

# vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:76-79: the NIXL
# side channel listens on VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index, one per DP rank
# (TP ranks' metadata is gathered and served by that one listener).
SIDE_CHANNEL_SOURCE = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:76"


@dataclass(frozen=True)
class Node:
    role: Role
    index: int
    instance: Instance
    node_index: int
    host: str
    start_rank: int
    local_size: int

    @property
    def name(self) -> str:
        base = instance_name(self.role, self.index, self.instance)
        return base if len(self.instance.node_hosts) == 1 else f"{base}-node{self.node_index}"

    @property
    def instance_name(self) -> str:
        return instance_name(self.role, self.index, self.instance)

    @property
    def path(self) -> FieldPath:
        return (self.role, self.index)

    @property
    def is_master(self) -> bool:
        return self.node_index == 0

    @property
    def serves_http(self) -> bool:
        # Without hybrid LB, nodes other than the master run headless (no API server).
        return self.is_master or self.instance.dp.hybrid_lb

    @property
    def device_count(self) -> int:
        return self.instance.tp * self.local_size


PortKind = Literal[
    "http", "nixl_side_channel", "dp_rpc", "mooncake_kv", "router_http", "router_metrics"
]


@dataclass(frozen=True)
class PortUse:
    port: int
    purpose: str  # for people; consumers read `kind`
    field: FieldPath
    kind: PortKind = "http"


def local_dp_size(inst: Instance) -> int:
    if inst.dp.local_size is not None:
        return inst.dp.local_size
    return max(1, inst.dp.size // len(inst.node_hosts))


def nodes_of(role: Role, index: int, inst: Instance) -> list[Node]:
    local = local_dp_size(inst)
    return [
        Node(role, index, inst, i, host, start_rank=i * local, local_size=local)
        for i, host in enumerate(inst.node_hosts)
    ]


def all_nodes(topo: Topology) -> list[Node]:
    return topo.derived(
        "nodes", lambda t: [n for role, i, inst in t.instances() for n in nodes_of(role, i, inst)]
    )


def _side_channel_ports(base: int, node: Node) -> list[int]:
    return [base + node.start_rank + r for r in range(node.local_size)]


def side_channel_bases(topo: Topology) -> dict[tuple[Role, int], int]:
    return topo.derived("side_channel_bases", _side_channel_bases)


def _side_channel_bases(topo: Topology) -> dict[tuple[Role, int], int]:
    """Pick each instance's NIXL base port so that instances sharing a host never collide.

    An explicit `side_channel_port` is kept as written (the rules report a clash); the
    others take the lowest base at or above the connector's that is free on all their hosts,
    so separate hosts keep the guide's 5600 everywhere.
    """
    taken: dict[str, set[int]] = {}
    bases: dict[tuple[Role, int], int] = {}
    pending = []
    fixed = _fixed_ports_by_host(topo)
    for role, i, inst in topo.instances():
        if inst.side_channel_port is not None:
            bases[(role, i)] = inst.side_channel_port
            for n in nodes_of(role, i, inst):
                taken.setdefault(n.host, set()).update(
                    _side_channel_ports(inst.side_channel_port, n)
                )
        else:
            pending.append((role, i, inst))
    for role, i, inst in pending:
        nodes = nodes_of(role, i, inst)
        others = {n.host: fixed.get(n.host, set()) for n in nodes}
        base = topo.kv_connector.side_channel_port
        while any(
            set(_side_channel_ports(base, n)) & (taken.get(n.host, set()) | others[n.host])
            for n in nodes
        ):
            base += 1
        bases[(role, i)] = base
        for n in nodes:
            taken.setdefault(n.host, set()).update(_side_channel_ports(base, n))
    return bases


def _fixed_ports_by_host(topo: Topology) -> dict[str, set[int]]:
    """Ports per host that are not NIXL side channels (so auto bases avoid them too)."""
    out: dict[str, set[int]] = {topo.router.host: {topo.router.port}}
    for n in all_nodes(topo):
        out.setdefault(n.host, set()).update(p.port for p in _fixed_ports(topo, n, {}))
    return out


def mooncake_settings(topo: Topology) -> dict[tuple[Role, int], tuple[int, str]]:
    """kv_port and engine_id per instance (the Ascend guide: 20001/"0" prefill, 20002/"1")."""
    return topo.derived("mooncake", _mooncake_settings)


def _mooncake_settings(topo: Topology) -> dict[tuple[Role, int], tuple[int, str]]:
    mc = topo.kv_connector.mooncake
    out: dict[tuple[Role, int], tuple[int, str]] = {}
    next_port, next_id = mc.kv_port, mc.engine_id_base
    for role, i, inst in topo.instances():
        port = inst.kv_port if inst.kv_port is not None else next_port
        engine = inst.engine_id if inst.engine_id is not None else str(next_id)
        out[(role, i)] = (port, engine)
        # Each engine's producer listens on tp x DP consecutive ports from its kv_port.
        next_port = port + inst.tp * inst.dp.size
        next_id += 1
    return out


def _fixed_ports(topo: Topology, node: Node, _: dict) -> list[PortUse]:
    inst, path = node.instance, node.path
    uses: list[PortUse] = []
    if node.serves_http:
        uses.append(PortUse(inst.port, "HTTP API", (*path, "port"), "http"))
    # vllm/v1/engine/utils.py:1307-1329: only the start-rank-0 front end binds the RPC port,
    # and only over TCP when DP spans nodes (one host uses an IPC path).
    if inst.dp.size > 1 and node.is_master and len(inst.node_hosts) > 1:
        uses.append(
            PortUse(inst.dp.rpc_port, "data-parallel RPC", (*path, "dp", "rpc_port"), "dp_rpc")
        )
    return uses


def node_ports(
    topo: Topology,
    node: Node,
    bases: dict[tuple[Role, int], int],
    mooncake: dict[tuple[Role, int], tuple[int, str]] | None = None,
) -> list[PortUse]:
    uses = _fixed_ports(topo, node, {})
    key = (node.role, node.index)
    if topo.kv_connector.kind == "nixl":
        field = (
            (*node.path, "side_channel_port")
            if node.instance.side_channel_port is not None
            else ("kv_connector", "side_channel_port")
        )
        for rank, port in enumerate(_side_channel_ports(bases[key], node), node.start_rank):
            uses.append(
                PortUse(port, f"NIXL side channel (DP rank {rank})", field, "nixl_side_channel")
            )
    elif mooncake is not None and node.role == "prefill":
        # vllm-ascend mooncake_connector (MooncakeConnectorWorker): the producer's sending
        # thread listens on kv_port + dp_rank*tp + tp_rank; the consumer only connects.
        port, _ = mooncake[key]
        field = (
            (*node.path, "kv_port")
            if node.instance.kv_port is not None
            else ("kv_connector", "mooncake", "kv_port")
        )
        tp = node.instance.tp
        for rank in range(node.start_rank, node.start_rank + node.local_size):
            for tp_rank in range(tp):
                uses.append(
                    PortUse(
                        port + rank * tp + tp_rank,
                        f"Mooncake KV (DP {rank}, TP {tp_rank})",
                        field,
                        "mooncake_kv",
                    )
                )
    return uses


def router_ports(topo: Topology) -> list[PortUse]:
    uses = [PortUse(topo.router.port, "router HTTP", ("router", "port"), "router_http")]
    if topo.router.kind == "vllm-router":
        uses.append(
            PortUse(
                topo.router.prometheus_port,
                "router metrics",
                ("router", "prometheus_port"),
                "router_metrics",
            )
        )
    return uses
