"""docs/doctor.md is generated from the signature table and the checks: it lists every
signature with its source, and stays equal to the generator's output."""

from __future__ import annotations

from pathlib import Path

from pdlaunch.doctor import CHECKS, signatures
from pdlaunch.doctor.docs import render_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"


def test_docs_match_the_table():
    assert DOC.read_text() == render_markdown(), (
        "docs/doctor.md is stale: .venv/bin/python -m pdlaunch.doctor.docs > docs/doctor.md"
    )


def test_docs_list_every_signature_and_check_with_its_source():
    text = render_markdown()
    for s in signatures():
        assert f"### `{s.id}`" in text and f"- **source**: {s.source}" in text
    for c in CHECKS:
        assert f"| `{c.id}` |" in text
