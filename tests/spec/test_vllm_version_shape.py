"""Issue 32, class 8: `vllm_version` is a release string, never a file name. The facts were
looked up as ``vllm-<series>.json`` with whatever the topology said, so ``router-0.1.17``
loaded the router's facts as a vLLM release's (misleading flag errors), and ``0.`` followed
by 5,000 digits gave a ValueError traceback (int() of more than 4,300 digits). The schema
now takes only the documented shape (README: 0.32, 0.10.2, 0.10.2rc2.dev1+gf21f5ea), bounded,
and refuses anything else in one line that names the field, its line and the releases
pdlaunch has facts for."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app
from pdlaunch.rules import validate
from pdlaunch.spec import facts
from pdlaunch.spec.load import LoadError, load_text

ROOT = Path(__file__).resolve().parents[2]

BAD = {
    "the router's facts file": "router-0.1.17",
    "5,000 digits": "0." + "9" * 5000,
    "a path": "../vllm-0.32",
    "a tag": "v0.32",
    "one number": "0",
    "trailing space": "0.32 ",
    "newline": "0.32\n",
    "a word after": "0.32-latest",
    "an over-long local part": "0.32+" + "a" * 80,
}
GOOD = ["0.32", "0.13.0", "0.10.2rc2", "0.11.0.post1", "0.10.2rc2.dev1+gf21f5ea", "0.12.0+cpu"]


def _data(**where: str) -> dict:
    data = yaml.safe_load((ROOT / "topologies" / "local-cpu.yaml").read_text())
    if "model" in where:
        data["model"]["vllm_version"] = where["model"]
    if "decode" in where:
        data["decode"][0]["vllm_version"] = where["decode"]
    return data


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("field", ["model", "decode"])
def test_a_value_not_shaped_as_a_release_is_refused_by_the_schema(case: str, field: str):
    text = yaml.safe_dump(_data(**{field: BAD[case]}), sort_keys=False)
    with pytest.raises(LoadError) as exc:
        load_text(text, "t.yaml")
    [problem] = exc.value.problems
    where = "model.vllm_version" if field == "model" else "decode[0].vllm_version"
    assert problem.where().startswith("t.yaml:") and problem.where().endswith(where)
    message = problem.message
    assert "\n" not in message and len(message) < 400, message
    assert "0.10, 0.11" in message and "0.33" in message  # the releases pdlaunch has
    assert "router" not in message.replace(repr(BAD[case])[:40], "")


@pytest.mark.parametrize("value", GOOD)
def test_the_documented_shapes_load(value: str):
    load_text(yaml.safe_dump(_data(model=value, decode=value), sort_keys=False), "t.yaml")


def test_a_release_of_the_right_shape_without_facts_is_still_the_rule_s_finding():
    topo, source = load_text(yaml.safe_dump(_data(decode="0.9.2"), sort_keys=False), "t.yaml")
    found = [f for f in validate(topo, source) if f.severity == "error"]
    assert [(f.rule, f.field) for f in found] == [("vllm-version", ("decode", 0, "vllm_version"))]


@pytest.mark.parametrize("case", list(BAD))
def test_validate_answers_in_one_line_never_a_traceback(case: str, tmp_path: Path):
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump(_data(model=BAD[case]), sort_keys=False))
    res = CliRunner().invoke(app, ["validate", str(f)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    lines = [line for line in res.output.splitlines() if "vllm_version" in line]
    assert len(lines) == 1 and "pdlaunch has facts for" in lines[0], res.output


@pytest.mark.parametrize("case", list(BAD))
def test_the_facts_never_read_another_file_nor_raise_anything_but_key_error(case: str):
    """Defence in depth for callers that bypass the schema (the API, model_construct)."""
    with pytest.raises(KeyError):
        facts.vllm(BAD[case])


def test_the_router_facts_stay_the_router_s():
    assert facts.router().tool != facts.vllm("0.32").tool
