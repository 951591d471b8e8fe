"""Every probe against pinned cases: ``tests/fixtures/check/cases/<probe>/<case>.json``.

A case names the probe and its params, pins the exact command those params render (a
command change is a visible fixture change), gives the command's output (real captures
under tests/fixtures/check/, see SOURCES.md; inline text where pdlaunch owns the format or a
derivation is spelled out) and the rows the probe must return: status, a key part of the
message, and optionally of the fix and the data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdlaunch.check.probes import PROBES, CommandOutput, ProbeContext

FX = Path(__file__).resolve().parent.parent / "fixtures" / "check"
CASES = sorted((FX / "cases").glob("*/*.json"))
BY_ID = {p.id: p for p in PROBES}


def _text(spec: Any) -> str:
    """A literal string, or pieces: strings and ``{"file": NAME, "replace": [[a, b]]}``."""
    if isinstance(spec, str):
        return spec
    out = []
    for piece in spec:
        if isinstance(piece, str):
            out.append(piece)
            continue
        text = (FX / piece["file"]).read_text()
        for old, new in piece.get("replace", []):
            assert old in text, f"{piece['file']}: {old!r} not found to replace"
            text = text.replace(old, new)
        out.append(text)
    return "".join(out)


def output_of(spec: dict[str, Any]) -> CommandOutput:
    def stream(name: str) -> str:
        if f"{name}_file" in spec:
            return (FX / spec[f"{name}_file"]).read_text()
        return _text(spec.get(name, ""))

    rc = int((FX / spec["rc_file"]).read_text()) if "rc_file" in spec else spec["rc"]
    return CommandOutput(rc, stream("stdout"), stream("stderr"))


def test_every_probe_has_a_case():
    assert CASES, "no cases found"
    covered = {path.parent.name for path in CASES}
    assert covered == set(BY_ID), (set(BY_ID) - covered, covered - set(BY_ID))


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_case(path: Path):
    case = json.loads(path.read_text())
    assert case["probe"] == path.parent.name, "a case lives under its probe's directory"
    probe = BY_ID[case["probe"]]
    params = case["params"]
    assert probe.render(params) == case["command"], "the probe's command changed"
    target = case.get("target", "h1")
    ctx = ProbeContext(target, case.get("required", True), params)
    rows = probe.judge(output_of(case["output"]), ctx)
    seen = [(r.status.value, r.message) for r in rows]
    assert [r.status.value for r in rows] == [e["status"] for e in case["expected"]], seen
    for r, e in zip(rows, case["expected"], strict=True):
        assert (r.probe, r.target) == (probe.id, target)
        assert e["message_contains"] in r.message, seen
        assert e.get("fix_contains", "") in r.fix, r.fix
        if r.status.value in ("FAIL", "WARN"):
            assert r.fix, f"{probe.id}: a {r.status.value} row must say what to do"
        data = json.loads(json.dumps(dict(r.data)))  # int keys compare as JSON has them
        assert {k: data.get(k) for k in e.get("data", {})} == e.get("data", {}), data
