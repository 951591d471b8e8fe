"""`doctor` (and `--bundle`), `canary`, `bench`, `status --watch` and `logs -f` on a Slurm
deployment, against the test cluster (tests/system/slurm/conftest.py) and the stand-in
engines.

The topology names its hosts ``pd-a`` and ``pd-b``: names Slurm maps to whatever nodes it
allocates, and that no resolver knows. So the plan's addresses lead nowhere, and each command
passes only by reaching the processes where the record says Slurm runs them (the router on
the allocation's first node, at the address Slurm reaches it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm import jobs
from pdlaunch.cli import app
from pdlaunch.observe import bench
from pdlaunch.runtime import record, record_store
from tests.support import slurm_lifecycle as slurm_rt
from tests.support.slurm_specs import REPO, fake_spec, planned
from tests.support.sshd import free_ports

pytestmark = pytest.mark.slurm

TRACEBACK = "Traceback (most recent call last)"

# A `vllm bench serve` stand-in: it says which base URL it was given and sends its prompts
# there for real (through the router to the engines, whose counters `bench` then judges).
FAKE_BENCH = """import json, os, sys, urllib.request
a = sys.argv[1:]
get = lambda k: a[a.index(k) + 1]
base, n = get("--base-url"), int(get("--num-prompts"))
open(os.environ["BENCH_SEEN"], "w").write(base)
# prompts of --random-input-len tokens, as the real client sends (the stand-in engines count
# one token per word), so bench's verdict sees every prompt token arrive over KV
words = " ".join(["word"] * int(get("--random-input-len")))
for _ in range(n):
    body = {"model": get("--model"), "prompt": words, "max_tokens": 4}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()
result = {"completed": n, "failed": 0, "duration": 1.0, "mean_ttft_ms": 5.0,
          "request_throughput": 1.0, "output_throughput": 4.0, "total_token_throughput": 9.0}
