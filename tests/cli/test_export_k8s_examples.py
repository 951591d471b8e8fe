"""`pdlaunch export k8s` (and `validate --backend k8s`) on every shipped example, as a user
types it: no option but the output directory. Examples behind a fixed-list proxy export as
LeaderWorkerSets, the others as a DisaggregatedSet (pdlaunch/backends/k8s/manifests.py
default_target)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdlaunch.cli import app

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "topologies").glob("*.yaml"))
PROXIED = {"ascend-mooncake-tp2", "cuda-prefill-gaudi-decode", "gaudi-prefill-cuda-decode"}
runner = CliRunner()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_example_exports(path: Path, tmp_path: Path):
    target = "lws" if path.stem in PROXIED else "disaggregatedset"
    res = runner.invoke(app, ["export", "k8s", str(path), "-o", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert f"({target})" in res.output
    assert len(list((tmp_path / "o").glob("*.yaml"))) >= 4
    res = runner.invoke(app, ["validate", str(path), "--backend", "k8s", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["target"] == target


def test_the_proxied_examples_refuse_a_disaggregatedset_in_one_line(tmp_path: Path):
    path = ROOT / "topologies" / "gaudi-prefill-cuda-decode.yaml"
    argv = ["export", "k8s", str(path), "-o", str(tmp_path / "o")]
    res = runner.invoke(app, [*argv, "--k8s-target", "disaggregatedset"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "--k8s-target lws" in res.output
    assert not (tmp_path / "o").exists()
