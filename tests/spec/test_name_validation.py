"""Issue 26: names are validated with full-match semantics. `re.match("...$")` let a trailing
newline through (`$` matches before one): `deployment: "x\\n"` broke the Kubernetes export, an
instance `pre\\n` rendered a file `pre\\n.sh`, an env key `FOO\\n` a broken `export` line. Each
is refused by `validate` with a message naming the field, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.backends.k8s.files import write_manifests
from pdlaunch.cli import app
from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import LoadError, load_text

ROOT = Path(__file__).resolve().parents[2]


def _data() -> dict:
    return yaml.safe_load((ROOT / "topologies" / "local-cpu.yaml").read_text())


def _with(path: tuple, value) -> dict:
    data = _data()
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


# case: (path, value with the newline, where the message points, value without it)
CASES = {
    "deployment": (("deployment",), "x\n", "deployment", "x"),
    "instance name": (("prefill", 0, "name"), "pre\n", "prefill[0].name", "pre"),
    "env key": (("defaults", "env"), {"FOO\n": "1"}, "defaults.env", {"FOO": "1"}),
    "host env key": (
        ("hosts",),
        {"127.0.0.1": {"env": {"BAR\n": "1"}}},
        "hosts",
        {"127.0.0.1": {"env": {"BAR": "1"}}},
    ),
    "host": (("decode", 0, "host"), "127.0.0.1\n", "decode[0].host", "127.0.0.1"),
    "hosts key": (
        ("hosts",),
        {"127.0.0.1\n": {"local": True}},
        "hosts",
        {"127.0.0.1": {"local": True}},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_trailing_newline_is_refused(case: str, tmp_path: Path):
    path, value, where, _ = CASES[case]
    text = yaml.safe_dump(_with(path, value), sort_keys=False)
    with pytest.raises(LoadError) as exc:
        load_text(text, "t.yaml")
    assert where in str(exc.value), str(exc.value)
    f = tmp_path / "t.yaml"
    f.write_text(text)
    res = CliRunner().invoke(app, ["validate", str(f)])
    assert res.exit_code == 2, res.output
    assert where in res.output and "Traceback" not in res.output


def test_the_same_names_without_the_newline_pass():
    for path, _, _, fixed in CASES.values():
        load_text(yaml.safe_dump(_with(path, fixed), sort_keys=False), "t.yaml")


def test_k8s_export_never_writes_yaml_that_does_not_parse(tmp_path: Path):
    """A plan that bypassed validation (the API) with a newline in its deployment name: the
    header comment it is written into must not spill into YAML."""
    data = _data()
    data["router"]["kind"] = "vllm-router"
    topo, _ = load_text(yaml.safe_dump(data, sort_keys=False), "t.yaml")
    plan = build_plan(topo).model_copy(update={"deployment": "x\n.: ["})
    written = write_manifests(plan, tmp_path, "lws", image="img:1")
    for p in written:
        if p.suffix == ".yaml":
            obj = yaml.safe_load(p.read_text())
            assert obj["kind"] and obj["metadata"]["name"], p
            assert "\n" not in p.name
