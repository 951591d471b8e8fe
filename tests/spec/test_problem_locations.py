"""A problem `load` reports and a finding a rule reports point at a field the same way
(`file:line field`), so a user reads them alike."""

from __future__ import annotations

import pytest

from pdlaunch.rules import validate
from pdlaunch.rules.base import Finding
from pdlaunch.spec.load import LoadError, Problem, dotted, load_text, where


@pytest.mark.parametrize(
    ("file", "line", "field", "expected"),
    [
        ("t.yaml", 3, ("prefill", 0, "port"), "t.yaml:3 prefill[0].port"),
        ("t.yaml", None, ("router",), "t.yaml router"),
        ("t.yaml", 7, (), "t.yaml:7"),
        ("t.yaml", None, (), "t.yaml"),
    ],
)
def test_problems_and_findings_point_the_same_way(file, line, field, expected):
    assert where(file, line, dotted(field)) == expected
    assert Problem(file, line, dotted(field), "m").where() == expected
    finding = Finding("r", "error", field, "m", "f", "s", file=file, line=line)
    assert finding.where == expected


def test_load_problem_and_rule_finding_on_one_field_read_alike():
    text = (
        "deployment: t\nmodel: {name: m}\n"
        "prefill: [{host: a, device: cuda, port: 8100}]\n"
        "decode: [{host: a, device: cuda, port: 8100, devices: [1]}]\n"
        "router: {host: r}\n"
    )
    topo, source = load_text(text, "t.yaml")
    finding = next(f for f in validate(topo, source) if f.rule == "port-conflict")
    with pytest.raises(LoadError) as info:
        load_text(text.replace("port: 8100, devices", "port: 0, devices"), "t.yaml")
    (problem,) = info.value.problems
    assert finding.where == problem.where() == "t.yaml:4 decode[0].port"
