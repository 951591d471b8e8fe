"""The same lifecycle scenarios against both runtimes, through the CLI in a process of its
own: SSH (every process on 127.0.0.1 forced through a real sshd, tests/support/sshd.py) and
Slurm (a real slurmctld with two slurmd nodes, tests/support/slurm_cluster.py), on the stand-in
engines and router (tests/support/fake_bins.py).

up, status and a second up that keeps what runs (adopt) / down / an engine that exits: rolled
back, nothing left, no record / SIGINT during up: exit 130, rolled back / kill -9 of pdlaunch
in the middle of up, then `down` finds and stops everything, or a second `up` adopts what the
first one started / status while a node does not answer: exit 1, that process named, no
traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pdlaunch.backends.slurm import jobs
from pdlaunch.backends.slurm.record import load_slurm
from pdlaunch.runtime.record_store import record_path
from tests.support import cli_runner
from tests.support.cli_runner import TRACEBACK, Run
from tests.support.processes import procs_under, wait_no_procs
from tests.support.slurm_specs import fake_spec
from tests.support.sshd import free_ports

REPO = Path(__file__).resolve().parents[3]


def pdl(*args: object, limit: float = 240.0) -> Run:
    return cli_runner.pdl(*args, limit=limit)


def spawn(*args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pdlaunch", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )


class World:
    """One runtime as the scenarios see it: a topology, the flags of `up`, and how to tell
    that `up` has started something."""

    backend: str
    up_flags: list[str]

    def __init__(self, tmp_path: Path, fake_bins: dict[str, Path]):
        self.tmp, self.bins = tmp_path, fake_bins

    def spec(self, name: str, work: Path, decode_env: dict) -> dict:
        raise NotImplementedError

    def topology(self, name: str, *, decode_env: dict | None = None) -> tuple[Path, Path]:
        work = self.tmp / f"work-{name}"
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(self.spec(name, work, decode_env or {}), sort_keys=False))
        return path, work

    def started(self, name: str) -> bool:
        raise NotImplementedError

    def record_file(self, name: str) -> Path:
        return record_path(name)  # one record file, whichever backend


def _ports() -> dict[str, int]:
    return free_ports("prefill", "decode", "side", "router", "metrics")


class SshWorld(World):
    backend = "ssh"

    def __init__(self, tmp_path, fake_bins, cluster, host):
        super().__init__(tmp_path, fake_bins)
        self.cluster, self.host = cluster, host
        # --skip-check: the preflight rightly refuses stand-in engines
        self.up_flags = ["--skip-check", "--known-hosts", str(cluster.known_hosts)]

    def spec(self, name: str, work: Path, decode_env: dict) -> dict:
        spec = fake_spec(name, work, ["127.0.0.1", "127.0.0.1"], self.bins, _ports(),
                         decode_env=decode_env)  # fmt: skip
        spec["decode"][0].pop("devices", None)
        for role in ("prefill", "decode"):
            spec[role][0]["bind"] = "127.0.0.1"
        spec["router"]["bind"] = "127.0.0.1"
        ssh = {"user": self.cluster.user, "port": self.host.port,
               "key": str(self.cluster.key_file), "connect_timeout": 5}  # fmt: skip
        spec["hosts"] = {"127.0.0.1": {"local": False, "ssh": ssh}}
        return spec

    def started(self, name: str) -> bool:
        path = self.record_file(name)
        if not path.is_file():
            return False
        with contextlib.suppress(ValueError):
            data = json.loads(path.read_text())
            return any(p.get("pid") for p in data["processes"] if p["role"] == "prefill")
        return False


class SlurmWorld(World):
    backend = "slurm"

    def __init__(self, tmp_path, fake_bins, cluster):
        super().__init__(tmp_path, fake_bins)
        self.cluster = cluster
        self.up_flags = ["--backend", "slurm", "--time", "10", "--start-timeout", "120"]

    def spec(self, name: str, work: Path, decode_env: dict) -> dict:
        return fake_spec(name, work, self.cluster.nodes, self.bins, _ports(),
                         decode_env=decode_env)  # fmt: skip

    def started(self, name: str) -> bool:
        with contextlib.suppress(Exception):
            rec = load_slurm(name)
            return rec is not None and jobs.job_info(rec.job_id).running
        return False

@pytest.fixture(params=["ssh", pytest.param("slurm", marks=pytest.mark.slurm)])
def world(request, tmp_path, fake_bins) -> World:
    if request.param == "ssh":
        cluster = request.getfixturevalue("sshd_cluster")
        host = request.getfixturevalue("sshd_host")
        return SshWorld(tmp_path, fake_bins, cluster, host)
    return SlurmWorld(tmp_path, fake_bins, request.getfixturevalue("slurm_cluster"))


def nothing_left(world: World, name: str, work: Path) -> None:
    assert wait_no_procs(work, timeout=20) == [], f"processes left under {work}"
    assert not world.record_file(name).exists(), "the record outlived its processes"


def wait_started(world: World, name: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not world.started(name):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "up never started anything"
        time.sleep(0.2)
    time.sleep(0.5)  # well inside the wait for health (the decode never answers)


# -- the scenarios --------------------------------------------------------------------------------
def test_up_status_adopt_down(world: World) -> None:
    path, work = world.topology("sc-up")
    r = pdl("up", path, *world.up_flags, "--timeout", "120", "--json")
    assert r.rc == 0, r
    first = r.json()
    assert first["ok"] and first["changed"] and first["backend"] == world.backend, r
    assert first["canary"]["ok"], first["canary"]
    try:
        r = pdl("status", "sc-up", "--json")
        st = r.json()
        assert r.rc == 0 and st["healthy"] and st["backend"] == world.backend, r
        assert st["endpoint"] == first["endpoint"]
        assert {x["process"] for x in st["processes"]} == {"prefill-0", "decode-0", "router"}
        assert all(x["health"] == "healthy" and x["alive"] for x in st["processes"]), st
        pids = sorted(procs_under(work))

        # The same topology again: what runs is kept (nothing restarted, nothing added).
        r = pdl("up", path, *world.up_flags, "--timeout", "60", "--json")
        again = r.json()
        assert r.rc == 0 and again["changed"] is False, r
        assert "already up and unchanged" in again["message"], again
        assert again["endpoint"] == first["endpoint"]
        if world.backend == "slurm":  # the same job (its steps' helpers come and go)
            assert again["job_id"] == first["job_id"]
        else:  # the same processes
            assert sorted(procs_under(work)) == pids

        r = pdl("logs", "sc-up", "prefill-0", "-n", "5")
        assert r.rc == 0 and r.stdout.strip(), r
    finally:
        r = pdl("down", "sc-up", "--json")
    assert r.rc == 0 and r.json()["ok"], r
    nothing_left(world, "sc-up", work)
    r = pdl("down", "sc-up")
    assert r.rc == 0 and "nothing recorded" in r.stdout, r  # idempotent


def test_an_engine_that_exits_rolls_back_and_leaves_nothing(world: World) -> None:
    path, work = world.topology("sc-exit", decode_env={"FAKE_VLLM_MODE": "exit"})
    r = pdl("up", path, *world.up_flags, "--timeout", "90", "--json")
    assert r.rc == 1, r
    data = r.json()
    assert data["rolled_back"] is True and data["backend"] == world.backend, data
    [decode] = [f for f in data["failures"] if f["process"] == "decode-0"]
    assert "exited during start" in decode["reason"], data
    assert "simulated engine failure" in decode["log_tail"], data  # its own log says why
    nothing_left(world, "sc-exit", work)
    r = pdl("status", "sc-exit")
    assert r.rc == 1 and "nothing recorded" in r.stdout, r


def test_sigint_during_up_rolls_back(world: World) -> None:
    path, work = world.topology("sc-int", decode_env={"FAKE_VLLM_MODE": "hang"})
    proc = spawn("up", path, *world.up_flags, "--timeout", "300")
    try:
        wait_started(world, "sc-int", proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (stdout, stderr)
    assert TRACEBACK not in stdout + stderr
    assert "interrupted by SIGINT: rolled back" in stderr, stderr
    nothing_left(world, "sc-int", work)


def test_down_after_kill_9_of_pdlaunch_in_the_middle_of_up(world: World) -> None:
    path, work = world.topology("sc-kill", decode_env={"FAKE_VLLM_MODE": "hang"})
    proc = spawn("up", path, *world.up_flags, "--timeout", "300")
    try:
        wait_started(world, "sc-kill", proc)
        proc.kill()  # SIGKILL: no rollback, whatever was started keeps running
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert procs_under(work), "nothing was running when pdlaunch was killed"
    r = pdl("down", "sc-kill", "--json")
    assert r.rc == 0 and r.json()["ok"], r
    nothing_left(world, "sc-kill", work)


def test_up_after_kill_9_of_pdlaunch_adopts_what_the_first_one_started(world: World) -> None:
    path, work = world.topology("sc-adopt", decode_env={"FAKE_VLLM_DELAY": "15"})
    proc = spawn("up", path, *world.up_flags, "--timeout", "300")
    try:
        wait_started(world, "sc-adopt", proc)
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = world.record_file("sc-adopt").read_text()
    engines = sorted(procs_under(work))
    try:
        r = pdl("up", path, *world.up_flags, "--timeout", "120", "--json")
        assert r.rc == 0 and r.json()["changed"] is True, r
        if world.backend == "slurm":  # the job the killed `up` submitted, not a second one
            assert r.json()["job_id"] == json.loads(before)["handle"]["job_id"], r
        else:  # the engines it started run on; only the router was started now
            assert set(engines) <= set(procs_under(work)), (engines, procs_under(work))
        st = pdl("status", "sc-adopt", "--json")
        assert st.rc == 0 and st.json()["healthy"], st
    finally:
        r = pdl("down", "sc-adopt")
    assert r.rc == 0, r
    nothing_left(world, "sc-adopt", work)


def test_status_names_the_process_whose_node_does_not_answer(world: World) -> None:
    path, work = world.topology("sc-mute")
    r = pdl("up", path, *world.up_flags, "--timeout", "120", "--canary-scope", "router")
    assert r.rc == 0, r
    stopped: list[int] = []
    try:
        st = pdl("status", "sc-mute", "--json").json()
        [decode] = [x for x in st["processes"] if x["process"] == "decode-0"]
        port = int(decode["health_url"].rsplit(":", 1)[1].split("/")[0])
        # The decode's node stops answering: every process of it frozen (SIGSTOP), so its
        # port accepts nothing and answers nothing, as a node that is gone.
        for pid in procs_under(work):
            if _listens(pid, port):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        assert stopped, "no process of the decode was found"
        r = pdl("status", "sc-mute", "--json", limit=120)
        assert r.rc == 1, r
        rows = {x["process"]: x for x in r.json()["processes"]}
        assert rows["decode-0"]["health"] != "healthy", rows
        assert rows["prefill-0"]["health"] == "healthy", rows
        r = pdl("status", "sc-mute", limit=120)
        assert r.rc == 1 and "decode-0" in r.stdout, r
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        r = pdl("down", "sc-mute")
    assert r.rc == 0, r
    nothing_left(world, "sc-mute", work)


def _listens(pid: int, port: int) -> bool:
    """Whether ``pid`` holds a listening socket on ``port`` (its fds against /proc/net/tcp)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                listening = cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port
                if listening and cols[9] in inodes:
                    return True
    return False


def test_status_with_an_unreachable_ssh_host_says_unknown_not_dead(
    tmp_path, fake_bins, sshd_cluster, sshd_hosts
) -> None:
    """SSH only (a Slurm status asks slurmctld, not the nodes): the host's sshd frozen, so
    a connection times out; status says "?" with the reason, never "dead", and exits 1."""
    [host] = sshd_hosts(1, fresh=True)
    world = SshWorld(tmp_path, fake_bins, sshd_cluster, host)
    path, work = world.topology("sc-unreach")
    r = pdl("up", path, *world.up_flags, "--timeout", "120", "--canary-scope", "router")
    assert r.rc == 0, r
    try:
        os.kill(host.pid, signal.SIGSTOP)
        try:
            r = pdl("status", "sc-unreach", "--json", limit=120)
        finally:
            os.kill(host.pid, signal.SIGCONT)
        assert r.rc == 1, r
        rows = r.json()["processes"]
        assert all(x["alive"] is None and x["error"] for x in rows), rows
    finally:
        r = pdl("down", "sc-unreach")
    assert r.rc == 0, r
    nothing_left(world, "sc-unreach", work)
    host.stop()
