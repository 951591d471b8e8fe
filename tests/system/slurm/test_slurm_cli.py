"""`pdlaunch ... --backend slurm` as a user runs it: pdlaunch in a process of its own, against
the test cluster's two nodes (tests/system/slurm/conftest.py) and the stand-in engines of
test_jobs.py. One deployment goes up, status, logs, down; the other cases submit
nothing, or only a job they interrupt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm import jobs
from pdlaunch.runtime.record_store import list_deployments
from tests.support import slurm_lifecycle as slurm_rt
from tests.support.cli_runner import TRACEBACK, pdl
from tests.support.slurm_specs import REPO, fake_spec, planned
from tests.support.sshd import free_ports

pytestmark = pytest.mark.slurm





def _ports() -> dict[str, int]:
    return free_ports("prefill", "decode", "side", "router", "metrics")


def _squeue(cluster, job_id: str) -> list[str]:
    res = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%i %T %N"], check=False)
    return sorted(ln.strip() for ln in res.stdout.splitlines() if ln.strip())


def _topology(cluster, bins, tmp_path: Path, name: str, **env: dict) -> tuple[Path, Path]:
    """A 1P1D stand-in topology on the cluster's two nodes: (its file, its work root)."""
    work = tmp_path / "work"
    path = tmp_path / f"{name}.yaml"
    planned(fake_spec(name, work, cluster.nodes, bins, _ports(), **env), path)
    return path, work


# -- one deployment: up, status, logs, down -------------------------------------------------------
def test_up_status_logs_down(slurm_cluster, fake_bins, tmp_path: Path) -> None:
    nodes = slurm_cluster.nodes
    path, work = _topology(slurm_cluster, fake_bins, tmp_path, "cli-fake")
    r = pdl("up", path, "--backend", "slurm", "--nodelist", ",".join(nodes), "--time", "10",
            "--start-timeout", "120", "--timeout", "120", "--json")  # fmt: skip
    assert r.rc == 0, r
    up = json.loads(r.stdout)
    job = up["job_id"]
    try:
        assert up["ok"] and up["backend"] == "slurm" and job.isdigit(), up
        assert up["canary"]["ok"] and up["canary"]["decode_external_kv_transfer_tokens"] > 0
        assert _squeue(slurm_cluster, job) == [f"{job}+0 RUNNING {nodes[0]}",
                                               f"{job}+1 RUNNING {nodes[1]}"]  # fmt: skip

        # No name and no --backend: the only recorded deployment, found by its Slurm record.
        assert list_deployments() == ["cli-fake"]
        r = pdl("status", "--json")
        assert r.rc == 0, r
        st = json.loads(r.stdout)
        assert st["backend"] == "slurm" and st["healthy"] and st["status"] == "up"
        assert st["job"]["id"] == job and st["job"]["state"] == "RUNNING"
        assert st["endpoint"] == up["endpoint"]
        # One row shape on every backend: "host" is the node Slurm gave the process.
        assert {(p["process"], p["host"], p["health"]) for p in st["processes"]} == {
            ("prefill-0", nodes[0], "healthy"),
            ("decode-0", nodes[1], "healthy"),
            ("router", nodes[0], "healthy"),
        }
        r = pdl("status", "cli-fake", "--backend", "slurm")
        assert r.rc == 0 and f"Slurm job {job} RUNNING" in r.stdout, r
        assert r.stdout.count("healthy") == 3, r
        # --backend overrides the record: over SSH, the record is not one of its own.
        r = pdl("status", "cli-fake", "--backend", "ssh")
        said = " ".join(r.stderr.split())
        assert r.rc == 1 and f"has a record of Slurm job {job}" in said, r
        assert "not of the ssh backend" in said, r

        r = pdl("logs", "cli-fake", "prefill-0")
        assert r.rc == 0 and "serving on" in r.stdout, r
        assert slurm_rt.logs("cli-fake", "prefill-0", 0) == ""  # -n 0: nothing, not all
        r = pdl("logs", path, "driver", "-n", "200")
        assert r.rc == 0 and f"component 1: {nodes[1]}" in r.stdout, r
        r = pdl("logs", "cli-fake", "nope")
        assert r.rc == 1 and "known: prefill-0" in r.stderr, r
        r = pdl("logs", "cli-fake", "nope", "-f")  # following: test_slurm_every_command.py
        assert r.rc == 1 and "known: prefill-0" in r.stderr, r

        # Over SSH the same deployment would run a second copy beside the job: refused.
        r = pdl("up", path, "--skip-check")
        assert r.rc == 1 and f"Slurm job {job}" in r.stderr and "pdlaunch down" in r.stderr, r
        kept = Path(os.environ["PDLAUNCH_STATE_DIR"]) / "cli-fake" / "record.json"
        assert json.loads(kept.read_text())["handle"]["job_id"] == job  # not overwritten

        # Another job for the same deployment (other sbatch options) is refused, the job
        # untouched; --replace would cancel it first.
        r = pdl("up", path, "--backend", "slurm", "--time", "10", "--timeout", "30")
        assert r.rc == 1 and f"Slurm job {job}" in r.stderr and "--replace" in r.stderr, r
        # The same topology and options: the running job is kept (as over SSH).
        r = pdl("up", path, "--backend", "slurm", "--nodelist", ",".join(nodes), "--time", "10",
                "--start-timeout", "120", "--timeout", "30", "--json")  # fmt: skip
        again = json.loads(r.stdout)
        assert r.rc == 0 and again["changed"] is False and again["job_id"] == job, r
        assert "already up and unchanged" in again["message"], r
        assert again["endpoint"] == up["endpoint"], r
        assert len(_squeue(slurm_cluster, job)) == 2

        # The topology file and no --backend: down finds the Slurm record.
        r = pdl("down", path)
        assert r.rc == 0 and "nothing left" in r.stdout, r
    finally:
        slurm_rt.down("cli-fake")  # whatever failed above, leave no job behind
    assert _squeue(slurm_cluster, job) == []
    assert jobs.processes_under([str(work)]) == []
    assert jobs.load_slurm("cli-fake") is None and list_deployments() == []
    r = pdl("down", "cli-fake", "--backend", "slurm", "--json")
    assert r.rc == 0 and json.loads(r.stdout)["job_id"] is None, r  # idempotent


