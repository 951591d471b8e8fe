"""`accepted_warnings:` lets a topology say which warnings it has on purpose, with the reason:
they leave the warning count and are listed as accepted. An error is never accepted, an id no
rule has is an error, and an accepted warning that no longer fires is a warning itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdlaunch.rules import judge, validate
from pdlaunch.spec.load import LoadError, load_text

ROOT = Path(__file__).resolve().parents[2]
LOCAL = (ROOT / "topologies" / "local-cpu.yaml").read_text()
BASE = LOCAL.split("accepted_warnings:")[0] + "router:" + LOCAL.split("\nrouter:", 1)[1]


def loaded(text: str):
    return load_text(text, "t.yaml")


def with_accepted(block: str, text: str = BASE) -> str:
    return text.replace("\nrouter:", f"\naccepted_warnings:\n{block}\nrouter:", 1)


def test_the_base_example_has_the_cpu_budget_warning_to_accept():
    topo, source = loaded(BASE)
    assert [f.rule for f in validate(topo, source)] == ["cpu-budget"]


def test_an_accepted_warning_leaves_the_findings_with_its_reason():
    topo, source = loaded(with_accepted("  cpu-budget: one host on purpose"))
    result = judge(topo, source)
    assert result.findings == []
    assert [(f.rule, why) for f, why in result.accepted] == [("cpu-budget", "one host on purpose")]
    assert validate(topo, source) == []


def test_an_unknown_rule_id_is_an_error_on_its_line():
    text = with_accepted("  cpu-budget: one host\n  cpu-budjet: typo")
    topo, source = loaded(text)
    findings = validate(topo, source)
    assert [(f.rule, f.severity) for f in findings] == [("accepted-warnings", "error")]
    assert "cpu-budjet" in findings[0].message
    assert text.splitlines()[findings[0].line - 1].strip().startswith("cpu-budjet")


def test_an_accepted_warning_that_no_longer_fires_is_a_warning():
    topo, source = loaded(with_accepted("  cpu-budget: one host\n  kv-lease-budget: stale"))
    findings = validate(topo, source)
    assert [(f.rule, f.severity) for f in findings] == [("accepted-warnings", "warning")]
    assert "kv-lease-budget is accepted but gives no warning" in findings[0].message


def test_an_error_is_never_accepted():
    clash = BASE.replace("port: 8200", "port: 8100", 1)
    topo, source = loaded(with_accepted("  port-conflict: on purpose", clash))
    result = judge(topo, source)
    assert [(f.rule, f.severity) for f in result.findings][:1] == [("port-conflict", "error")]
    assert result.accepted == []


@pytest.mark.parametrize(
    "block, what",
    [
        ("  cpu-budget: ''", "at least 1 character"),
        ("  cpu-budget: " + "x" * 501, "at most 500 characters"),
        ("  Cpu_Budget: why", "pattern"),
        ("  cpu-budget: [a, b]", "valid string"),
    ],
)
def test_hostile_entries_are_refused_by_the_schema(block, what):
    with pytest.raises(LoadError) as exc:
        loaded(with_accepted(block))
    assert any(what in p.message for p in exc.value.problems), exc.value.problems


def test_validate_counts_accepted_apart_and_lists_them(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(with_accepted("  cpu-budget: one host on purpose"))
    run = [sys.executable, "-m", "pdlaunch", "validate", str(path)]
    res = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "0 warning(s), 1 accepted" in res.stdout
    assert "accepted [cpu-budget] hosts.127.0.0.1.cpus: one host on purpose" in res.stdout
    assert "[cpu-budget]" not in res.stderr
    res = subprocess.run([*run, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    data = json.loads(res.stdout)
    assert data["findings"] == []
    assert [(a["rule"], a["reason"]) for a in data["accepted"]] == [
        ("cpu-budget", "one host on purpose")
    ]


def test_every_shipped_example_validates_with_no_warning():
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        topo, source = load_text(path.read_text(), str(path))
        assert validate(topo, source) == [], path.name
