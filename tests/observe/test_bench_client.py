"""`bench` runs `vllm bench serve` through the hosts layer: on the control host's LocalHost
and, the same way, on any SSH host (e.g. the router's).

The real client needs a running deployment (tests/system/engines runs it); here a stand-in `vllm`
script records what it was given (argv, environment, working directory) into the result file
the real one writes, so each test can fail on a wrong command, environment or cleanup.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from pdlaunch.hosts import Host, LocalHost
from pdlaunch.observe import bench
from pdlaunch.plan.build import Plan, build_plan
from pdlaunch.spec.load import load
from tests.support.fake_bench_client import FAKE_VLLM

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plan() -> Plan:
    topo, _ = load(ROOT / "topologies" / "local-cpu.yaml")
    return build_plan(topo)


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bin" / "vllm"
    path.parent.mkdir()
    path.write_text(FAKE_VLLM)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    # The result directory is made under TMPDIR: a private one shows what is left behind.
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    return path


def _run(host: Host, plan: Plan, vllm: Path, **kw: object) -> bench.BenchResult:
    seen: list[list[str]] = []
    result = bench.run_bench(
        host, plan, bench.BenchOptions(num_prompts=3), vllm=str(vllm), announce=seen.append, **kw
    )
    assert seen and seen[0][:3] == [str(vllm), "bench", "serve"]
    return result


def test_local_host_runs_the_client_and_cleans_up(plan, fake_vllm, tmp_path):
    result = _run(LocalHost(), plan, fake_vllm)
    assert result.ok and result.completed == 3
    assert result.metrics["mean_ttft_ms"] == 10.0
    raw = result.raw
    assert raw["seen_offline"] == "1"  # the tokenizer is local: no hub lookups
    assert raw["seen_proxy"] == "unset"  # the router's address is cluster-internal
    assert f"--base-url {plan.endpoint()}" in raw["seen_argv"]
    assert f"--result-dir {raw['seen_cwd']}" in raw["seen_argv"]
    assert Path(raw["seen_cwd"]).parent == tmp_path / "tmp"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_an_explicit_offline_setting_is_kept(plan, fake_vllm, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert _run(LocalHost(), plan, fake_vllm).raw["seen_offline"] == "0"


@pytest.mark.parametrize(
    "mode, message, tail",
    [
        ("fail", "vllm bench serve exited 3", "boom: the router said no"),
        ("silent", "the benchmark wrote no result", "fake vllm: bench serve"),
    ],
)
def test_failures_name_the_cause_with_the_output(
    plan, fake_vllm, tmp_path, monkeypatch, mode, message, tail
):
    monkeypatch.setenv("FAKE_MODE", mode)
    with pytest.raises(bench.BenchError) as info:
        _run(LocalHost(), plan, fake_vllm)
    assert message in str(info.value)
    assert tail in info.value.tail
    assert list((tmp_path / "tmp").iterdir()) == []


def test_timeout_kills_the_client_and_cleans_up(plan, fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "slow")
    with pytest.raises(bench.BenchError, match="did not finish in 1s"):
        _run(LocalHost(), plan, fake_vllm, timeout=1)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_missing_client_is_named(plan, fake_vllm, tmp_path):
    with pytest.raises(bench.BenchError, match=r"cannot run .*/nowhere/vllm on localhost"):
        _run(LocalHost(), plan, tmp_path / "nowhere" / "vllm")


@pytest.mark.ssh
def test_ssh_host_runs_the_client_the_same_way(plan, fake_vllm, ssh_connect, sshd_host):
    # The router's host is reached like any other: over SSH, with a login environment.
    host = ssh_connect(sshd_host)
    result = _run(host, plan, fake_vllm)
    assert result.ok and result.completed == 3
    assert result.raw["seen_offline"] == "1"
    assert not os.path.exists(result.raw["seen_cwd"])


@pytest.mark.parametrize(
    ("replace", "says"),
    [
        (('"completed": $n', '"completed": NaN'), "completed is nan: not a count"),
        (('"completed": $n', '"completed": "many"'), "completed is not a number"),
        (('"duration": 1.5', '"duration": 1e999'), "duration is inf: not a count"),
        (('"failed": 0', '"failed": -2'), "failed is -2: not a count"),
        (('{"completed"', "[" * 100_000 + '{"completed"'), "nested too deeply"),
    ],
)
def test_a_result_no_count_can_be_read_from_is_a_bench_error(plan, fake_vllm, replace, says):
    # issue 32: int(NaN) gave a ValueError traceback, deep nesting a RecursionError.
    fake_vllm.write_text(fake_vllm.read_text().replace(*replace))
    with pytest.raises(bench.BenchError, match=re.escape(says)):
        _run(LocalHost(), plan, fake_vllm)


def test_a_saved_result_is_read_bounded(tmp_path):
    os.mkfifo(tmp_path / bench.RESULT_FILENAME)  # read whole, it blocked for a writer
    with pytest.raises(bench.BenchError, match=r"is not a regular file \(a FIFO\)"):
        bench.load_result(tmp_path)
