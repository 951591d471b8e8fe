"""The canary over every prefill → decode pair, at `up` and as `pdlaunch canary`, on a 2
prefills x 2 decodes deployment of the fake engine and router (tests/support/fake_vllm.py,
fake_router.py) on the control host: real processes, real HTTP on loopback."""

from __future__ import annotations

import json

from pdlaunch.runtime.record_store import load_state
from tests.support.deployments import cli
from tests.support.processes import wait_no_procs
from tests.support.sshd import free_port

PAIRS = {
    "prefill-0 → decode-0",
    "prefill-0 → decode-1",
    "prefill-1 → decode-0",
    "prefill-1 → decode-1",
}


def two_by_two(make_deployment, name: str, decode_1_env: dict | None = None):
    dep = make_deployment(name)
    for role in ("prefill", "decode"):
        second = dict(dep.spec[role][0], port=free_port(), env={})
        dep.spec[role].append(second)
    if decode_1_env:
        dep.spec["decode"][1]["env"] = decode_1_env
    dep.write()
    return dep


def test_up_proves_all_four_pairs_and_canary_command_agrees(make_deployment):
    dep = two_by_two(make_deployment, "pairs")
    res = cli("up", dep.path, "--timeout", "120", "--json")
    assert res.exit_code == 0, res.output
    canary = json.loads(res.stdout)["canary"]
    assert canary["ok"], canary
    # the router check's fields are kept where they were; the pairs come beside them
    assert canary["decode_external_kv_transfer_tokens"] > 0
    assert canary["router"]["ok"]
    pairs = {p["pair"]: p for p in canary["pairs"]}
    assert set(pairs) == PAIRS
    for p in pairs.values():  # each decode's own counters moved for its pair
        assert p["ok"] and p["decode_external_kv_transfer_tokens"] >= p["prompt_tokens"] - 1, p
    assert "all 4 prefill → decode pair(s)" in canary["message"]

    res = cli("canary", dep.path, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["ok"] and {p["pair"] for p in data["pairs"] if p["ok"]} == PAIRS
    assert data["router"]["ok"]
    res = cli("canary", "pairs")  # by deployment name, for a person
    assert res.exit_code == 0, res.output
    assert "prefill-1 → decode-0" in res.output and "FAILED" not in res.output
    assert cli("down", dep.path).exit_code == 0
    assert wait_no_procs(dep.work_root) == []
    res = cli("canary", "pairs")  # not recorded any more: a wrong argument
    assert res.exit_code == 2 and "no deployment 'pairs' is recorded" in res.output


def test_up_names_the_broken_pairs_with_their_doctor_finding_and_rolls_back(make_deployment):
    # decode-1 ignores kv_transfer_params: it recomputes every prompt (not disaggregated);
    # a router could route every canary through decode-0 and never see it.
    dep = two_by_two(make_deployment, "brokenpair", {"FAKE_VLLM_MODE": "no_kv"})
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 1, res.output
    out = " ".join(res.output.split())  # rich wraps long lines
    assert "canary failed: 2 of 4 prefill → decode pair(s) failed" in out, out
    assert "prefill-0 → decode-1: the KV did not move" in out
    assert "prefill-1 → decode-1: the KV did not move" in out
    assert "prefill-0 → decode-0:" not in out and "prefill-1 → decode-0:" not in out
    assert "doctor: decode-recomputes on decode-1" in out
    assert "rolled back" in out
    assert wait_no_procs(dep.work_root) == []
    assert load_state("brokenpair") is None


def test_canary_command_on_a_running_deployment_with_a_broken_pair(make_deployment):
    dep = two_by_two(make_deployment, "runbroken", {"FAKE_VLLM_MODE": "no_kv"})
    res = cli("up", dep.path, "--timeout", "120", "--no-canary")
    assert res.exit_code == 0, res.output
    res = cli("canary", dep.path, "--json", "--sequential")
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert not data["ok"] and data["router"] is None  # not tried past a broken pair
    verdict = {p["pair"]: p["ok"] for p in data["pairs"]}
    assert verdict == {p: not p.endswith("decode-1") for p in PAIRS}
    broken = next(p for p in data["pairs"] if p["pair"] == "prefill-1 → decode-1")
    assert broken["decode_external_kv_transfer_tokens"] == 0
    assert broken["decode_local_compute_tokens"] == broken["prompt_tokens"]
    assert any(f.startswith("decode-recomputes on decode-1") for f in broken["findings"])
    res = cli("canary", dep.path)
    assert res.exit_code == 1
    assert "2 of 4 pair(s) failed" in res.output and "not tried" in res.output
    assert cli("down", dep.path).exit_code == 0
    assert wait_no_procs(dep.work_root) == []


def dp_decode(make_deployment, name: str, decode_env: dict | None = None):
    """1 prefill, 1 decode with data parallel 2 on one host: one API server, two ranks."""
    dep = make_deployment(name, decode_env=decode_env)
    dep.spec["decode"][0]["dp"] = {"size": 2}
    dep.write()
    return dep


def test_up_proves_each_dp_rank_of_a_decode_and_canary_command_agrees(make_deployment):
    dep = dp_decode(make_deployment, "dpranks")
    res = cli("up", dep.path, "--timeout", "120", "--json")
    assert res.exit_code == 0, res.output
    pairs = json.loads(res.stdout)["canary"]["pairs"]
    assert [(p["pair"], p["ok"]) for p in pairs] == [
        ("prefill-0 → decode-0 (DP rank 0)", True),
        ("prefill-0 → decode-0 (DP rank 1)", True),
    ], pairs
    # the recorded deployment knows the ranks too: `pdlaunch canary` pins the same two
    res = cli("canary", dep.path, "--json", "--no-router")
    assert res.exit_code == 0, res.output
    assert [p["decode_dp_rank"] for p in json.loads(res.stdout)["pairs"]] == [0, 1]
    assert cli("down", dep.path).exit_code == 0
    assert wait_no_procs(dep.work_root) == []


def test_up_names_the_dp_rank_that_cannot_move_kv_and_rolls_back(make_deployment):
    # rank 1 recomputes every prompt; unpinned, a canary lands on rank 0 half the time
    dep = dp_decode(make_deployment, "dprankbroken", {"FAKE_VLLM_NO_KV_RANKS": "1"})
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 1, res.output
    out = " ".join(res.output.split())
    assert "canary failed: 1 of 2 prefill → decode pair(s) failed" in out, out
    assert "prefill-0 → decode-0 (DP rank 1): the KV did not move" in out, out
    assert "rolled back" in out
    assert wait_no_procs(dep.work_root) == []
    assert load_state("dprankbroken") is None
