"""Nodes and the ports each one opens, derived once for rules (conflicts) and plan (flags).

A *node* is one `vllm serve` process: an instance has one per host it spans
(multi-node data parallel, as in the GB200 guide).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdlaunch.spec.addresses import host_key, listeners_clash
from pdlaunch.spec.topology import Instance, Role, Topology, instance_name

FieldPath = tuple[str | int, ...]

# vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:76-79: the NIXL
# side channel listens on VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index, one per DP rank
# (TP ranks' metadata is gathered and served by that one listener). Releases differ (0.10:
# one per TP rank at PORT + dp_rank*tp + tp_rank): the formula of an instance's release comes
# from its facts (runtime.nixl.side_channel, with the wheel's lines).
SIDE_CHANNEL_SOURCE = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:76"
PER_TP_RANK = "dp_rank_tp"  # the 0.10 formula's name in the facts
# Where a program picks its listening address itself (or pdlaunch cannot know it): assume every
# address, so a port it takes clashes with any other listener on that machine.
EVERY_ADDRESS = "0.0.0.0"


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
    # The address bind(2) is given: two uses of one port clash only where these overlap on
    # one machine (pdlaunch.spec.addresses.listeners_clash).
    bind: str = EVERY_ADDRESS


class Listeners:
    """Ports already taken, per machine, with what each binds: the port-conflict rule and the
    side-channel allocation ask the same question of it."""

    def __init__(self) -> None:
        self._by_port: dict[tuple[str, int], list[tuple[str, str, str, PortUse]]] = {}

    def add(self, owner: str, host: str, use: PortUse) -> None:
        self._by_port.setdefault((host_key(host), use.port), []).append(
            (owner, host, use.bind, use)
        )

    def clash(self, host: str, bind: str, port: int) -> tuple[str, PortUse] | None:
        """The first listener taken before that `bind` on `host` would collide with."""
        for owner, other_host, other_bind, use in self._by_port.get((host_key(host), port), ()):
            if listeners_clash(host, bind, other_host, other_bind):
                return owner, use
        return None


def dp_master_address(inst: Instance) -> str:
    """--data-parallel-address: the rank-0 front end binds its RPC port there."""
    return inst.dp.master_address or inst.node_hosts[0]


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


def side_channel_formula(topo: Topology, inst: Instance) -> str:
    """How the instance's vLLM derives its listeners' ports from VLLM_NIXL_SIDE_CHANNEL_PORT."""
    from pdlaunch.spec import facts

    try:
        vf = facts.vllm(topo.vllm_version_of(inst))
    except KeyError:
        return "dp_index"  # the vllm-version rule refuses the topology
    return vf.side_channel.get("formula", "dp_index")


def _side_channel_ports(base: int, node: Node, formula: str) -> list[tuple[int, str]]:
    ranks = range(node.start_rank, node.start_rank + node.local_size)
    if formula == PER_TP_RANK:
        tp = node.instance.tp
        return [(base + r * tp + t, f"DP rank {r}, TP rank {t}") for r in ranks for t in range(tp)]
    return [(base + r, f"DP rank {r}") for r in ranks]


def side_channel_bases(topo: Topology) -> dict[tuple[Role, int], int]:
    return topo.derived("side_channel_bases", _side_channel_bases)


def _side_channel_bases(topo: Topology) -> dict[tuple[Role, int], int]:
    """Pick each instance's NIXL base port so that no side channel clashes with another
    listener (same machine, overlapping binds: pdlaunch.spec.addresses.listeners_clash).

    An explicit `side_channel_port` is kept as written (the rules report a clash); the
    others take the lowest base at or above the connector's that is free on all their hosts,
    so separate hosts keep the guide's 5600 everywhere.
    """
    taken = _fixed_listeners(topo)
    bases: dict[tuple[Role, int], int] = {}
    pending = []
    for role, i, inst in topo.instances():
        if inst.side_channel_port is not None:
            bases[(role, i)] = inst.side_channel_port
            for n in nodes_of(role, i, inst):
                for use in _side_channel_uses(topo, inst.side_channel_port, n, ()):
                    taken.add(n.name, n.host, use)
        else:
            pending.append((role, i, inst))
    for role, i, inst in pending:
        nodes = nodes_of(role, i, inst)
        base = topo.kv_connector.side_channel_port
        while any(
            taken.clash(n.host, use.bind, use.port)
            for n in nodes
            for use in _side_channel_uses(topo, base, n, ())
        ):
            base += 1
        bases[(role, i)] = base
        for n in nodes:
            for use in _side_channel_uses(topo, base, n, ()):
                taken.add(n.name, n.host, use)
    return bases


def _fixed_listeners(topo: Topology) -> Listeners:
    """Listeners that are not NIXL side channels (so auto bases avoid them too)."""
    out = Listeners()
    for use in router_ports(topo):
        out.add("router", topo.router.host, use)
    for n in all_nodes(topo):
        for use in _fixed_ports(topo, n):
            out.add(n.name, n.host, use)
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


def _fixed_ports(topo: Topology, node: Node) -> list[PortUse]:
    inst, path = node.instance, node.path
    uses: list[PortUse] = []
    if node.serves_http:
        uses.append(PortUse(inst.port, "HTTP API", (*path, "port"), "http", inst.bind))
    # vllm/v1/engine/utils.py:1307-1329: only the start-rank-0 front end binds the RPC port
    # (at --data-parallel-address), and only over TCP when DP spans nodes (one host uses an
    # IPC path).
    if inst.dp.size > 1 and node.is_master and len(inst.node_hosts) > 1:
        uses.append(
            PortUse(
                inst.dp.rpc_port,
                "data-parallel RPC",
                (*path, "dp", "rpc_port"),
                "dp_rpc",
                dp_master_address(inst),
            )
        )
    return uses


def _side_channel_uses(topo: Topology, base: int, node: Node, field: FieldPath) -> list[PortUse]:
    # nixl/base_scheduler.py:348-351 binds tcp://VLLM_NIXL_SIDE_CHANNEL_HOST:port, and the
    # plan sets that variable to the node's host (nodeenv.py).
    formula = side_channel_formula(topo, node.instance)
    return [
        PortUse(port, f"NIXL side channel ({ranks})", field, "nixl_side_channel", node.host)
        for port, ranks in _side_channel_ports(base, node, formula)
    ]


def node_ports(
    topo: Topology,
    node: Node,
    bases: dict[tuple[Role, int], int],
    mooncake: dict[tuple[Role, int], tuple[int, str]] | None = None,
) -> list[PortUse]:
    uses = _fixed_ports(topo, node)
    key = (node.role, node.index)
    if topo.kv_connector.kind == "nixl":
        field = (
            (*node.path, "side_channel_port")
            if node.instance.side_channel_port is not None
            else ("kv_connector", "side_channel_port")
        )
        uses += _side_channel_uses(topo, bases[key], node, field)
    elif mooncake is not None and node.role == "prefill":
        # vllm-ascend mooncake_connector (MooncakeConnectorWorker): the producer's sending
        # thread listens on kv_port + dp_rank*tp + tp_rank; the consumer only connects. It
        # binds the address vLLM finds for the machine (get_ip), not one pdlaunch sets.
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
                        EVERY_ADDRESS,
                    )
                )
    return uses


def router_ports(topo: Topology) -> list[PortUse]:
    r = topo.router
    uses = [PortUse(r.port, "router HTTP", ("router", "port"), "router_http", r.bind)]
    if r.kind == "vllm-router":
        # pdlaunch passes no --prometheus-host: the router's own default decides.
        uses.append(
            PortUse(
                r.prometheus_port,
                "router metrics",
                ("router", "prometheus_port"),
                "router_metrics",
                EVERY_ADDRESS,
            )
        )
    return uses
