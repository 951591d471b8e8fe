"""The `block-direction` rule: decode's block must be a multiple of the block prefill
advertises (vLLM's utils.py:516 'Local block size ... is not divisible').

What prefill advertises is its own block, or, where pdlaunch's KV extension re-blocks
on prefill, the agreed block size. With `agreed_block_size: auto` (the GCD of every block
size) both divide every decode block, so the rule can only fire when the topology fixes
`kv_connector.agreed_block_size` to a size that does not divide decode's block. That same
size then also breaks `agreed-block-size` (the agreed size must divide every block size),
so the two rules fire together; the tests pin that as well.
"""

from __future__ import annotations

import pytest

from pdlaunch.rules import validate
from pdlaunch.spec.load import load_text

# CUDA on both sides (block sizes: multiples of 16), NIXL, both in the default HND layout.
TOPOLOGY = """\
deployment: block-direction
model:
  name: m
prefill:
  - host: 10.0.0.1
    device: cuda
    port: 8100
    block_size: {prefill_block}
decode:
  - host: 10.0.0.2
    device: cuda
    port: 8200
    block_size: 48
kv_connector:
  kind: nixl
  agreed_block_size: {agreed}
router:
  host: 10.0.0.3
"""
DECODE_BLOCK_LINE = TOPOLOGY.splitlines().index("    block_size: 48") + 1


def errors(prefill_block: int, agreed: int | str):
    text = TOPOLOGY.format(prefill_block=prefill_block, agreed=agreed)
    topo, source = load_text(text, "bd.yaml")
    return [f for f in validate(topo, source) if f.severity == "error"]


@pytest.mark.parametrize(
    ("prefill_block", "advertised"),
    [
        # prefill 64 > agreed 32: the extension re-blocks prefill to 32 and advertises 32
        (64, 32),
        # prefill 32 == agreed 32: no re-blocking, prefill advertises its own 32
        (32, 32),
    ],
)
def test_decode_block_not_a_multiple_of_the_advertised_block(prefill_block, advertised):
    found = errors(prefill_block, agreed=32)
    hits = [f for f in found if f.rule == "block-direction"]
    assert len(hits) == 1, found
    f = hits[0]
    assert f.field == ("decode", 0, "block_size")
    assert f.file == "bd.yaml" and f.line == DECODE_BLOCK_LINE
    assert f"decode-0 block 48 is not a multiple of the block {advertised} that prefill-0" in (
        f.message
    )
    assert f.fix and f.source
    # 32 does not divide 48 either: agreed-block-size names the fixed agreed size. Where
    # prefill does not re-block (32 == 32), nothing reads the fixed size: version-render says so.
    idle = {"version-render"} if prefill_block == advertised else set()
    assert {x.rule for x in found} == {"block-direction", "agreed-block-size"} | idle
    assert {x.field for x in found if x.rule == "agreed-block-size"} == {
        ("kv_connector", "agreed_block_size")
    }


@pytest.mark.parametrize("prefill_block", [64, 32])
@pytest.mark.parametrize("agreed", [16, "auto"])
def test_agreed_size_that_divides_decode_is_valid(prefill_block, agreed):
    # The same topologies with an agreed size of 16, fixed or `auto` (the GCD of 64 or 32
    # and 48): prefill is re-blocked to 16 and advertises 16, which divides decode's 48.
    assert errors(prefill_block, agreed) == []
