"""up sizes its canary prompt from the prefill block sizes it launches (launch/canary.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from pdlaunch.plan.build import build_plan
from pdlaunch.runtime.lifecycle.canary import max_prefill_block
from pdlaunch.spec.load import load

LOCAL_CPU = Path(__file__).resolve().parents[2] / "topologies" / "local-cpu.yaml"


def test_canary_spans_the_largest_prefill_block(tmp_path: Path) -> None:
    assert max_prefill_block(build_plan(load(LOCAL_CPU)[0])) == 32
    data = yaml.safe_load(LOCAL_CPU.read_text())
    data["model"]["dtype"] = "float32"
    data["prefill"][0]["block_size"] = 128
    data["decode"][0]["block_size"] = 64
    topo = tmp_path / "reblock.yaml"
    topo.write_text(yaml.safe_dump(data))
    assert max_prefill_block(build_plan(load(topo)[0])) == 128
