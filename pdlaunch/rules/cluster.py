"""Cluster rules: names, data-parallel shape, ports per host, devices per host, reachability,
and addresses that can be dialled."""

from __future__ import annotations

from collections.abc import Iterator

from pdlaunch.plan.node_addr import resolves_on_node
from pdlaunch.plan.ports import (
    SIDE_CHANNEL_SOURCE,
    Listeners,
    PortUse,
    all_nodes,
    mooncake_settings,
    node_ports,
    router_ports,
    side_channel_bases,
)
from pdlaunch.rules.base import (
    SEED_ASCEND,
    SEED_GB200,
    SEED_HETERO,
    Finding,
    error,
    rule,
    warning,
)
from pdlaunch.spec.addresses import (
    host_key,
    is_loopback,
    is_unspecified,
    same_address,
    same_machine,
)
from pdlaunch.spec.devices import profile
from pdlaunch.spec.load import FieldPath
from pdlaunch.spec.topology import Topology


@rule("unique-names", "instance and process names are unique", "pdlaunch plan")
def unique_names(topo: Topology) -> Iterator[Finding]:
    seen: dict[str, FieldPath] = {}
    for node in all_nodes(topo):
        if node.name in seen or node.name == "router":
            yield error(
                "unique-names",
                (*node.path, "name"),
                f"process name {node.name!r} is used twice",
                "give each instance a distinct `name`",
                "pdlaunch plan (scripts, logs and state are keyed by name)",
            )
        seen.setdefault(node.name, node.path)


@rule(
    "host-settings",
    "every `hosts:` entry names a host of the topology, as written",
    "pdlaunch plan (settings are keyed by address, not by machine)",
)
def host_settings(topo: Topology) -> Iterator[Finding]:
    # Settings apply to the address written (in its other spellings too), never to another
    # loopback address of the same machine: SSH settings for 127.0.0.30 must not reach a
    # router on 127.0.0.1. An entry no host uses would be dropped without a word.
    used = [n.host for n in all_nodes(topo)] + [topo.router.host]
    for name in topo.hosts:
        if any(same_address(name, h) for h in used):
            continue
        alias = sorted({h for h in used if same_machine(name, h)})
        if alias:
            yield error(
                "host-settings",
                ("hosts", name),
                f"hosts.{name} applies to hosts written {name!r} only; the topology runs on "
                f"this machine as {', '.join(alias)}, which these settings do not reach",
                f"key the settings by the address the nodes use (`hosts: {{{alias[0]}: ...}}`)",
                "pdlaunch plan (settings are keyed by address, not by machine)",
            )
        else:
            yield warning(
                "host-settings",
                ("hosts", name),
                f"no prefill, decode or router runs on {name}: these settings are unused",
                "remove the entry, or fix the host it names",
                "pdlaunch plan (settings are keyed by address, not by machine)",
            )


@rule("dp-shape", "data-parallel sizes add up across an instance's nodes", SEED_GB200)
def dp_shape(topo: Topology) -> Iterator[Finding]:
    for role, i, inst in topo.instances():
        hosts = inst.node_hosts
        if len(set(hosts)) != len(hosts):
            yield error(
                "dp-shape",
                (role, i, "hosts"),
                "a host is listed twice in one instance",
                "list each node once",
                SEED_GB200,
            )
        local = inst.dp.local_size or inst.dp.size // len(hosts)
        if local * len(hosts) != inst.dp.size:
            yield error(
                "dp-shape",
                (role, i, "dp", "size"),
                f"dp.size {inst.dp.size} is not {len(hosts)} nodes x local size {local}",
                "set dp.size = dp.local_size x number of hosts",
                f"{SEED_GB200} (--data-parallel-size 8, --data-parallel-size-local 4, 2 nodes)",
            )


