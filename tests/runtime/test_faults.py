"""The fault suite for `pdlaunch up/down/status/logs` (issue 11, "How it is proven").

Black-box: pdlaunch runs as a real process (tests/runtime/fault_helpers.py), against stand-in
engines (tests/support/fake_vllm.py) and, where a scenario needs a remote host, a real sshd
(tests/support/sshd.py). Every scenario ends the same way: the exit code, a message that names the
cause (and, where something is left to act on, the next command), no traceback, no process
under the work dir that neither the state file nor a pid file points to, and nothing left
running after a final `pdlaunch down`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.runtime.fault_helpers import (
    ENGINES,
    NEXT_COMMAND,
    PLANNED,
    alive,
    finish,
    kill_group,
    lacks,
    no_traceback,
    pdl,
    pid_files,
    read_state,
    says,
    settle,
    spawn,
    state_path,
    state_pids,
    unaccounted,
    up_args,
    wait_for,
)
from tests.support.deployments import SECRET_ENV, Deployment
from tests.support.processes import procs_under, wait_no_procs
from tests.support.sshd import WRAPPER, descendants, free_port

HOST = r"127\.0\.0\.1"
# Engines that take this long to listen keep `up` in its health wait for a signal to land.
SLOW = {"FAKE_VLLM_DELAY": "5"}


def _ssh(cluster, h, **over) -> dict:
    d = {"user": cluster.user, "port": h.port, "key": str(cluster.key_file), "connect_timeout": 3}
    d.update(over)
    return d


def _cmdlines(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            cmd = "?"
        out.append(f"{pid}: {cmd.strip()}")
    return "; ".join(out)


def end_clean(dep: Deployment, tmp: Path, *down_args: object) -> None:
    """What every scenario ends with: nothing runs that nobody could find again, and `down`
    leaves nothing running."""
    left = unaccounted(dep)
    assert left == [], f"running, but in no record and no pid file: {_cmdlines(left)}"
    res = pdl("down", dep.path, "--grace", "2", *down_args, tmp=tmp)
    no_traceback(res)
    assert res.rc == 0, res
    left = wait_no_procs(dep.work_root, 15)
    assert left == [], f"still running after `down`: {_cmdlines(left)}\n{res}"


def _up_ok(dep: Deployment, tmp: Path, *extra: object) -> set[int]:
    res = pdl(*up_args(dep, *extra), tmp=tmp)
    assert res.rc == 0, res
    pids = state_pids(dep.name)
    assert len(pids) == PLANNED and pids == set(procs_under(dep.work_root)), res
    return pids


# -- 1-3: a re-`up` must never forget or misjudge what it cannot see ------------------------------
@pytest.mark.ssh
def test_reup_while_host_unreachable_keeps_record_and_engines(
    make_deployment, sshd_cluster, sshd_hosts, tmp_path
):
    h = sshd_hosts(1, fresh=True)[0]  # SIGSTOPped below: not the shared one
    known = sshd_cluster.write_known_hosts(tmp_path / "known_hosts", hosts=[h])
    dep = make_deployment("unreach", ssh=_ssh(sshd_cluster, h))
    before = _up_ok(dep, tmp_path, "--known-hosts", known)

    os.kill(h.pid, signal.SIGSTOP)  # the port still accepts; sshd never answers
    try:
        res = pdl(*up_args(dep, "--known-hosts", known), tmp=tmp_path, limit=90)
    finally:
        os.kill(h.pid, signal.SIGCONT)
    assert res.rc == 1, res
    says(res, HOST, r"(cannot|could not) (verify|check|tell)", NEXT_COMMAND)
    assert state_pids(dep.name) == before, "the record of a running deployment was changed"
    assert all(alive(pid) for pid in before)
    end_clean(dep, tmp_path)  # with the recorded known_hosts


@pytest.mark.ssh
def test_reup_with_changed_host_key_keeps_record_and_engines(
    make_deployment, sshd_cluster, sshd_hosts, tmp_path
):
    h = sshd_hosts(1, fresh=True)[0]  # gets a new host key below
    known = sshd_cluster.write_known_hosts(tmp_path / "known_hosts", hosts=[h])
    dep = make_deployment("rekeyed", ssh=_ssh(sshd_cluster, h))
    before = _up_ok(dep, tmp_path, "--known-hosts", known)

    h.rotate_host_key()
    assert all(alive(pid) for pid in before), "restarting sshd took the engines with it"
    # --known-hosts again: this case is about the changed key, not the recorded options (3)
    res = pdl(*up_args(dep, "--known-hosts", known), tmp=tmp_path)
    assert res.rc == 1, res
    says(res, HOST, r"host key", r"chang", NEXT_COMMAND)
    assert state_pids(dep.name) == before, "the record of a running deployment was changed"
    assert all(alive(pid) for pid in before)

    sshd_cluster.write_known_hosts(known, hosts=[h])  # the operator checked the new key
    end_clean(dep, tmp_path, "--known-hosts", known)


@pytest.mark.ssh
def test_reup_uses_the_recorded_ssh_options(make_deployment, sshd_cluster, sshd_host, tmp_path):
    known = sshd_cluster.write_known_hosts(tmp_path / "known_hosts", hosts=[sshd_host])
    dep = make_deployment("recorded", ssh=_ssh(sshd_cluster, sshd_host))
    before = _up_ok(dep, tmp_path, "--known-hosts", known)

    res = pdl(*up_args(dep), tmp=tmp_path)  # no --known-hosts: the recorded one must do
    assert res.rc == 0, res
    says(res, r"already up", r"unchanged")
    assert "not healthy" not in res.output, res
    assert state_pids(dep.name) == before
    end_clean(dep, tmp_path)


# -- 4: `up` killed with SIGKILL ------------------------------------------------------------------
KILL_STAGES = ("first-pid-file", "health-wait")


def _killable(make_deployment, name: str, stage: str) -> Deployment:
    slow = SLOW if stage == "health-wait" else {}
    return make_deployment(name, prefill_env=dict(slow), decode_env=dict(slow))


def _kill_up(dep: Deployment, stage: str, tmp: Path) -> list[int]:
    """Run `up` and SIGKILL it (and its session) at ``stage``; returns what then runs."""
    log = tmp / "killed-up.log"
    proc = spawn(up_args(dep), log)
    run = dep.work_dir / "run"

    def reached() -> bool:
        if proc.poll() is not None:
            return True
        if stage == "first-pid-file":
            return any(run.glob("*.pid"))
        return all((run / f"{n}.pid").is_file() for n in ENGINES)

    try:
        wait_for(reached, timeout=60, every=0.005)
    finally:
        kill_group(proc)
    assert proc.returncode == -signal.SIGKILL, f"`up` ended by itself:\n{log.read_text()}"
    if stage == "health-wait":
        assert not (run / "router.pid").exists(), "the kill came after the health wait"
    left = settle(dep.work_root)
    assert left, "nothing survived the kill: this case would prove nothing"
    return left


@pytest.mark.parametrize("stage", KILL_STAGES)
def test_down_by_name_after_up_was_killed_stops_everything(stage, make_deployment, tmp_path):
    dep = _killable(make_deployment, "k9down", stage)
    _kill_up(dep, stage, tmp_path)
    res = pdl("down", dep.name, "--grace", "2", tmp=tmp_path)
    no_traceback(res)
    assert res.rc == 0, res
    left = wait_no_procs(dep.work_root, 15)
    assert left == [], f"`down {dep.name}` left {_cmdlines(left)}\n{res}"
    end_clean(dep, tmp_path)


@pytest.mark.parametrize("stage", KILL_STAGES)
def test_up_again_after_up_was_killed_leaves_no_duplicates(stage, make_deployment, tmp_path):
    dep = _killable(make_deployment, "k9again", stage)
    _kill_up(dep, stage, tmp_path)
    res = pdl(*up_args(dep), tmp=tmp_path)
    no_traceback(res)
    assert res.rc == 0, res
    running = sorted(procs_under(dep.work_root))
    assert len(running) == PLANNED, f"{_cmdlines(running)}\n{res}"
    assert set(running) == state_pids(dep.name), f"not all recorded: {_cmdlines(running)}"
    end_clean(dep, tmp_path)


# -- 5, 6: signals during the health wait ---------------------------------------------------------
def _up_in_health_wait(dep: Deployment, tmp: Path) -> tuple[subprocess.Popen, Path, float]:
    log = tmp / "signalled-up.log"
    t0 = time.monotonic()
    proc = spawn(up_args(dep), log)
    run = dep.work_dir / "run"
    waiting = wait_for(
        lambda: proc.poll() is not None or all((run / f"{n}.pid").is_file() for n in ENGINES),
        timeout=60,
        every=0.01,
    )
    if not waiting or proc.poll() is not None:
        kill_group(proc)
        pytest.fail(f"`up` never reached its health wait:\n{log.read_text()}")
    return proc, log, t0


def _claims_all_stopped(out: str) -> bool:
    return bool(
        re.search(r"everything[^\n]*\b(was|were|is)\s+stopped", out, re.IGNORECASE)
        or re.search(r"^\W*rolled back\b", out, re.IGNORECASE | re.MULTILINE)
    )


def test_second_sigint_during_rollback_is_told_truthfully(make_deployment, tmp_path):
    dep = make_deployment("sigint2", prefill_env=dict(SLOW), decode_env=dict(SLOW))
    proc, log, t0 = _up_in_health_wait(dep, tmp_path)
    names = {pid: name for name, pid in pid_files(dep).items()}
    try:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the foreground group
        time.sleep(0.05)  # the rollback is under way
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        res = finish(proc, log, t0, limit=90)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    left = wait_no_procs(dep.work_root, 1.0)  # a SIGKILLed engine needs a moment to go
    no_traceback(res)
    assert res.rc not in (0, None), res
    if left:
        assert not _claims_all_stopped(res.output), (
            f"claims everything stopped, but {_cmdlines(left)} run\n{res}"
        )
        unnamed = [p for p in left if names.get(p, str(p)) not in res.output]
        unnamed = [p for p in unnamed if str(p) not in res.output]
        assert not unnamed, f"still running but not named: {_cmdlines(unnamed)}\n{res}"
        says(res, r"pdlaunch down")
    end_clean(dep, tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_during_health_wait_rolls_back(sig, make_deployment, tmp_path):
    dep = make_deployment("sig" + sig.name.lower(), prefill_env=dict(SLOW), decode_env=dict(SLOW))
    proc, log, t0 = _up_in_health_wait(dep, tmp_path)
    try:
        os.kill(proc.pid, sig)
        res = finish(proc, log, t0, limit=90)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    assert res.rc not in (0, None), res
    says(res, r"roll(ing|ed) back", sig.name)
    left = wait_no_procs(dep.work_root, 10)
    assert left == [], f"left running: {_cmdlines(left)}\n{res}"
    assert not state_path(dep.name).exists(), "a rolled-back deployment is still recorded"
    end_clean(dep, tmp_path)


# -- 7: a host that accepts the login, then hangs on uploads --------------------------------------
HANG_WRAPPER = """#!/bin/sh
# A simulated host that accepts the login and then hangs on uploads: what writes a file
# (mktemp, cat, dd, head, tee; sftp) never returns, anything else works.
cd "$HOME" || exit 1
PATH={bin}:$PATH; export PATH
case $SSH_ORIGINAL_COMMAND in *sftp*) echo sftp >> {hits}; exec sleep 1000;; esac
if [ -n "$SSH_ORIGINAL_COMMAND" ]; then
    exec "${{SHELL:-/bin/sh}}" -c "$SSH_ORIGINAL_COMMAND"