def test_an_interrupted_up_cancels_its_job(slurm_cluster, fake_bins, tmp_path: Path) -> None:
    """SIGTERM while `up` waits for health (a decode that never listens): exit 130, the job
    cancelled, no process left, the record forgotten."""
    path, work = _topology(slurm_cluster, fake_bins, tmp_path, "cli-int",
                           decode_env={"FAKE_VLLM_MODE": "hang"})  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdlaunch", "up", str(path), "--backend", "slurm",
         "--time", "10", "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        job = None
        while job is None or len(_squeue(slurm_cluster, job)) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.3)
            rec = jobs.load_slurm("cli-int")
            job = rec.job_id if rec else None
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        slurm_rt.down("cli-int")
    assert proc.returncode == 130, (stdout, stderr)
    assert TRACEBACK not in stdout + stderr
    assert "interrupted by SIGTERM: rolled back" in stderr, stderr
    assert _squeue(slurm_cluster, job) == []
    assert jobs.processes_under([str(work)]) == []
    assert jobs.load_slurm("cli-int") is None


def test_a_failed_up_says_which_process_and_cancels(slurm_cluster, fake_bins, tmp_path) -> None:
    path, work = _topology(slurm_cluster, fake_bins, tmp_path, "cli-bad",
                           decode_env={"FAKE_VLLM_MODE": "exit"})  # fmt: skip
    r = pdl("up", path, "--backend", "slurm", "--time", "10", "--timeout", "60")
    assert r.rc == 1, r
    assert "decode-0 on" in r.stderr and "exited during start" in r.stderr, r
    assert "rolled back" in r.stderr, r
    assert "simulated engine failure" in r.stderr, r  # the decode's own log, shown
    assert "exited before it was healthy" in r.stderr, r  # and the job driver's
    assert jobs.load_slurm("cli-bad") is None  # proven gone, so forgotten
    r = pdl("up", path, "--backend", "slurm", "--time", "10", "--timeout", "60", "--json")
    data = json.loads(r.stdout)
    assert r.rc == 1 and data["rolled_back"] is True and data["backend"] == "slurm", r
    assert _squeue(slurm_cluster, data["job_id"]) == []
    r = pdl("status", "cli-bad")
    assert r.rc == 1 and "nothing recorded" in r.stdout, r
    assert pdl("down", "cli-bad").rc == 0
    assert jobs.processes_under([str(work)]) == []


# -- render, validate: nothing submitted ----------------------------------------------------------
def test_render_writes_a_job_slurmctld_accepts(slurm_cluster, fake_bins, tmp_path: Path) -> None:
    nodes = slurm_cluster.nodes
    path, _ = _topology(slurm_cluster, fake_bins, tmp_path, "cli-render")
    out = tmp_path / "out"
    r = pdl("render", path, "-o", out, "--backend", "slurm", "--nodelist", ",".join(nodes),
            "--time", "5", "--sbatch-opt", "--comment=pd")  # fmt: skip
    assert r.rc == 0, r
    assert sorted(p.name for p in out.iterdir()) == [
        "decode-0.sh", "index.md", "plan.json", "prefill-0.sh", "router.sh", "slurm-job.sh",
    ]  # fmt: skip
    driver = (out / slurm.DRIVER_NAME).read_text()
    assert "#SBATCH hetjob" in driver and driver.count("#SBATCH --comment=pd") == 2
    assert driver.count("#SBATCH --time=5") == 2
    assert f"#SBATCH --nodelist={nodes[1]}" in driver
    index = (out / "index.md").read_text()
    assert str(tmp_path / "work" / "cli-render" / "decode-0.sh") in index
    assert "sbatch " in index

    before = set(slurm_cluster.jobs())
    res = slurm_cluster.run(["sbatch", "--test-only", str(out / slurm.DRIVER_NAME)], check=False)
    assert res.returncode == 0 and "to start at" in res.stderr, res.stderr
    assert set(slurm_cluster.jobs()) <= before