json.dump(result, open(os.path.join(get("--result-dir"), "bench.json"), "w"))
"""


def _pdl(*args: object, limit: float = 120.0) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "pdlaunch", *map(str, args)],
        capture_output=True, text=True, timeout=limit, stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    assert TRACEBACK not in res.stdout + res.stderr, res
    return res


def _complete(endpoint: str) -> None:
    body = json.dumps({"model": "fake-model", "prompt": "a b c d", "max_tokens": 2}).encode()
    req = urllib.request.Request(endpoint + "/v1/completions", body,
                                 {"Content-Type": "application/json"})  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    opener.open(req, timeout=30).read()


@pytest.fixture
def deployment(slurm_cluster, fake_bins, tmp_path: Path):
    ports = free_ports("prefill", "decode", "side", "router", "metrics")
    spec = fake_spec("slurm-every", tmp_path / "work", ["pd-a", "pd-b"], fake_bins, ports)
    path = tmp_path / "every.yaml"
    _, _, plan = planned(spec, path)
    assert plan.router.health_url.startswith("http://pd-a:")  # the plan's: nowhere
    res = slurm_rt.up(plan, slurm.SlurmOptions(time="10", start_timeout=120), timeout=120,
                       canary=False)  # fmt: skip
    try:
        assert res.ok, f"{res.message}\n{res.logs}"
        yield path, ports, res
    finally:
        assert slurm_rt.down("slurm-every").ok


def test_every_command_reaches_a_slurm_deployment_where_slurm_runs_it(
    slurm_cluster, deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ports, up = deployment
    router_url = f"http://127.0.0.1:{ports['router']}"  # the nodes' NodeAddr
    assert up.endpoint == router_url

    # The record: the router where Slurm put it, each process on its node.
    rec = record_store.find("slurm-every")
    assert rec is not None and rec.backend == "slurm" and rec.endpoint == router_url
    assert isinstance(rec.handle, record.SlurmHandle) and rec.handle.job_state == "RUNNING"
    assert rec.handle.job_id == up.job_id
    hosts = {p.name: p.host for p in rec.processes}
    assert hosts["router"] == hosts["prefill-0"] and hosts["prefill-0"] != hosts["decode-0"]
    assert {hosts["prefill-0"], hosts["decode-0"]} == set(slurm_cluster.nodes), hosts
    _complete(router_url)  # some traffic for the counters

    # doctor --bundle: logs from the job's work dir, metrics from the engines on their nodes.
    bundle = tmp_path / "b.tar.gz"
    r = _pdl("doctor", "slurm-every", "--json", "--bundle", bundle)
    assert r.returncode == 0, r
    data = json.loads(r.stdout)
    # The one finding: the stand-in router serves no /metrics; asked on its node, at the
    # Prometheus port the Slurm record keeps for it.
    found = [(f["id"], f["where"].split("@")[0], f["what"]) for f in data["findings"]]
    metrics = f"http://127.0.0.1:{ports['metrics']}/metrics"
    assert found == [("metrics-unreachable", "router", f"{metrics}: connection refused")], data
    with tarfile.open(bundle) as tar:
        names = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        text = {n: tar.extractfile(m).read().decode() for n, m in names.items()}
    assert "serving on" in text["logs/prefill-0.log"] and "serving on" in text["logs/decode-0.log"]
    assert "external_kv_transfer" in text["metrics/decode-0.prom"]
    assert json.loads(text["record.json"])["endpoint"] == router_url
    assert json.loads(text["slurm.json"])["job_id"] == up.job_id
    assert "state.json" not in text and "scripts/slurm-job.sh" in text

    # canary: the pair sent directly to the engines where Slurm runs them (the plan's pd-a and
    # pd-b lead nowhere), judged on decode's counters there, then one request via the router.
    r = _pdl("canary", "slurm-every", "--json")
    assert r.returncode == 0, r
    data = json.loads(r.stdout)
    assert [(p["pair"], p["ok"]) for p in data["pairs"]] == [("prefill-0 → decode-0", True)], data
    assert data["pairs"][0]["decode_external_kv_transfer_tokens"] > 0, data
    assert data["router"]["ok"], data
    # an SSH option means nothing to a Slurm deployment: refused, not ignored
    r = _pdl("canary", "slurm-every", "--known-hosts", tmp_path / "kh")
    assert r.returncode == 2 and "--known-hosts" in r.stderr + r.stdout, r

    # status --watch: each engine's counters read on its node.
    r = _pdl("status", "slurm-every", "--watch", "--interval", "0.5", "--count", "1", "--json")
    assert r.returncode == 0, r
    rows = json.loads(r.stdout)["processes"]  # one refresh: one JSON document
    assert sorted(x["process"] for x in rows) == ["decode-0", "prefill-0"]
    assert all(x["flags"] == [] for x in rows), rows

    # bench: through the router where it runs (a stand-in benchmark client sends the prompts).
    fake = tmp_path / "vllm"
    fake.write_text(f"#!{sys.executable}\n{FAKE_BENCH}")
    fake.chmod(0o755)
    seen = tmp_path / "seen"
    monkeypatch.setattr(bench, "find_vllm", lambda explicit=None: str(fake))
    monkeypatch.setenv("BENCH_SEEN", str(seen))
    res = CliRunner().invoke(app, ["bench", str(path), "--num-prompts", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["endpoint"] == router_url and out["backend"] == "slurm"
    assert seen.read_text() == router_url
    assert out["disaggregated"]["valid"] is True, out["disaggregated"]

    # logs -f: the last lines, then each new one as the engine writes it; Ctrl-C ends it.
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdlaunch", "logs", "slurm-every", "decode-0", "-f", "-n", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        before = 0
        while time.monotonic() < deadline and not lines:
            time.sleep(0.1)
        assert lines, proc.stderr.read() if proc.poll() is not None else "no line"
        before = sum("POST /v1/completions" in ln for ln in lines)
        _complete(router_url)
        while time.monotonic() < deadline:
            if sum("POST /v1/completions" in ln for ln in lines) > before:
                break
            time.sleep(0.1)
        assert sum("POST /v1/completions" in ln for ln in lines) > before, lines
        assert proc.poll() is None  # still following
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0 and TRACEBACK not in proc.stderr.read()


def test_commands_on_a_job_that_no_longer_runs_say_so(slurm_cluster, fake_bins, tmp_path) -> None:
    """A recorded job that ended: bench, watch and canary name the job's state instead of aiming at
    the plan's addresses; doctor reports every process dead, with the job's state."""
    ports = free_ports("prefill", "decode", "side", "router", "metrics")
    spec = fake_spec("slurm-gone", tmp_path / "work", ["pd-a", "pd-b"], fake_bins, ports)
    path = tmp_path / "gone.yaml"
    _, _, plan = planned(spec, path)
    res = slurm_rt.up(plan, slurm.SlurmOptions(time="10", start_timeout=60), timeout=60,
                      canary=False)  # fmt: skip
    assert res.ok, f"{res.message}\n{res.logs}"
    try:
        # The job ends behind pdlaunch's back (a time limit, an admin's scancel): the record
        # stays, naming a job Slurm no longer holds.
        jobs.run_slurm(["scancel", res.job_id])
        deadline = time.monotonic() + 60
        while jobs.job_info(res.job_id).state != "GONE":
            assert time.monotonic() < deadline, jobs.job_info(res.job_id)
            time.sleep(0.3)
        r = _pdl("doctor", "slurm-gone", "--json")
        assert r.returncode == 1, r
        data = json.loads(r.stdout)
        dead = [f for f in data["findings"] if f["id"] == "process-dead"]
        assert len(dead) == 3 and f"job {res.job_id} is GONE" in dead[0]["what"], data
        r = _pdl("status", "slurm-gone", "--watch", "--count", "1", "--interval", "0.2", "--json")
        assert r.returncode == 1 and f"Slurm job {res.job_id} is GONE" in r.stdout, r
        bres = CliRunner().invoke(app, ["bench", str(path), "--json"])
        assert bres.exit_code == 1, bres.output
        assert f"Slurm job {res.job_id} is GONE" in json.loads(bres.stdout)["error"]
        r = _pdl("canary", "slurm-gone")
        assert r.returncode == 1 and f"Slurm job {res.job_id} is GONE" in r.stderr, r
        assert "no engine to ask" in r.stderr and TRACEBACK not in r.stderr, r
    finally:
        assert slurm_rt.down("slurm-gone").ok