fi
exec "${{SHELL:-/bin/sh}}" -l
"""


@pytest.mark.ssh
def test_upload_that_hangs_ends_at_the_timeout(make_deployment, sshd_cluster, sshd_hosts, tmp_path):
    h = sshd_hosts(1, fresh=True)[0]  # its session wrapper is replaced below
    hang_bin = tmp_path / "hang-bin"
    hang_bin.mkdir()
    hits = tmp_path / "hang-hits"
    for tool in ("mktemp", "cat", "dd", "head", "tee"):
        f = hang_bin / tool
        f.write_text(f"#!/bin/sh\necho {tool} >> {hits}\nexec sleep 1000\n")
        f.chmod(0o755)
    wrapper = h.dir / "session.sh"  # sshd reads its ForceCommand anew for every session
    known = sshd_cluster.write_known_hosts(tmp_path / "known_hosts", hosts=[h])
    dep = make_deployment("hangup", ssh=_ssh(sshd_cluster, h))
    try:
        wrapper.write_text(HANG_WRAPPER.format(bin=hang_bin, hits=hits))
        res = pdl(*up_args(dep, "--known-hosts", known, timeout=20), tmp=tmp_path, limit=50)
        wrapper.write_text(WRAPPER)
        for pid in descendants(h.pid):  # the hung upload commands
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert hits.exists(), f"no upload command hung: the case did not happen\n{res}"
        assert res.rc == 1, res
        says(res, HOST, r"time[sd]? ?out|timeout|deadline", r"\b20(\.0+)? ?(s|sec|seconds)\b")
        left = wait_no_procs(dep.work_root, 10)
        assert left == [], _cmdlines(left)
        end_clean(dep, tmp_path, "--known-hosts", known)
    finally:
        wrapper.write_text(WRAPPER)
        h.stop()


# -- 8: a corrupted state file --------------------------------------------------------------------
# kind -> (process, field, value) written into the state after a real `up`; None: the whole
# file is damaged.
CORRUPTIONS: dict[str, tuple[str, str, object] | None] = {
    "pid-abc": ("prefill-0", "pid", "abc"),
    "pid-1": ("prefill-0", "pid", 1),
    "pid-negative": ("prefill-0", "pid", -5),
    "start-time-null": ("decode-0", "start_time", None),
    "truncated": None,
    "list": None,
}


def _corrupt(path: Path, kind: str) -> list[str]:
    """Damage the state file; returns regexes the messages must hold to name the bad field."""
    raw = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
        return []
    if kind == "list":
        path.write_text("[]")
        return []
    entry = CORRUPTIONS[kind]
    assert entry is not None
    name, key, value = entry
    data = json.loads(raw)
    [proc] = [p for p in data["processes"] if p["name"] == name]
    proc[key] = value
    path.write_text(json.dumps(data, indent=2))
    named = [re.escape(key)]
    if value in ("abc", -5):
        named.append(re.escape(str(value)))
    return named


def _init_alive() -> None:
    os.kill(1, 0)  # raises if pid 1 were gone; the product must never signal it


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupted_state_is_named_and_down_file_still_stops_everything(
    kind, make_deployment, tmp_path
):
    dep = make_deployment("corrupt")
    _up_ok(dep, tmp_path)
    sf = state_path(dep.name)
    field_named = _corrupt(sf, kind)
    state_named = re.escape(str(sf))
    # All three commands are judged before failing: which of them mishandles it is the news.
    problems: list[str] = []

    res = pdl("status", dep.name, tmp=tmp_path)
    _init_alive()
    # A missing start time may instead be re-established by verifying the process (its log
    # open as stdout); then status has nothing to complain about.
    damaged = not (kind == "start-time-null" and res.rc == 0)
    if damaged:
        if res.rc != 1:
            problems.append(f"`status NAME` should exit 1\n{res}")
        problems += lacks(res, state_named, *field_named, r"pdlaunch down")

    res = pdl("down", dep.name, "--grace", "2", tmp=tmp_path)
    _init_alive()
    problems += lacks(res, *([state_named, *field_named] if damaged else []))
    left = wait_no_procs(dep.work_root, 2)
    if left and res.rc == 0:
        problems.append(f"`down NAME` exit 0 while {_cmdlines(left)} still run\n{res}")
    if left:
        problems += lacks(res, r"pdlaunch down")

    still_recorded = sf.exists()
    res = pdl("down", dep.path, "--grace", "2", tmp=tmp_path)
    _init_alive()
    if res.rc != 0:
        problems.append(f"`down FILE` should exit 0\n{res}")
    problems += lacks(res, *([state_named] if still_recorded and damaged else []))
    left = wait_no_procs(dep.work_root, 15)
    if left:
        problems.append(f"`down FILE` left {_cmdlines(left)}\n{res}")
    assert not problems, "\n\n".join(problems)
    end_clean(dep, tmp_path)


# -- 9: a work dir someone else controls ----------------------------------------------------------
NOBODY = 65534


@pytest.mark.parametrize("kind", ["owned-by-other", "world-writable", "symlink-in-run"])
def test_hostile_work_dir_is_refused(kind, make_deployment, tmp_path):
    dep = make_deployment("hostile")
    d = dep.work_dir
    d.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    content = "victim " + os.urandom(8).hex() + "\n"
    victim.write_text(content)
    if kind == "owned-by-other":
        os.chown(d, NOBODY, NOBODY)
        bad, cause = d, rf"{NOBODY}|nobody"
    elif kind == "world-writable":
        os.chmod(d, 0o777)
        bad, cause = d, r"writable|777"
    else:
        os.chmod(d, 0o755)
        bad = d / "run"
        bad.mkdir()
        os.chmod(bad, 0o777)  # whoever can write here planted the link
        (bad / "prefill-0.pid.tmp").symlink_to(victim)
        cause = r"writable|777"

    res = pdl(*up_args(dep, timeout=30), tmp=tmp_path)
    assert victim.read_text() == content, "up wrote through a planted symlink"
    assert res.rc == 1, res
    says(res, re.escape(str(bad)), cause)
    assert procs_under(dep.work_root) == [], res
    assert pid_files(dep) == {}
    assert read_state(dep.name) is None, "nothing started, yet something is recorded"
    end_clean(dep, tmp_path)


# -- 10: what the started processes inherit -------------------------------------------------------
def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def test_started_processes_inherit_no_control_host_variables(make_deployment, tmp_path):
    canary = "canary-" + os.urandom(8).hex()
    secret = "engine-only-" + os.urandom(8).hex()
    ref = {"HF_TOKEN": "${env:" + SECRET_ENV + "}"}
    dep = make_deployment("envleak", prefill_env=dict(ref), decode_env=dict(ref))
    env = {"PDLAUNCH_LEAK_CANARY": canary, SECRET_ENV: secret}
    res = pdl(*up_args(dep), tmp=tmp_path, env=env)
    assert res.rc == 0, res

    pids = procs_under(dep.work_root)
    assert len(pids) >= PLANNED
    for pid in pids:
        leaked = [v for v in _environ(pid) if canary.encode() in v]
        assert not leaked, f"{_cmdlines([pid])} inherited PDLAUNCH_LEAK_CANARY"
    by_name = {p["name"]: p["pid"] for p in read_state(dep.name)["processes"]}
    for name in ENGINES:  # the engines do get the secret: reading environ works
        assert f"HF_TOKEN={secret}".encode() in _environ(by_name[name]), name
    router_env = b"\0".join(_environ(by_name["router"]))
    assert secret.encode() not in router_env, "the router got a secret meant for the engines"
    end_clean(dep, tmp_path)


# -- 11: `logs -f` through a huge line ------------------------------------------------------------
def test_follow_yields_a_short_line_after_a_50mb_line(make_deployment, tmp_path):
    from pdlaunch.backends.ssh.runtime import SshRuntime
    from pdlaunch.runtime import lifecycle

    dep = make_deployment("biglog")
    _up_ok(dep, tmp_path)
    [decode] = [p for p in read_state(dep.name)["processes"] if p["name"] == "decode-0"]
    marker = "short-line-" + os.urandom(6).hex()
    stop = threading.Event()
    started, seen = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            lines = lifecycle.logs(
                SshRuntime(), dep.name, "decode-0", lines=5, follow=True, stop=stop
            )
            with contextlib.closing(lines):
                for line in lines:
                    started.set()
                    if line == marker:
                        seen.set()
                        return
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)
        finally:
            started.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    try:
        assert started.wait(30) and not errors, errors
        with open(decode["log_path"], "ab") as f:
            f.write(b"x" * 50_000_000 + b"\n" + marker.encode() + b"\n")
        t0 = time.monotonic()
        got = seen.wait(10)
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join(15)
    assert not errors, errors
    assert got, f"the short line after a 50 MB line was not yielded within 10 s ({took:.1f}s)"
    assert not t.is_alive(), "follow did not stop when asked"
    end_clean(dep, tmp_path)


# -- 12, 13 ---------------------------------------------------------------------------------------
def test_down_of_an_unknown_name_creates_nothing(state_dir, tmp_path):
    name = "some-name-never-used"
    res = pdl("down", name, tmp=tmp_path)
    assert res.rc == 0, res
    says(res, r"nothing recorded")
    assert not (state_dir / name).exists(), "down created state for a name never used"
    assert not state_dir.exists() or not any(state_dir.iterdir()), list(state_dir.iterdir())


def _two_hosts_topology(path: Path, prefill_host: str) -> Path:
    side = free_port()
    spec = {
        "deployment": "twolocals",
        "model": {"name": "fake-model"},
        "defaults": {"work_dir": str(path.parent / "work")},
        "hosts": {"127.0.0.2": {"local": False, "ssh": {"user": "root", "port": free_port()}}},
        "prefill": [
            {
                "host": prefill_host,
                "device": "cpu",
                "port": free_port(),
                "bind": prefill_host,
                "side_channel_port": side,
            }
        ],
        "decode": [
            {
                "host": "127.0.0.1",
                "device": "cpu",
                "port": free_port(),
                "bind": "127.0.0.1",
                "side_channel_port": side,
            }
        ],
        "router": {"host": "127.0.0.1", "bind": "127.0.0.1", "port": free_port()},
    }
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def _validate(path: Path) -> tuple[int, list[str], str]:
    res = subprocess.run(
        [sys.executable, "-m", "pdlaunch", "validate", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in res.stderr, res.stderr
    rules = [f["rule"] for f in json.loads(res.stdout).get("findings", [])]
    return res.returncode, rules, res.stdout + res.stderr


def test_loopback_alias_over_ssh_is_another_host_for_ports(tmp_path):
    # Control: both on this host, one side-channel port: the clash is real and reported.
    rc, rules, out = _validate(_two_hosts_topology(tmp_path / "same.yaml", "127.0.0.1"))
    assert rc == 1 and "port-conflict" in rules, out
    # 127.0.0.2 is declared `local: false` (reached over SSH): another machine's port.
    rc, rules, out = _validate(_two_hosts_topology(tmp_path / "two.yaml", "127.0.0.2"))
    assert "port-conflict" not in rules, out
    assert rc == 0, out
    assert procs_under(tmp_path / "work") == []
