"""A 1P1D deployment of stand-in engines run for real through Slurm: a heterogeneous job on the
test cluster's two nodes, health, the PD canary, status, logs, down."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm import jobs
from pdlaunch.backends.slurm import rules as slurm_rules
from pdlaunch.observe.health import probe
from pdlaunch.runtime import lifecycle
from tests.support import slurm_lifecycle as slurm_rt
from tests.support.slurm_specs import fake_spec, planned
from tests.support.sshd import free_ports

pytestmark = pytest.mark.slurm


def _ports() -> dict[str, int]:
    return free_ports("prefill", "decode", "side", "router", "metrics")


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def _squeue(cluster, job_id: str) -> list[str]:
    res = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%i %T %N"], check=False)
    return [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]


def test_up_status_logs_down_through_slurm(slurm_cluster, fake_bins, tmp_path: Path) -> None:
    nodes = slurm_cluster.nodes
    work = tmp_path / "work"
    spec = fake_spec("slurm-fake", work, nodes, fake_bins, _ports())
    topo, _, plan = planned(spec, tmp_path / "t.yaml")
    opts = slurm.SlurmOptions(nodelist=tuple(nodes), time="10", start_timeout=120)
    gpus, cpus = jobs.partition_limits()
    assert (gpus, cpus) == (0, os.cpu_count())
    opts_limits = slurm.SlurmOptions(nodelist=tuple(nodes), cpus_per_node=cpus)
    assert slurm_rules.check(topo, plan, opts_limits) == []

    t0 = time.monotonic()
    res = slurm_rt.up(plan, opts, timeout=120, canary_timeout=60)
    assert res.ok, f"{res.message}\n{res.logs}"
    healthy_s = time.monotonic() - t0
    assert res.canary is not None and res.canary.ok, res.canary
    assert res.canary.details["decode_external_kv_transfer_tokens"] > 0
    job = res.job_id

    # A heterogeneous job: one component per node group, each on its own node.
    lines = _squeue(slurm_cluster, job)
    assert sorted(lines) == [f"{job}+0 RUNNING {nodes[0]}", f"{job}+1 RUNNING {nodes[1]}"]

    st = slurm_rt.status("slurm-fake")
    assert st.healthy and st.job.state == "RUNNING" and st.job.source == "squeue"
    assert {(p.name, p.node, p.health) for p in st.processes} == {
        ("prefill-0", nodes[0], "healthy"),
        ("decode-0", nodes[1], "healthy"),
        ("router", nodes[0], "healthy"),
    }

    # What each engine got at run time: the node's address from Slurm (NodeAddr), the plan's
    # CPU core (allowed here), the router the engines' URLs on their nodes.
    engines = {}
    for pid, _ in jobs.processes_under([str(work / "slurm-fake")]):
        env = _environ(pid)
        if "VLLM_NIXL_SIDE_CHANNEL_HOST" in env:
            engines[env["SLURM_JOB_NAME"]] = env
    assert set(engines) == {"prefill-0", "decode-0"}, engines.keys()
    assert engines["prefill-0"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert engines["prefill-0"]["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert engines["decode-0"]["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert engines["decode-0"]["SLURMD_NODENAME"] == nodes[1]

    log = slurm_rt.logs("slurm-fake", "prefill-0", lines=50)
    assert "fake-vllm" in log and "serving on" in log
    # The driver polls each second: it may say so a moment after the control host saw it.
    deadline = time.monotonic() + 15
    while "up: http://" not in (driver := slurm_rt.logs("slurm-fake", "driver")):
        assert time.monotonic() < deadline, driver
        time.sleep(0.3)
    assert f"component 1: {nodes[1]}" in driver
    assert f"up: http://127.0.0.1:{spec['router']['port']}" in driver
    with pytest.raises(lifecycle.LaunchError, match="known: prefill-0"):
        slurm_rt.logs("slurm-fake", "nope")

    t1 = time.monotonic()
    down = slurm_rt.down("slurm-fake")
    down_s = time.monotonic() - t1
    assert down.ok, down
    assert _squeue(slurm_cluster, job) == []
    assert jobs.processes_under([str(work)]) == []
    assert not probe(res.endpoint + "/health", timeout=2).ok
    assert jobs.load_slurm("slurm-fake") is None
    # Idempotent.
    assert slurm_rt.down("slurm-fake").job_id is None
    print(f"\n[slurm fake] healthy+canary {healthy_s:.1f}s, down {down_s:.1f}s")


def test_an_engine_that_dies_fails_up_and_leaves_nothing(
    slurm_cluster, fake_bins, tmp_path: Path
) -> None:
    """The same deployment with a decode that exits at start: up says which process failed,
    with its log, cancels the job, and nothing is left running."""
    work = tmp_path / "work"
    spec = fake_spec("slurm-bad", work, slurm_cluster.nodes, fake_bins, _ports(),
                     decode_env={"FAKE_VLLM_MODE": "exit"})  # fmt: skip
    _, _, plan = planned(spec, tmp_path / "t.yaml")
    opts = slurm.SlurmOptions(time="10", start_timeout=60)
    res = slurm_rt.up(plan, opts, timeout=60)
    assert not res.ok and res.error.rolled_back, res.message
    assert "decode-0" in res.message and "exited during start" in res.message, res.message
    assert "simulated engine failure" in res.logs["decode-0"]
    assert "decode-0 exited before it was healthy" in res.logs["driver"]
    assert _squeue(slurm_cluster, res.job_id) == []
    deadline = time.monotonic() + 15
    while jobs.processes_under([str(work)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert jobs.processes_under([str(work)]) == []
    assert jobs.load_slurm("slurm-bad") is None  # proven gone, so forgotten
    assert slurm_rt.down("slurm-bad").job_id is None


def test_a_second_up_of_a_running_deployment_is_refused(
    slurm_cluster, fake_bins, tmp_path: Path
) -> None:
    spec = fake_spec("slurm-twice", tmp_path / "w", slurm_cluster.nodes, fake_bins, _ports())
    _, _, plan = planned(spec, tmp_path / "t.yaml")
    job = jobs.submit(plan, slurm.SlurmOptions(time="10"))
    try:
        with pytest.raises(jobs.SlurmRunError, match=f"Slurm job {job}"):
            jobs.submit(plan, slurm.SlurmOptions(time="10"))
    finally:
        assert slurm_rt.down("slurm-twice").ok
    assert _squeue(slurm_cluster, job) == []


def test_a_percent_in_the_work_dir_is_a_percent_to_slurm(
    slurm_cluster, fake_bins, tmp_path: Path
) -> None:
    """Slurm reads --output as a filename pattern (%j: the job id): pdlaunch escapes a % in
    the work dir, so every log lands at the path it records, which `logs` reads."""
    work = tmp_path / "run%j%x"
    spec = fake_spec("slurm-pct", work, slurm_cluster.nodes, fake_bins, _ports())
    _, _, plan = planned(spec, tmp_path / "t.yaml")
    res = slurm_rt.up(plan, slurm.SlurmOptions(time="10", start_timeout=60), timeout=60,
                       canary=False)  # fmt: skip
    try:
        assert res.ok, f"{res.message}\n{res.logs}"
        for p in plan.processes:
            assert Path(p.log_path).is_file(), p.log_path
        assert Path(jobs.load_slurm("slurm-pct").driver_log).is_file()
        assert "serving on" in slurm_rt.logs("slurm-pct", "prefill-0", lines=20)
        assert not any(p.name != "run%j%x" for p in tmp_path.iterdir() if p.name.startswith("run"))
    finally:
        assert slurm_rt.down("slurm-pct").ok


def test_down_leaves_a_job_that_is_not_the_deployments(
    slurm_cluster, fake_bins, tmp_path: Path
) -> None:
    """A record naming another job of the same user (a stale or edited record): `down`
    refuses to cancel it, and scancel's filters, which pdlaunch adds to every scancel, leave
    it too (the stand-in scancel of test_slurm_hardening.py assumes this)."""
    sbatch = ["sbatch", "--parsable", "--job-name=training", "--time=5", f"--chdir={tmp_path}"]
    other = slurm_cluster.run([*sbatch, "--output=/dev/null", "--wrap", "sleep 300"]).stdout
    other = other.strip()
    try:
        spec = fake_spec("slurm-other", tmp_path / "w", slurm_cluster.nodes, fake_bins, _ports())
        _, _, plan = planned(spec, tmp_path / "t.yaml")
        jobs.run_slurm(jobs._scancel_argv("slurm-other", other))
        jobs.save_slurm(jobs.record_of(plan, other))
        res = slurm_rt.down("slurm-other")
        assert not res.ok and "not this deployment's job" in res.message, res
        time.sleep(1)
        assert [ln.split()[0] for ln in _squeue(slurm_cluster, other)] == [other]
        assert jobs.record_path("slurm-other").exists()
    finally:
        slurm_cluster.run(["scancel", other], check=False)
