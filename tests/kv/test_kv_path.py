"""Who converts KV pages between prefill and decode (pdlaunch/plan/kv_path.py): native first.

Pure decisions over geometry and the plugin profiles shipped in pdlaunch/spec/facts/plugins/
(generated from vllm-gaudi's source at each ref by scripts/gen_plugin_profiles.py).
"""

from __future__ import annotations

import pytest

from pdlaunch.plan.kv_path import PrefillSide, choose_pair, choose_prefill
from pdlaunch.spec import plugins

GUIDE_PIN = plugins.get("vllm-gaudi@e269485")
HETERO = plugins.get("vllm-gaudi@v0.15.1")
NO_HETERO = plugins.get("vllm-gaudi@v0.13.0")


def gaudi(plugin, block=128, layout="NHD"):
    return PrefillSide("hpu", block, layout, can_reblock=False, plugin=plugin)


def cuda(block=64, layout="NHD"):
    return PrefillSide("cuda", block, layout, can_reblock=True, plugin=None)


def test_no_conversion_when_decode_reads_pages_as_they_are():
    # decode 256 NHD from prefill 128 NHD: a multiple, same layout -> nothing on prefill.
    path = choose_prefill(gaudi(HETERO), agreed=128, decode_layouts={"NHD"})
    assert path.kind == "none" and (path.block_size, path.layout) == (128, "NHD")
    pair = choose_pair("p", "d", path, 256, "NHD")
    assert pair.kind == "vllm" and "merges 2 remote blocks" in pair.why


def test_plugin_converts_before_the_extension_is_considered():
    path = choose_prefill(gaudi(HETERO), agreed=16, decode_layouts={"HND"})
    assert path.kind == "plugin" and path.plugin_id == "vllm-gaudi@v0.15.1"
    assert (path.block_size, path.layout) == (16, "HND")
    assert path.post is not None and path.post.env == {"VLLM_HPU_HETERO_KV_LAYOUT": "true"}
    assert "hetero_hpu_nixl_connector.py:" in path.source
    # Even on a device the extension could handle, a plugin that converts wins.
    native_first = PrefillSide("hpu", 128, "NHD", can_reblock=True, plugin=HETERO)
    assert choose_prefill(native_first, 16, {"HND"}).kind == "plugin"


def test_plugin_saves_hnd_even_for_nhd_decodes():
    # hetero_hpu_nixl_connector: kv_cache_layout_on_save = "HND" (always).
    path = choose_prefill(gaudi(HETERO), agreed=16, decode_layouts={"NHD"})
    assert (path.kind, path.layout) == ("plugin", "HND")
    assert choose_pair("p", "d", path, 16, "NHD").kind == "plugin"


def test_guide_pin_converts_on_pr30448_vllm_and_says_so():
    path = choose_prefill(gaudi(GUIDE_PIN), agreed=16, decode_layouts={"HND"})
    assert path.kind == "plugin" and path.post is not None
    assert path.post.env == {}  # e269485 has no hetero module to switch on
    assert "PR 30448" in path.why


def test_gaudi_without_native_conversion_is_refused_not_extended():
    path = choose_prefill(gaudi(NO_HETERO), agreed=16, decode_layouts={"HND"})
    assert path.kind == "refused"
    # The message names each option and why it does not apply.
    assert "vllm-gaudi@v0.13.0 offers no prefill-side post-processing" in path.why
    assert "receive only" in path.why
    assert "(num_blocks * block_size, num_kv_heads, head_size)" in path.why
    assert "hpu_paged_attn.py:" in path.source


def test_cuda_uses_the_extension_with_alias_mode_for_nhd_decodes():
    path = choose_prefill(cuda(), agreed=16, decode_layouts={"HND"})
    assert (path.kind, path.block_size, path.layout) == ("extension", 16, "HND")
    alias = choose_prefill(cuda(), agreed=16, decode_layouts={"NHD"})
    assert (alias.kind, alias.layout) == ("extension", "NHD")


def test_cpu_cache_is_refused():
    cpu = PrefillSide("cpu", 128, "HND", can_reblock=False, plugin=None)
    path = choose_prefill(cpu, agreed=64, decode_layouts={"HND"})
    assert path.kind == "refused" and "no plugin serves cpu" in path.why


@pytest.mark.parametrize(
    ("d_block", "d_layout", "kind", "words"),
    [
        (16, "HND", "none", "no conversion"),
        (64, "HND", "vllm", "merges 4 remote blocks"),
        (16, "NHD", "vllm", "permutes HND into NHD"),
        (24, "HND", "refused", "multiple"),
    ],
)
def test_pair_receive_side(d_block, d_layout, kind, words):
    path = choose_prefill(cuda(16, "HND"), agreed=16, decode_layouts={"HND"})
    assert path.kind == "none"
    pair = choose_pair("p", "d", path, d_block, d_layout)
    assert pair.kind == kind and words in pair.why


def test_nhd_pages_into_hnd_decode_cannot_be_done_on_receive():
    path = choose_prefill(cuda(16, "NHD"), agreed=16, decode_layouts={"NHD"})
    assert choose_pair("p", "d", path, 16, "HND").kind == "refused"
