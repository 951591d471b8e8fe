"""The shipped examples' text, as tests need it changed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_ACCEPTED = re.compile(r"^accepted_warnings:\n(?:[ \t]+.*\n)*", re.M)


def without_accepted(text: str) -> str:
    """The topology text less its `accepted_warnings:` block, so its warnings print again."""
    out, n = _ACCEPTED.subn("", text)
    assert n == 1, "no accepted_warnings: block to remove"
    return out


def local_cpu_warning_text() -> str:
    """topologies/local-cpu.yaml without its accepted warning (cpu-budget then fires)."""
    return without_accepted((ROOT / "topologies" / "local-cpu.yaml").read_text())