def test_validate_and_up_refuse_a_host_outside_the_nodelist(
    slurm_cluster, fake_bins, tmp_path: Path, state_dir: Path
) -> None:
    nodes = slurm_cluster.nodes
    path, _ = _topology(slurm_cluster, fake_bins, tmp_path, "cli-rules")
    r = pdl("validate", path, "--backend", "slurm", "--nodelist", nodes[0], "--json")
    assert r.rc == 1, r
    found = json.loads(r.stdout)["findings"]
    bad = [f for f in found if f["rule"] == "slurm-nodelist" and f["field"] == "decode[0].host"]
    assert bad and bad[0]["line"] and nodes[1] in bad[0]["message"] and bad[0]["fix"], found
    r = pdl("validate", path, "--backend", "slurm", "--nodelist", nodes[0])
    assert r.rc == 1 and "decode[0].host" in r.stderr and "slurm-nodelist" in r.stderr, r

    # The clean counterpart: both nodes listed.
    r = pdl("validate", path, "--backend", "slurm", "--nodelist", ",".join(nodes))
    assert r.rc == 0 and "valid for Slurm" in r.stdout, r

    # `up` runs the same rules and submits nothing.
    before = set(slurm_cluster.jobs())
    r = pdl("up", path, "--backend", "slurm", "--nodelist", nodes[0], "--time", "5")
    assert r.rc == 1 and "slurm-nodelist" in r.stderr and "nothing was submitted" in r.stderr, r
    # no job was added (earlier tests' jobs may still be leaving the queue meanwhile)
    assert set(slurm_cluster.jobs()) <= before
    assert not (state_dir / "cli-rules" / "record.json").exists()


# -- user mistakes: a message, an exit code, no traceback ---------------------------------------
@pytest.mark.parametrize(
    "command, args, says",
    [
        ("validate", ["--backend", "slurm", "--time", "1 hour"], "slurm time '1 hour'"),
        ("validate", ["--backend", "slurm", "--time", "1h"], "HH:MM:SS"),
        ("validate", ["--backend", "slurm", "--mem", "lots"], "slurm mem 'lots'"),
        ("validate", ["--backend", "slurm", "--nodelist", "a,,b"], "empty node name"),
        ("render", ["-o", "OUT", "--backend", "slurm", "--sbatch-opt", "-w n1"], "extra sbatch"),
        ("validate", ["--partition", "gpu"], "--partition: Slurm option(s), not read with"),
        ("validate", ["--partition", "gpu"], "ssh (the default); add --backend slurm"),
        ("up", ["--backend", "slurm", "--time", "1h"], "HH:MM:SS"),
        ("up", ["--exclusive", "--time", "5"], "--time, --exclusive: Slurm option(s)"),
    ],
)
def test_bad_slurm_options_exit_2(command: str, args: list[str], says: str, tmp_path) -> None:
    out = tmp_path / "out"
    args = [str(out) if a == "OUT" else a for a in args]
    r = pdl(command, REPO / "topologies" / "gb200-xpyd.yaml", *args)
    assert r.rc == 2 and says in r.stderr, r
    assert not out.exists()


def test_unknown_deployments(tmp_path: Path, state_dir: Path) -> None:
    r = pdl("status", "nope", "--backend", "slurm")
    assert r.rc == 1 and "nope: no Slurm job recorded" in r.stdout, r
    r = pdl("down", "nope", "--backend", "slurm")
    assert r.rc == 0 and "nope: nothing recorded; nothing to stop" in r.stdout, r
    r = pdl("logs", "nope", "router", "--backend", "slurm")
    assert r.rc == 1 and "no Slurm job is recorded for deployment 'nope'" in r.stderr, r
    r = pdl("status")
    assert r.rc == 2 and "no deployment is recorded" in r.stderr, r

    # Records of both backends: which one is meant must be said.
    d = state_dir / "both"
    d.mkdir(parents=True)
    (d / "state.json").write_text("{}")
    (d / "slurm.json").write_text("{}")
    r = pdl("status", "both")
    assert r.rc == 2 and "--backend ssh or --backend slurm" in r.stderr, r
    r = pdl("down", "both", "--backend", "slurm")
    assert r.rc == 1 and "slurm.json is damaged" in r.stderr, r


def test_list_deployments_finds_slurm_records(state_dir: Path) -> None:
    records = (("a", "slurm.json"), ("b", "state.json"), ("c", "lock"), ("d", "record.json"))
    for name, record in records:
        (state_dir / name).mkdir(parents=True)
        (state_dir / name / record).write_text("{}")
    assert list_deployments() == ["a", "b", "d"]