@rule("port-conflict", "no two listeners on one machine bind one port", SIDE_CHANNEL_SOURCE)
def port_conflict(topo: Topology) -> Iterator[Finding]:
    """Two uses of a port clash only on the same machine with overlapping binds (one address,
    or either a wildcard): pdlaunch.spec.addresses.listeners_clash, which the side-channel
    allocation (ports.py) asks too."""
    bases = side_channel_bases(topo)
    mooncake = mooncake_settings(topo)
    uses: list[tuple[str, str, PortUse]] = [
        (node.name, node.host, use)
        for node in all_nodes(topo)
        for use in node_ports(topo, node, bases, mooncake)
    ]
    uses += [("router", topo.router.host, use) for use in router_ports(topo)]
    taken = Listeners()
    for owner, host, use in uses:
        port = use.port
        if port > 65535:
            yield error(
                "port-conflict",
                use.field,
                f"{owner}: {use.purpose} would be port {port}, beyond 65535",
                "lower the base port",
                SIDE_CHANNEL_SOURCE,
            )
            continue
        clash = taken.clash(host, use.bind, port)
        if clash is not None:
            other, other_use = clash
            yield error(
                "port-conflict",
                use.field,
                f"port {port} on {host_key(host)} is both {other}'s {other_use.purpose} "
                f"(bind {other_use.bind}) and {owner}'s {use.purpose} (bind {use.bind})",
                "give one of them another port (or bind them to different addresses)",
                f"{SEED_ASCEND} ('the Port used by each Prefill and Decode instance cannot "
                f"conflict'); {SIDE_CHANNEL_SOURCE}",
            )
            continue
        taken.add(owner, host, use)
        if port < 1024:
            yield warning(
                "port-conflict",
                use.field,
                f"{owner}: {use.purpose} port {port} is privileged (needs root)",
                "use a port >= 1024",
                "POSIX: binding below 1024 needs CAP_NET_BIND_SERVICE",
            )


def _hccl_ranges(env: dict[str, str]) -> list[tuple[str, range]]:
    """Port ranges HCCL reserves on an Ascend host: HCCL_HOST_SOCKET_PORT_RANGE and
    HCCL_NPU_SOCKET_PORT_RANGE ("a-b"); the NPU side defaults to 16666 when unset."""
    out = []
    for var in ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE"):
        value = env.get(var, "")
        lo, sep, hi = value.partition("-")
        if sep and lo.strip().isdigit() and hi.strip().isdigit():
            out.append((var, range(int(lo), int(hi) + 1)))
    if "HCCL_NPU_SOCKET_PORT_RANGE" not in env:
        out.append(("HCCL NPU default port", range(16666, 16667)))
    return out


@rule("ascend-ports", "Mooncake ports stay out of the ranges HCCL reserves", "CANN HCCL docs")
def ascend_ports(topo: Topology) -> Iterator[Finding]:
    bases = side_channel_bases(topo)
    mooncake = mooncake_settings(topo)
    for node in all_nodes(topo):
        if node.instance.device != "npu":
            continue
        env = {**topo.defaults.env, **node.instance.env}
        for use in node_ports(topo, node, bases, mooncake):
            for var, reserved in _hccl_ranges(env):
                if use.port in reserved:
                    yield error(
                        "ascend-ports",
                        use.field,
                        f"{node.name}: {use.purpose} port {use.port} is inside {var} "
                        f"({reserved.start}-{reserved.stop - 1}), which HCCL binds",
                        "move the port out of the HCCL range (or move the range)",
                        "Huawei CANN: HCCL_HOST_SOCKET_PORT_RANGE / HCCL_NPU_SOCKET_PORT_RANGE",
                    )


@rule("devices", "instances on a host get disjoint devices, TP x local DP each", SEED_ASCEND)
def devices(topo: Topology) -> Iterator[Finding]:
    owners: dict[tuple[str, int], str] = {}
    for node in all_nodes(topo):
        inst = node.instance
        if profile(inst.device).visible_devices_var is None:
            continue
        need = node.device_count
        have = inst.devices if inst.devices is not None else list(range(need))
        if len(have) != need:
            yield error(
                "devices",
                (*node.path, "devices"),
                f"{node.name} needs TP {inst.tp} x local DP {node.local_size} = {need} "
                f"devices but lists {len(have)}",
                f"list exactly {need} device indices",
                f"{SEED_ASCEND} (TP 2 -> ASCEND_RT_VISIBLE_DEVICES=0,1)",
            )
        for dev in have:
            key = (host_key(node.host), dev)
            if key in owners and owners[key] != node.name:
                yield error(
                    "devices",
                    (*node.path, "devices"),
                    f"device {dev} on {node.host} is given to both {owners[key]} and {node.name}",
                    "give instances on one host disjoint `devices` lists",
                    f"{SEED_ASCEND} (prefill 0,1 and decode 2,3 on one host)",
                )
            owners.setdefault(key, node.name)


