"""KV-cache geometry shared by rules and plan: resolved block sizes and layouts,
the agreed block size, and who has to post-process what. Pure functions.
"""

from __future__ import annotations

from pdlaunch import kv as kv_extension
from pdlaunch.plan import kv_path as kvpath
from pdlaunch.spec import plugins
from pdlaunch.spec.devices import profile
from pdlaunch.spec.plugins import PluginProfile
from pdlaunch.spec.topology import Instance, Role, Topology, instance_name


def block_size(inst: Instance) -> int:
    return inst.block_size or profile(inst.device).default_block_size


def kv_layout(inst: Instance) -> str:
    return inst.kv_layout or profile(inst.device).default_layout


def _needs_pinned_blocks(topo: Topology) -> bool:
    instances = [x for _, _, x in topo.instances()]
    return (
        any(x.block_size is not None for x in instances)
        or len({x.device for x in instances}) > 1
        or topo.kv_connector.agreed_block_size != "auto"
    )


def block_size_pinned(topo: Topology, inst: Instance) -> bool:
    """Whether the plan passes --block-size. vLLM picks the block size from the attention
    backend when none is given (an MLA model on Blackwell needs 32/64/128: a forced 16 leaves
    only Triton MLA, vllm/platforms/cuda.py "precluded higher-priority backend(s)"). One
    device kind with no size set: both sides pick the same backend, so nothing is forced.
    Else every instance gets its resolved size, which the rules have checked."""
    return inst.block_size is not None or topo.derived("pinned_blocks", _needs_pinned_blocks)


def _agreed(topo: Topology) -> int:
    if topo.kv_connector.agreed_block_size != "auto":
        return int(topo.kv_connector.agreed_block_size)
    return kv_extension.agreed_block_size(block_size(x) for _, _, x in topo.instances())


def agreed_block_size(topo: Topology) -> int:
    """The GCD of every prefill and decode block size, unless the user fixed it."""
    return topo.derived("agreed_block_size", _agreed)


def heterogeneous_blocks(topo: Topology) -> bool:
    return topo.derived(
        "hetero_blocks", lambda t: len({block_size(x) for _, _, x in t.instances()}) > 1
    )


def heterogeneous_devices(topo: Topology) -> bool:
    return topo.derived(
        "hetero_devices", lambda t: len({x.device for _, _, x in t.instances()}) > 1
    )


def decode_layouts(topo: Topology) -> set[str]:
    return topo.derived("decode_layouts", lambda t: {kv_layout(d) for d in t.decode})


def plugin_of(inst: Instance) -> PluginProfile | None:
    """The plugin profile the instance runs (the one it names, else its device's default)."""
    return plugins.of(inst.device, inst.plugin)


def prefill_kv(topo: Topology, inst: Instance) -> kvpath.PrefillPath:
    """What a prefill instance advertises to decode, and who converts its pages (kvpath.py:
    the plugin's own post-processing, vLLM's receive side, pdlaunch's extension, in order)."""
    size, layout = block_size(inst), kv_layout(inst)
    if topo.kv_connector.kind != "nixl":
        return kvpath.PrefillPath("none", size, layout, "Mooncake moves pages as they are", "")
    side = kvpath.PrefillSide(
        inst.device, size, layout, profile(inst.device).can_reblock, plugin_of(inst)
    )
    return kvpath.choose_prefill(side, agreed_block_size(topo), decode_layouts(topo))


def pair_paths(topo: Topology) -> list[kvpath.PairPath]:
    """One path per distinct prefill -> decode geometry (named by its first pair): what
    `validate` explains and `pdlaunch plan` shows."""

    def compute(t: Topology) -> list[kvpath.PairPath]:
        # Every pair's geometry is (prefill path, decode block, decode layout): pairing each
        # distinct prefill path (at its first prefill) with each distinct decode geometry (at
        # its first decode), in order of first appearance, names and orders the paths exactly
        # as walking all P x D pairs would, in P + D steps instead of P x D.
        paths: dict[kvpath.PrefillPath, tuple[int, Instance]] = {}
        for pi, p in enumerate(t.prefill):
            paths.setdefault(prefill_kv(t, p), (pi, p))
        geometries: dict[tuple[int, str], tuple[int, Instance]] = {}
        for di, d in enumerate(t.decode):
            geometries.setdefault((block_size(d), kv_layout(d)), (di, d))
        return [
            kvpath.choose_pair(
                instance_name("prefill", pi, p), instance_name("decode", di, d), path, size, layout
            )
            for path, (pi, p) in paths.items()
            for (size, layout), (di, d) in geometries.items()
        ]

    return topo.derived("pair_paths", compute)


def needs_permute(topo: Topology, role: Role, inst: Instance) -> bool:
    """Decode in NHD receiving HND pages permutes locally (vLLM's enable_permute_local_kv)."""
    if role != "decode" or topo.kv_connector.kind != "nixl":
        return False
    return kv_layout(inst) == "NHD" and "HND" in advertised_layouts(topo)


def advertised_layouts(topo: Topology) -> set[str]:
    return topo.derived(
        "advertised_layouts", lambda t: {prefill_kv(t, p).layout for p in t.prefill}
    )


def decode_merges(topo: Topology, inst: Instance) -> bool:
    """A decode whose block differs from some prefill's advertised block merges on receive."""
    advertised = topo.derived(
        "advertised_blocks", lambda t: {prefill_kv(t, p).block_size for p in t.prefill}
    )
    return topo.kv_connector.kind == "nixl" and advertised != {block_size(inst)}


def prefix_caching(topo: Topology, role: Role, inst: Instance) -> bool:
    if inst.prefix_caching is not None:
        return inst.prefix_caching
    # In-place re-blocking would corrupt blocks shared through the prefix cache; on decode,
    # a cache hit trims the remote id list from its end, which pairs the wrong sub-blocks
    # when blocks are merged on receive (base_worker.py:3421 _apply_prefix_caching).
    if role == "prefill":
        return not prefill_kv(topo, inst).converts
    return not decode_merges(topo, inst)
