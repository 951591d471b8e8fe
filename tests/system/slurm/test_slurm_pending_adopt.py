"""A Slurm job still PENDING when its `up` was killed (kill -9) is resumed by the next `up` of
the same topology: it waits for that job's allocation as a fresh submit would, instead of
refusing it or submitting a second one; against the real slurmctld (tests/slurm/cluster.py),
through the CLI in a process of its own, as tests/runtime/test_lifecycle_scenarios.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pdlaunch.backends.slurm import jobs
from pdlaunch.backends.slurm.record import load_slurm
from pdlaunch.runtime.record_store import record_path
from tests.support import cli_runner as pdl_cli
from tests.support.cli_runner import TRACEBACK
from tests.support.processes import wait_no_procs
from tests.support.slurm_specs import fake_spec
from tests.support.sshd import free_ports

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[3]
# The job may not start before this (Reason=BeginTime): PENDING for as long, whatever the
# cluster's load. The text is relative, so the second `up` renders the same job.
BEGIN = "--begin=now+20"


def _pending(name: str) -> str | None:
    """The recorded job's id while Slurm holds it PENDING."""
    try:
        rec = load_slurm(name)
    except Exception:  # written while read: try again
        return None
    if rec is None:
        return None
    return rec.job_id if jobs.job_info(rec.job_id).state == "PENDING" else None


def _killed_while_pending(cluster, fake_bins, tmp_path: Path, name: str, begin: str):
    """A topology and its job, left PENDING by an `up` killed -9 while it waited: (path,
    work dir, flags, job id)."""
    ports = free_ports("prefill", "decode", "side", "router", "metrics")
    work = tmp_path / "work"
    path = tmp_path / f"{name}.yaml"
    spec = fake_spec(name, work, cluster.nodes, fake_bins, ports)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    flags = ["--backend", "slurm", "--time", "10", "--start-timeout", "120", "--sbatch-opt", begin]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdlaunch", "up", str(path), *flags, "--timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while (job := _pending(name)) is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the job was never recorded PENDING"
            time.sleep(0.2)
        proc.kill()  # SIGKILL while it waits for the allocation: no rollback
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert jobs.job_info(job).state == "PENDING"  # still waiting for its begin time
    return path, work, flags, job


def test_up_after_kill_9_resumes_a_still_pending_job(slurm_cluster, fake_bins, tmp_path):
    path, work, flags, job = _killed_while_pending(slurm_cluster, fake_bins, tmp_path,
                                                   "sc-pending", BEGIN)  # fmt: skip
    try:
        r = pdl_cli.pdl("up", path, *flags, "--timeout", "150", "--json", limit=240)
        assert r.rc == 0, r
        up = r.json()
        # The job the killed `up` submitted, waited for and brought up: not a second one.
        assert up["ok"] and up["changed"] and up["job_id"] == job, up
        assert load_slurm("sc-pending").job_id == job
        st = pdl_cli.pdl("status", "sc-pending", "--json")
        data = st.json()
        assert st.rc == 0 and data["healthy"] and data["job"]["id"] == job, st
        assert data["status"] == "up"
    finally:
        r = pdl_cli.pdl("down", "sc-pending", "--json")
    assert r.rc == 0 and json.loads(r.stdout)["job_id"] == job, r
    assert TRACEBACK not in r.stdout + r.stderr
    assert wait_no_procs(work, timeout=20) == []
    assert not record_path("sc-pending").exists()


def test_a_resumed_job_that_does_not_start_in_time_is_cancelled_like_a_fresh_submit(
    slurm_cluster, fake_bins, tmp_path
):
    late = "--begin=now+600"
    path, _, flags, job = _killed_while_pending(slurm_cluster, fake_bins, tmp_path,
                                                "sc-pending-late", late)  # fmt: skip
    try:
        r = pdl_cli.pdl("up", path, *flags, "--timeout", "5", "--json")
        assert r.rc == 1, r
        data = r.json()
        assert data["rolled_back"] is True and data["job_id"] == job, data
        assert f"job {job} still not running" in data["error"], data
        assert not jobs.job_info(job).active  # cancelled: nothing waits to start unobserved
        assert not record_path("sc-pending-late").exists()
    finally:
        if record_path("sc-pending-late").exists():
            pdl_cli.pdl("down", "sc-pending-late")