@rule("router-reach", "the router and decode reach every instance they talk to", SEED_GB200)
def router_reach(topo: Topology) -> Iterator[Finding]:
    router_local = is_loopback(topo.router.host)
    for node in all_nodes(topo):
        inst = node.instance
        if is_loopback(inst.bind) and not (router_local and is_loopback(node.host)):
            yield error(
                "router-reach",
                (*node.path, "bind"),
                f"{node.name} listens on {inst.bind} only, but the router on "
                f"{topo.router.host} connects to it over the network",
                "bind to 0.0.0.0 or to the address the router uses",
                SEED_GB200,
            )
        if is_loopback(node.host) and not router_local:
            yield error(
                "router-reach",
                (*node.path, "host"),
                f"{node.name} is addressed as {node.host}, which the router on "
                f"{topo.router.host} cannot reach",
                "use the node's network address as its host",
                SEED_GB200,
            )
    if topo.kv_connector.kind != "nixl":
        return
    decode_hosts = {host_key(n.host) for n in all_nodes(topo) if n.role == "decode"}
    for node in all_nodes(topo):
        if node.role == "prefill" and is_loopback(node.host) and decode_hosts - {"localhost"}:
            yield error(
                "router-reach",
                (*node.path, "host"),
                f"{node.name} advertises its NIXL side channel as {node.host}, which decode "
                "nodes on other hosts cannot reach",
                "use the prefill node's network address as its host",
                f"{SEED_HETERO} (VLLM_NIXL_SIDE_CHANNEL_HOST=$HOST)",
            )


@rule("host-address", "every address the router or a peer dials is a dialable address", SEED_GB200)
def host_address(topo: Topology) -> Iterator[Finding]:
    fields: list[tuple[tuple, str]] = [(("router", "host"), topo.router.host)]
    for role, i, inst in topo.instances():
        if inst.host is not None:
            fields.append(((role, i, "host"), inst.host))
        fields += [((role, i, "hosts", j), h) for j, h in enumerate(inst.hosts or [])]
        if inst.dp.master_address:
            fields.append(((role, i, "dp", "master_address"), inst.dp.master_address))
    for path, host in fields:
        if is_unspecified(host):
            yield error(
                "host-address",
                path,
                f"{host} means 'every address' to a listening socket; nobody can connect "
                "to it (the router and the NIXL side channel would be told to dial it)",
                "give the node's own address or name here; `bind:` (default 0.0.0.0) is "
                "where it listens",
                f"{SEED_GB200}; POSIX bind(2) INADDR_ANY",
            )


