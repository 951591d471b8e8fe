"""The Slurm backend under faults and hostile input, with stand-in Slurm commands that record
every call (pdlaunch.testing.FakeSlurm): unsafe work dirs, links at log paths, sbatch refusing
the job, an engine port answering garbage, an interrupt, a record naming another job or a
file outside the deployment, a record of the wrong shape. Each case failed before the
hardening of issue 26 (the job left allocated, secrets left behind, a stranger's job
cancelled, a file deleted, a traceback)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm import jobs
from pdlaunch.plan.build import Plan
from pdlaunch.runtime import lifecycle
from pdlaunch.runtime.state import StateError
from pdlaunch.testing import FakeSlurm
from tests.support import slurm_lifecycle as slurm_rt
from tests.support.slurm_specs import REPO, fake_spec, planned
from tests.support.sshd import free_ports

SECRET = "s3cr3t-value-" + os.urandom(4).hex()
TRACEBACK = "Traceback (most recent call last)"


def _plan(tmp_path: Path, fake_bins, name: str = "hard", secret: bool = True) -> Plan:
    ports = free_ports("prefill", "decode", "side", "router", "metrics")
    # Both engines on one node: one component, so the fake squeue's single line is the job.
    spec = fake_spec(name, tmp_path / "work", ["n1", "n1"], fake_bins, ports)
    if secret:
        spec["prefill"][0]["env"]["HF_TOKEN"] = "${env:PDL_TEST_SECRET}"
    return planned(spec, tmp_path / f"{name}.yaml")[2]


def _environ() -> dict[str, str]:
    return {**os.environ, "PDL_TEST_SECRET": SECRET}


def _secrets(plan: Plan) -> list[Path]:
    return [Path(p.secrets_path) for p in plan.processes if p.secret_env]


def _opts() -> slurm.SlurmOptions:
    return slurm.SlurmOptions(time="10", start_timeout=30)


# -- 2: one work-dir check, no links, secrets never left behind, % escaped ------------------------
@pytest.mark.parametrize("kind", ["world-writable", "symlink", "parent-writable"])
def test_an_unsafe_work_dir_is_refused_before_anything_is_written(
    kind, fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, fake_bins)
    work = Path(plan.router.work_dir)
    if kind == "world-writable":
        work.mkdir(parents=True)
        work.chmod(0o777)
    elif kind == "symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        work.parent.mkdir(parents=True)
        work.symlink_to(elsewhere)
    else:
        work.parent.mkdir(parents=True)
        work.parent.chmod(0o777)  # not sticky: anyone could rename our dir away
    with pytest.raises(jobs.SlurmRunError, match="unsafe work directory") as err:
        jobs.submit(plan, _opts(), _environ())
    assert str(work.parent if kind == "parent-writable" else work) in str(err.value)
    assert fake_slurm.calls("sbatch") == []
    written = [p for p in (tmp_path / "work").rglob("*") if p.is_file()]
    if kind == "symlink":
        written += [p for p in (tmp_path / "elsewhere").rglob("*") if p.is_file()]
    assert written == [], written
    assert jobs.load_slurm("hard") is None


def test_links_at_log_paths_are_removed_not_followed(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    """A dangling link at a log path (srun appends through one) and at the driver log the
    next job id will get, planted before the dir was made private: both go."""
    plan = _plan(tmp_path, fake_bins)
    logs = Path(plan.router.log_path).parent
    logs.mkdir(parents=True, mode=0o700)
    Path(plan.router.work_dir).chmod(0o700)
    Path(plan.router.work_dir, "run").mkdir(mode=0o700)
    target = tmp_path / "not-yet-there"
    Path(plan.router.log_path).symlink_to(target)
    (logs / "slurm-4242.log").symlink_to(target)
    old = Path(plan.by_role("prefill")[0].log_path)
    old.write_text("earlier run\n")
    jobs.submit(plan, _opts(), _environ())
    assert not os.path.lexists(plan.router.log_path)
    assert not os.path.lexists(logs / "slurm-4242.log")
    assert not target.exists()
    assert Path(f"{old}.prev").read_text() == "earlier run\n"
    # Reading a log never follows a link either (`logs`, and the tails a failed `up` shows).
    Path(plan.router.log_path).symlink_to(tmp_path / "hard.yaml")
    assert "symbolic link" in jobs.tail(plan.router.log_path)
    with pytest.raises(lifecycle.LaunchError, match="symbolic link"):
        slurm_rt.logs("hard", "router")


def test_sbatch_refusing_the_job_leaves_no_secrets_and_no_record(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, fake_bins)
    fake_slurm.update(sbatch={"rc": 1, "stderr": "sbatch: error: invalid partition specified"})
    with pytest.raises(jobs.SlurmRunError, match="invalid partition"):
        jobs.submit(plan, _opts(), _environ())
    assert len(fake_slurm.calls("sbatch")) == 1
    assert _secrets(plan) and not any(p.exists() for p in _secrets(plan))
    assert jobs.load_slurm("hard") is None


def test_an_unparsable_sbatch_answer_leaves_no_secrets(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, fake_bins)
    fake_slurm.update(sbatch={"answer": "Submitted batch job x"})
    with pytest.raises(jobs.SlurmRunError, match="not a job id"):
        jobs.submit(plan, _opts(), _environ())
    assert not any(p.exists() for p in _secrets(plan))


def test_a_job_that_cannot_be_recorded_is_cancelled(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path, monkeypatch
) -> None:
    plan = _plan(tmp_path, fake_bins)

    def no_disk(rec):
        raise StateError("cannot write the Slurm record: No space left on device")

    monkeypatch.setattr(jobs, "save_slurm", no_disk)
    with pytest.raises(StateError):
        jobs.submit(plan, _opts(), _environ())
    assert fake_slurm.jobs == {}
    [call] = fake_slurm.calls("scancel")
    assert call[-1] == "4242" and "--name=pdlaunch-hard" in call
    assert not any(p.exists() for p in _secrets(plan))


def test_percent_in_a_work_dir_reaches_slurm_escaped(fake_bins, tmp_path: Path) -> None:
    ports = free_ports("prefill", "decode", "side", "router", "metrics")
    spec = fake_spec("pct", tmp_path / "a%jb", ["n1", "n2"], fake_bins, ports)
    plan = planned(spec, tmp_path / "t.yaml")[2]
    script = slurm.sbatch_script(plan, _opts())
    work = f"{tmp_path}/a%%jb/pct"
    assert f"#SBATCH --output={work}/logs/slurm-%j.log" in script
    outputs = [w for w in script.split() if w.startswith("--output=")]
    # The driver's own (#SBATCH) and each step's (srun): three processes.
    assert len(outputs) == 4 and all(w.startswith(f"--output={work}/logs/") for w in outputs)
    rec = jobs.record_of(plan, "77")
    assert rec.driver_log == f"{tmp_path}/a%jb/pct/logs/slurm-77.log"
    # A backslash would switch Slurm's patterns off and be dropped: refused.
    spec = fake_spec("bs", tmp_path / "a\\b", ["n1", "n2"], fake_bins, ports)
    plan = planned(spec, tmp_path / "t2.yaml")[2]
    with pytest.raises(slurm.SlurmError, match="backslash"):
        slurm.sbatch_script(plan, _opts())


@pytest.mark.parametrize("kind", ["group-writable", "link", "other-owner"])
def test_the_node_runner_runs_only_our_own_scripts(kind, tmp_path: Path) -> None:
    script = tmp_path / "proc.sh"
    marker = tmp_path / "ran"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    run = script
    if kind == "group-writable":
        script.chmod(0o775)
    elif kind == "link":
        run = tmp_path / "link.sh"
        run.symlink_to(script)
    elif os.getuid() == 0:
        os.chown(script, 65534, 65534)  # nobody's
    else:
        run = Path("/bin/true")  # root's, not ours
    res = subprocess.run(
        ["bash", "-c", slurm.node_runner(), "pdlaunch-node", str(run), "-", "-", "-"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 96, res
    assert "refusing to run" in res.stderr
    assert not marker.exists()
    # The router's step goes through the node runner too.
    plan_script = [ln for ln in slurm.node_runner().splitlines() if ln.startswith("s=")]
    assert plan_script == ["s=$script"]


# -- 3: up cancels on any failure; down checks the job and the record ------------------------------
class _Garbage:
    """A TCP server answering anything with a line that is not HTTP."""

    def __init__(self, port: int):
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2 not http\r\n\r\n")

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def test_an_engine_port_answering_garbage_fails_up_and_cancels_the_job(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, fake_bins)
    prefill = plan.by_role("prefill")[0]
    port = int(prefill.health_url.rsplit(":", 1)[1].split("/")[0])
    server = _Garbage(port)
    try:
        # 10 s: the decode (nothing runs it under the stand-in Slurm) is waited for until the
        # deadline too, and every process not healthy then is named.
        res = slurm_rt.up(plan, _opts(), timeout=10, canary=False, environ=_environ())
    finally:
        server.close()
    assert not res.ok and res.error.rolled_back, res.message
    [prefill] = [f for f in res.error.failures if f.name == "prefill-0"]
    # Its last answer: garbage, or (a loaded host, the last probe at the deadline gets 0.2 s)
    # none in time; the CLI case below pins the garbage message itself.
    assert f"127.0.0.1:{port}/health" in prefill.reason, res.error.failures
    assert "not an HTTP answer" in prefill.reason or "no complete answer" in prefill.reason
    assert fake_slurm.jobs == {}, "the job was left allocated"
    [call] = fake_slurm.calls("scancel")
    assert call[1:] == ["--name=pdlaunch-hard", f"--user={fake_slurm.user}", res.job_id]
    assert not any(p.exists() for p in _secrets(plan))
    assert jobs.load_slurm("hard") is None  # proven gone: nothing left to record


@pytest.mark.parametrize("exc", [RuntimeError("a bug"), KeyboardInterrupt()])
def test_any_exception_in_up_cancels_the_job(
    exc, fake_slurm: FakeSlurm, fake_bins, tmp_path: Path, monkeypatch
) -> None:
    plan = _plan(tmp_path, fake_bins)

    def boom(*args, **kwargs):
        raise exc

    monkeypatch.setattr(jobs, "wait_running", boom)
    if isinstance(exc, KeyboardInterrupt):  # the lifecycle's contract: Interrupted, rolled back
        res = slurm_rt.up(plan, _opts(), timeout=5, environ=_environ())
        assert isinstance(res.error, lifecycle.Interrupted) and res.error.rolled_back, res
    else:  # a bug keeps its traceback, once the job is cancelled
        with pytest.raises(RuntimeError, match="a bug"):
            slurm_rt.up(plan, _opts(), timeout=5, environ=_environ())
    assert fake_slurm.jobs == {}
    assert len(fake_slurm.calls("scancel")) == 1
    assert not any(p.exists() for p in _secrets(plan))
    assert jobs.load_slurm("hard") is None
    assert slurm_rt.down("hard").ok


def _record(plan: Plan, job_id: str = "4242") -> Path:
    jobs.save_slurm(jobs.record_of(plan, job_id))
    return jobs.record_path(plan.deployment)


@pytest.mark.parametrize("who", ["name", "user", "workdir"])
def test_down_never_cancels_a_job_that_is_not_the_deployments(
    who, fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, fake_bins)
    job = {"name": "pdlaunch-hard", "user": fake_slurm.user, "workdir": plan.router.work_dir}
    job[who] = {"name": "training-run", "user": "someone", "workdir": "/scratch/x"}[who]
    fake_slurm.add_job("777", **job)
    path = _record(plan, "777")
    res = slurm_rt.down("hard")
    assert not res.ok and "not this deployment's job" in res.message, res
    assert "it was not cancelled" in res.message and "squeue -u" in res.message
    assert fake_slurm.calls("scancel") == []
    assert "777" in fake_slurm.jobs and path.exists()
    # Nor does status show the stranger's job as this deployment's.
    with pytest.raises(lifecycle.LaunchError, match="not this deployment's job"):
        slurm_rt.status("hard")


def test_down_deletes_no_file_outside_the_deployment(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, fake_bins)
    fake_slurm.add_job("4242", name="pdlaunch-hard", workdir=plan.router.work_dir)
    path = _record(plan)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    data = json.loads(path.read_text())
    data["processes"][0]["handle"]["secrets_path"] = str(victim)
    path.write_text(json.dumps(data))
    res = slurm_rt.down("hard")
    msg = res.message
    assert not res.ok
    assert str(path) in msg and "processes[0].secrets_path" in msg
    assert "does not delete" in msg and "scancel -u" in msg
    assert victim.read_text() == "keep me\n"


# A record of the wrong shape: (where, value) written into the record (format 2), and the
# field the message must name.
DAMAGE = {
    "port-string": (("processes", 0, "handle", "port"), "8000", "processes[0].handle.port"),
    "component-bool": (
        ("processes", 1, "handle", "component"), True, "processes[1].handle.component"
    ),
    "processes-dict": (("processes",), {"a": 1}, "processes"),
    "job-id-int": (("handle", "job_id"), 4242, "handle.job_id"),
    "job-id-words": (("handle", "job_id"), "4242 4243", "job_id '4242 4243'"),
    "components-str": (("handle", "components"), "n1", "handle.components"),
    "missing-log": (("processes", 0, "log_path"), None, "processes[0].log_path"),
    "job-id-arabic-digits": (("handle", "job_id"), "\u0664\u0662", "job_id"),
    "another-deployment": (("deployment",), "other", "deployment is 'other'"),
}


def _set(data, where, value):
    for key in where[:-1]:
        data = data[key]
    if value is None:
        del data[where[-1]]
    else:
        data[where[-1]] = value


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_record_is_named_never_a_traceback(
    kind, fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, fake_bins)
    path = _record(plan)
    where, value, field = DAMAGE[kind]
    data = json.loads(path.read_text())
    _set(data, where, value)
    path.write_text(json.dumps(data))
    with pytest.raises(StateError) as err:
        jobs.load_slurm("hard")
    assert str(path) in str(err.value) and field in str(err.value), err.value
    assert "extra inputs" not in str(err.value)  # the damage hit a field the record has
    for args in (["status", "hard"], ["logs", "hard", "router"], ["down", "hard"]):
        res = subprocess.run(
            [sys.executable, "-m", "pdlaunch", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        out = res.stdout + res.stderr
        assert TRACEBACK not in out, out
        assert res.returncode == 1, (args, out)
        assert field in out and "scancel" in out, (args, out)
    assert fake_slurm.calls("scancel") == []


def test_the_cli_up_says_why_and_leaves_no_job_when_a_port_answers_garbage(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, fake_bins, secret=False)
    port = int(plan.by_role("prefill")[0].health_url.rsplit(":", 1)[1].split("/")[0])
    argv = ["up", str(tmp_path / "hard.yaml"), "--backend", "slurm", "--timeout", "4"]
    server = _Garbage(port)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "pdlaunch", *argv, "--no-canary"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    finally:
        server.close()
    out = res.stdout + res.stderr
    assert res.returncode == 1 and TRACEBACK not in out, out
    # the hardened HTTP client names what came back instead of http.client's exception
    assert "prefill-0 on" in out and "not an HTTP answer" in out, out
    assert f"127.0.0.1:{port}/health" in out and "rolled back" in out, out
    assert fake_slurm.jobs == {} and len(fake_slurm.calls("scancel")) == 1


@pytest.mark.parametrize("kind", ["fifo", "device", "sparse"])
def test_a_job_log_that_is_no_log_is_read_bounded(tmp_path: Path, kind: str) -> None:
    # issue 32: a FIFO at a log's path blocked `logs` at open(); a device (a real /dev/zero
    # node) was read without end; a 1 GiB file of NULs is read from its last 64 KiB only.
    log = tmp_path / "router.log"
    if kind == "fifo":
        os.mkfifo(log)
    elif kind == "device":
        os.mknod(log, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    else:
        with open(log, "wb") as f:
            f.truncate(1 << 30)
            f.seek(0, os.SEEK_END)
            f.write(b"\nthe end\n")
    done: list[str] = []
    reader = threading.Thread(target=lambda: done.append(jobs.tail(str(log), 3)), daemon=True)
    reader.start()
    reader.join(10)
    assert done, "reading the log blocked"
    if kind == "sparse":
        assert done[0].endswith("the end") and len(done[0]) <= jobs.TAIL_BYTES
    else:
        assert done[0] == f"(cannot read {log}: not a regular file)"


def test_the_doctor_reads_job_scripts_bounded_and_never_through_a_link(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    # issue 32: the doctor read each job script whole and through links: a FIFO planted in
    # the work dir hung it, a link put any file of the user's into the shared bundle.
    from pdlaunch.backends.slurm.doctor import SCRIPT_MAX_BYTES, slurm_state
    from pdlaunch.runtime import record_store

    plan = _plan(tmp_path, fake_bins, name="docreads", secret=False)
    jobs.submit(plan, _opts(), _environ())
    rec = record_store.find(plan.deployment, place=False)
    assert rec is not None and rec.native is not None
    prefill, decode, router = (rec.native.process(p.name).script_path for p in rec.processes)
    private = tmp_path / "private"
    private.write_text("the user's own secret\n")
    for path in (prefill, decode, router):
        os.unlink(path)
    os.mkfifo(prefill)
    Path(decode).symlink_to(private)
    with open(router, "wb") as f:
        f.truncate(SCRIPT_MAX_BYTES + 1)
    done: list = []
    reader = threading.Thread(target=lambda: done.append(slurm_state(rec)), daemon=True)
    reader.start()
    reader.join(10)
    assert done, "the doctor blocked reading a job script"
    scripts = done[0].scripts
    assert Path(rec.native.script).name in scripts  # the driver, as pdlaunch wrote it
    assert not {Path(p).name for p in (prefill, decode, router)} & set(scripts)
    assert "secret" not in "".join(scripts.values())
