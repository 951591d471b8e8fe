"""Plugin profiles (pdlaunch/spec/facts/plugins/*.json, pdlaunch/spec/plugins.py): loaded,
cited, picked per instance, and rendered: the guides' builds get the connectors that exist in them.

The JSON is generated from each plugin's source at its ref by scripts/gen_plugin_profiles.py
(the mirrors are not available in CI; `--check` against them is documented in the README).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdlaunch.cli import app
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec import plugins
from pdlaunch.spec.load import LoadError, load, load_text

ROOT = Path(__file__).resolve().parents[2]
CITE = re.compile(r"[\w./-]+\.(py|md):\d+(,\d+)*")


def test_every_profile_loads_and_the_defaults_exist():
    profs = plugins.profiles()
    assert set(plugins.profile_ids()) == {p.stem for p in plugins.HERE.glob("*@*.json")}
    for device in ("hpu", "npu"):
        pid = plugins.default_for(device)
        assert pid in profs and profs[pid].device == device
    assert plugins.default_for("cuda") is None


@pytest.mark.parametrize("pid", plugins.profile_ids())
def test_every_fact_cites_file_and_line(pid):
    p = plugins.get(pid)
    for c in p.connectors:
        assert CITE.search(c.source), c
        # A connector the plugin defines lives in a module of that build.
        assert c.module is None or c.module in p.modules, c
    assert CITE.fullmatch(p.kv_cache_source)
    for post in p.post_processing:
        assert CITE.search(post.source), post
    assert p.env and all(CITE.fullmatch(where) for where in p.env.values())


def test_gaudi_profiles_follow_the_source_history():
    hetero = "vllm_gaudi.distributed.kv_transfer.kv_connector.v1.hetero_hpu_nixl_connector"
    # The guide's pin and v0.13.0 predate PR 867 (first in v0.15.1).
    for pid in ("vllm-gaudi@e269485", "vllm-gaudi@v0.13.0"):
        assert hetero not in plugins.get(pid).modules
    for pid in ("vllm-gaudi@v0.15.1", "vllm-gaudi@v0.26.0"):
        p = plugins.get(pid)
        assert hetero in p.modules
        post = p.prefill_postprocess()
        assert post is not None and "VLLM_HPU_HETERO_KV_LAYOUT" in post.env
        assert "VLLM_HPU_HETERO_KV_LAYOUT" in p.env
    assert plugins.get("vllm-gaudi@v0.13.0").prefill_postprocess() is None
    assert not any(p.extension_ok for p in plugins.profiles().values())


def test_ascend_profiles_place_the_mooncake_connector_where_each_build_has_it():
    old, new = plugins.get("vllm-ascend@2025-09"), plugins.get("vllm-ascend@0.23.0.post1")
    assert old.connector("MooncakeConnectorV1").module == (
        "vllm_ascend.distributed.mooncake_connector"
    )
    assert "vllm_ascend.distributed.mooncake_connector" in old.modules
    assert "vllm_ascend.distributed.mooncake_connector" not in new.modules
    assert new.connector("MooncakeConnectorV1").module in new.modules
    assert old.connector("MooncakeConnectorV1").module_path
    assert not new.connector("MooncakeConnectorV1").module_path


def _kv(proc) -> dict:
    return json.loads(proc.argv[proc.argv.index("--kv-transfer-config") + 1])


def test_ascend_example_on_the_guides_build_imports_a_module_that_exists_there():
    topo, source = load(ROOT / "topologies" / "ascend-mooncake-tp2.yaml")
    assert not has_errors(validate(topo, source))
    plan = build_plan(topo)
    build = plugins.get("vllm-ascend@2025-09")
    for proc in plan.by_role("prefill") + plan.by_role("decode"):
        assert proc.plugin == "vllm-ascend@2025-09"
        cfg = _kv(proc)
        assert cfg["kv_connector"] == "MooncakeConnectorV1"
        assert cfg["kv_connector_module_path"] == "vllm_ascend.distributed.mooncake_connector"
        assert cfg["kv_connector_module_path"] in build.modules
        assert set(cfg["kv_connector_extra_config"]) == {"prefill", "decode"}


def test_ascend_example_on_the_newest_release_relies_on_its_registry():
    text = (ROOT / "topologies" / "ascend-mooncake-tp2.yaml").read_text()
    newest = text.replace("plugin: vllm-ascend@2025-09", "plugin: vllm-ascend@0.23.0.post1")
    assert newest != text
    plan = build_plan(load_text(newest, "a.yaml")[0])
    cfg = _kv(plan.by_role("prefill")[0])
    assert "kv_connector_module_path" not in cfg
    assert plugins.get("vllm-ascend@0.23.0.post1").connector(cfg["kv_connector"]) is not None


GAUDI = """\
deployment: t
model: {name: m}
prefill:
  - host: a
    device: %s
    plugin: %s
decode: [{host: b, device: cuda}]
router: {host: c}
"""


def test_unknown_profile_is_refused_with_the_known_ones_and_its_line():
    with pytest.raises(LoadError) as info:
        load_text(GAUDI % ("hpu", "vllm-gaudi@v9.9"), "t.yaml")
    (problem,) = info.value.problems
    where = problem.where()
    assert where.startswith("t.yaml:6"), where
    for pid in plugins.profile_ids():
        assert pid in problem.message


def test_profile_of_another_device_is_refused():
    with pytest.raises(LoadError) as info:
        load_text(GAUDI % ("cuda", "vllm-gaudi@e269485"), "t.yaml")
    assert "runs on hpu, not cuda" in str(info.value.problems[0].message)


REFUSED = """\
deployment: t
model: {name: m}
prefill:
  - host: a
    device: hpu
    plugin: vllm-gaudi@v0.13.0
    block_size: 128
decode: [{host: b, device: cuda, block_size: 16}]
router: {host: c}
"""


def test_validate_refuses_a_pair_nothing_can_convert(tmp_path):
    topo, source = load_text(REFUSED, "t.yaml")
    found = [f for f in validate(topo, source) if f.rule == "prefill-postprocess"]
    assert [f.field for f in found] == [("prefill", 0, "plugin")]
    assert found[0].line == 6
    assert "vllm-gaudi@v0.15.1" in found[0].fix  # a release that converts natively
    path = tmp_path / "t.yaml"
    path.write_text(REFUSED)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_validate_and_plan_explain_the_path_per_pair(tmp_path):
    example = str(ROOT / "topologies" / "gaudi-prefill-cuda-decode.yaml")
    runner = CliRunner()
    text = runner.invoke(app, ["validate", example]).output
    assert "KV prefill-0 -> decode-0: plugin (native)" in text
    data = json.loads(runner.invoke(app, ["validate", example, "--json"]).output)
    assert [p["path"] for p in data["kv_paths"]] == ["plugin"]
    case1 = str(ROOT / "topologies" / "cuda-prefill-gaudi-decode.yaml")
    shown = runner.invoke(app, ["plan", case1]).output
    assert "KV prefill-0 -> decode-0: vLLM receive side" in shown
    assert "(vllm-gaudi@e269485)" in shown