@rule(
    "side-channel-host",
    "the NIXL side-channel address is one every peer can dial",
    f"{SEED_GB200} (VLLM_NIXL_SIDE_CHANNEL_HOST=$(hostname -i))",
)
def side_channel_host(topo: Topology) -> Iterator[Finding]:
    """The prefill binds tcp://VLLM_NIXL_SIDE_CHANNEL_HOST:port and hands the same string to
    decode to dial (nixl/base_scheduler.py:76, 348). A host written as a name is resolved on
    the node at start (plan/node_addr.py: the script fails there if the name means loopback
    while peers are elsewhere). What cannot work once an engine runs on another machine is
    refused here: `localhost` (loopback on every node) and a loopback `hosts.<h>.address`
    (used as written)."""
    if topo.kv_connector.kind != "nixl":
        return
    machines = {host_key(n.host) for n in all_nodes(topo)}
    if len(machines) < 2:
        return
    # A loopback name (localhost) resolves to loopback on every node: its script would stop
    # at start. Where router-reach already refuses the host, once is enough.
    flagged = {f.field for f in router_reach(topo)}
    for node in all_nodes(topo):
        field: FieldPath = (
            (*node.path, "host")
            if node.instance.host is not None
            else (*node.path, "hosts", node.node_index)
        )
        if (
            resolves_on_node(topo, node.host)
            and is_loopback(node.host)
            and field not in flagged
            and (*node.path, "host") not in flagged
        ):
            yield error(
                "side-channel-host",
                field,
                f"{node.name} runs on {node.host}, which resolves to a loopback address on "
                "every machine, but engines on other machines dial its NIXL side channel "
                "(its script would stop at start)",
                "use the node's network name or address as its host",
                f"{SEED_GB200} (VLLM_NIXL_SIDE_CHANNEL_HOST=$(hostname -i)); "
                "vllm nixl/push_scheduler.py:180",
            )
    seen: set[str] = set()
    for node in all_nodes(topo):
        address = topo.settings_of(node.host).address
        key = topo.settings_key(node.host)
        if address is None or key is None or key in seen or not is_loopback(address):
            continue
        seen.add(key)
        yield error(
            "side-channel-host",
            ("hosts", key, "address"),
            f"{node.name}'s NIXL side channel would be advertised as {address}, a loopback "
            "address, but engines on other machines dial it",
            f"set hosts.{key}.address to the node's IP on the KV network, or remove it to "
            "have the node resolve its name at start",
            f"{SEED_GB200} (VLLM_NIXL_SIDE_CHANNEL_HOST=$(hostname -i)); "
            "vllm nixl/base_scheduler.py:76",
        )


def relative_path(value: str) -> bool:
    """A filesystem path relative to the current directory: `./m`, `../m`, `~/m` (never
    expanded inside a quoted argv word), or `a/b/c` (a Hugging Face id is `org/name`)."""
    if value.startswith("/"):
        return False
    return value in (".", "..") or value.startswith(("./", "../", "~")) or value.count("/") >= 2


@rule("model-path", "model paths are absolute: engines start in their work dir", "pdlaunch render")
def model_path(topo: Topology) -> Iterator[Finding]:
    """A relative path resolves against <work_dir>/<deployment> on the node, where the
    scripts `cd` (the Ascend guide's `./Qwen3-8B` meant its container's `-w /home`)."""
    fields: list[tuple[FieldPath, str]] = [(("model", "name"), topo.model.name)]
    if topo.model.tokenizer:
        fields.append((("model", "tokenizer"), topo.model.tokenizer))
    fields += [
        ((role, i, "model_path"), inst.model_path)
        for role, i, inst in topo.instances()
        if inst.model_path
    ]
    for field, value in fields:
        if relative_path(value):
            yield error(
                "model-path",
                field,
                f"{value} is a relative path, but each engine starts in its work dir "
                f"(<work_dir>/{topo.deployment}) on its node, where it would not be found",
                "give the absolute path on the nodes (the Ascend guide's ./Qwen3-8B is "
                "/home/Qwen3-8B in its container, -w /home); keep the name clients use with "
                "model.served_name",
                f"pdlaunch render (scripts cd to the work dir); {SEED_ASCEND} ('replace the "
                "model file path ./Qwen3-8B with the actual file path')",
            )


@rule("router-binary", "the router program is found where the script runs", "pdlaunch render")
def router_binary(topo: Topology) -> Iterator[Finding]:
    binary = topo.router.binary
    # A script is run as `python SCRIPT` (plan.py), so a bare script name is relative too.
    relative = ("/" in binary or binary.endswith(".py")) and not binary.startswith("/")
    if relative:
        yield error(
            "router-binary",
            ("router", "binary"),
            f"{binary} is a relative path, but the router script runs in its work dir on "
            f"{topo.router.host}, not where you run pdlaunch",
            "give an absolute path on the router host (or a program name on its PATH)",
            "pdlaunch render (scripts cd to <work_dir>/<deployment>)",
        )
