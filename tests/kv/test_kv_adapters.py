"""The per-backend cache adapters the connector's worker delegates to (torch only): which
adapter an engine's cache gets, which caches are re-blocked, and what each refuses."""

from __future__ import annotations

import pytest
import torch

from pdlaunch.kv import adapters


def test_paged_backends_get_the_paged_adapter_whatever_the_cache_dtype():
    assert adapters.adapter_for_engine("FLASH_ATTN", None, "fp8", "LBNHC") is adapters.PAGED
    assert adapters.adapter_for_engine("CPU_ATTN", "vec16", "auto", "LBHNC") is adapters.CPU


@pytest.mark.parametrize(
    ("isa", "dtype", "layout", "why"),
    [
        ("amx", "auto", "LBHNC", "not proven"),
        ("vec", "fp8", "LBHNC", "--kv-cache-dtype fp8"),
        ("vec", "auto", "LBNHC", "only uses LBHNC"),
    ],
)
def test_cpu_attention_refusals(isa, dtype, layout, why):
    with pytest.raises(ValueError, match=why):
        adapters.adapter_for_engine("CPU_ATTN", isa, dtype, layout)


def test_caches_to_reblock_dedupes_aliases_and_checks_each_layer():
    a, b = torch.zeros(4, 2, 16, 8), torch.zeros(4, 2, 16, 8)
    got = adapters.caches_to_reblock({"l1": b, "l0": a, "l0_alias": a}, 16, adapters.PAGED)
    assert len(got) == 2 and got[0] is a and got[1] is b  # sorted by layer name, once each
    with pytest.raises(ValueError, match=r"layer l0: expected a \[blocks, heads, 32, C\]"):
        adapters.caches_to_reblock({"l0": a}, 32, adapters.PAGED)
    odd = torch.zeros(4, 2, 16, 7)
    assert adapters.caches_to_reblock({"l0": odd}, 16, adapters.PAGED) == [odd]
    with pytest.raises(ValueError, match="2\\*head_size"):
        adapters.caches_to_reblock({"l0": odd}, 16, adapters.CPU)
    with pytest.raises(ValueError, match="not dense"):
        adapters.caches_to_reblock({"l0": torch.zeros(4, 2, 16, 16)[..., :8]}, 16, adapters.PAGED)


def test_alias_mode_moves_nothing_and_says_so():
    nhd = adapters.Geometry(128, 16, 2, "NHD", "NHD")
    hnd = adapters.Geometry(128, 16, 2, "NHD", "HND")
    assert not adapters.PAGED.moves(nhd) and adapters.PAGED.moves(hnd)
    assert adapters.PAGED.describe(nhd).endswith("(alias mode, no data movement)")
    assert (
        adapters.PAGED.describe(hnd)
        == "prefill block 128 NHD re-blocked to 8×16-token HND sub-blocks"
    )
    assert adapters.CPU.moves(adapters.Geometry(128, 64, 2, "HND", "HND"))
