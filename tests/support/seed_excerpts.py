"""The seed guides' command blocks, copied verbatim into tests/fixtures/seeds/ (a clone has
no seed guides beside it, so the tests read only these copies): each fixture is a header line
naming its guide and sha256, then excerpts "=== NAME: lines A-B, section ... ===" holding the
guide's lines A to B unchanged."""

from __future__ import annotations

import functools
import re
from pathlib import Path

SEEDS = Path(__file__).resolve().parents[1] / "fixtures" / "seeds"

_EXCERPT = re.compile(r"^=== (\S+): lines (\d+)-(\d+), section .+ ===$", re.M)


@functools.cache
def excerpts(guide: str) -> dict[str, str]:
    """The named excerpts of a seed guide's fixture: {name: the guide's lines, verbatim}."""
    text = (SEEDS / guide).with_suffix(".txt").read_text(encoding="utf-8")
    header = text.partition("\n")[0]
    assert header.startswith(f"source: shared/seeds/{guide} "), header
    marks = list(_EXCERPT.finditer(text))
    out: dict[str, str] = {}
    for mark, end in zip(marks, [m.start() for m in marks[1:]] + [len(text)], strict=True):
        name, first, last = mark[1], int(mark[2]), int(mark[3])
        body = text[mark.end() + 1 : end]
        assert name not in out, f"{guide}: excerpt {name} twice"
        assert body.count("\n") == last - first + 1 and body.endswith("\n"), (
            f"{guide}: excerpt {name} does not hold lines {first}-{last}"
        )
        out[name] = body
    return out
