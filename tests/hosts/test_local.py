"""Host behaviour, run against both implementations: LocalHost and SshHost (real sshd).

Both "hosts" live on this machine, so the tests check results with local tools (ps, stat) too.
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdlaunch.hosts import (
    CommandError,
    CommandTimeout,
    Host,
    HostError,
    LocalHost,
    SshHost,
    UnsafePathError,
    Upload,
    is_local_address,
    open_host,
)


@dataclass
class Case:
    host: Host
    home: Path  # what ~ means on that host


@pytest.fixture(scope="module")
def _shared_ssh(sshd_host, ssh_settings, ssh_client_config, sshd_cluster):
    host = open_host(
        sshd_host.host,
        ssh=ssh_settings(sshd_host),
        force_ssh=True,
        ssh_config_file=ssh_client_config,
        known_hosts=sshd_cluster.known_hosts,
    )
    yield host
    host.close()


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def case(request, tmp_path, monkeypatch) -> Case:
    if request.param == "local":
        home = tmp_path / "home"
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        host = LocalHost("127.0.0.1")
        yield Case(host, home)
        host.close()
    else:
        host = request.getfixturevalue("_shared_ssh")
        yield Case(host, request.getfixturevalue("sshd_host").home)


def live_group(pgid: int) -> list[str]:
    """Live (non-zombie) processes of a process group, as `ps` sees them."""
    out = subprocess.run(
        ["ps", "-wweo", "pid=,pgid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    rows = []
    for line in out.splitlines():
        pid, pg, st, *args = line.split(None, 3)
        if int(pg) == pgid and not st.startswith("Z"):
            rows.append(f"{pid} {st} {' '.join(args)}")
    return rows


def start_time_of(pid: int) -> int | None:
    """A live process's start time (/proc/PID/stat field 22), None when it is gone or a
    zombie: both hosts run on this machine, so /proc here is the truth."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X", "x") else int(fields[19])


def wait_for(pred, timeout: float = 20.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


# -- address handling ---------------------------------------------------------------------------
@pytest.mark.parametrize("address", ["127.0.0.1", "localhost", "::1", "[::1]", "LocalHost"])
def test_local_addresses_get_localhost(address):
    assert is_local_address(address)
    host = open_host(address)
    assert isinstance(host, LocalHost)
    assert host.name == address


@pytest.mark.parametrize("address", ["127.0.0.2", "gpu-node-1", "10.0.0.1", "localhost.example"])
def test_other_addresses_are_remote(address):
    assert not is_local_address(address)
    host = open_host(address, connect=False)
    assert isinstance(host, SshHost)
    assert host.name == address


# -- run ------------------------------------------------------------------------------------------
def test_run_captures_rc_stdout_stderr(case):
    res = case.host.run("echo out; echo err >&2; exit 3")
    assert (res.rc, res.stdout, res.stderr) == (3, "out\n", "err\n")
    assert not res.ok


def test_run_uses_posix_sh_in_home_with_empty_stdin(case):
    res = case.host.run('pwd; echo "$HOME"; cat; echo "[$(printf %s "a b")]"', check=True)
    assert res.stdout.splitlines() == [str(case.home), str(case.home), "[a b]"]


def test_run_check_raises_with_stderr(case):
    with pytest.raises(CommandError) as ei:
        case.host.run("echo boom >&2; exit 7", check=True)
    assert ei.value.result.rc == 7
    assert "rc=7" in str(ei.value) and "boom" in str(ei.value)
    assert isinstance(ei.value, HostError)


def test_run_timeout_kills_command(case, tmp_path):
    pidf = tmp_path / "pid"
    t0 = time.monotonic()
    with pytest.raises(CommandTimeout, match="timed out"):
        case.host.run(f"sleep 30 & echo $! > {pidf}; exec sleep 31", timeout=1)
    assert time.monotonic() - t0 < 8
    background = int(pidf.read_text())
    assert wait_for(lambda: not running(background)), "background child survived the timeout"


def running(pid: int) -> bool:
    """Exists and is not a zombie (this machine's PID 1 may not reap orphans)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def test_run_binary_and_unicode_output(case):
    res = case.host.run("printf 'h\\303\\251llo \\377\\n'")
    assert res.stdout.startswith("héllo ")


# -- put ------------------------------------------------------------------------------------------
def test_put_content_creates_parents_and_sets_mode(case, tmp_path):
    target = tmp_path / "a" / "b" / "secret.env"
    case.host.put_files([Upload("TOKEN=s3cr3t\n", str(target), 0o600)])
    assert target.read_text() == "TOKEN=s3cr3t\n"
    res = case.host.run(f"stat -c %a {target}", check=True)
    assert res.stdout.strip() == "600"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    # No temp files left behind.
    assert sorted(p.name for p in target.parent.iterdir()) == ["secret.env"]


def test_put_binary_and_local_file_and_overwrite(case, tmp_path):
    data = bytes(range(256)) * 64
    target = tmp_path / "bin" / "blob"
    case.host.put_files([Upload(data, str(target))])
    assert target.read_bytes() == data
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    src = tmp_path / "local.sh"
    src.write_text("#!/bin/sh\necho from-script\n")
    case.host.put_files([Upload(src, str(target), 0o755)])  # replaces the file (new inode)
    assert target.read_text() == src.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert case.host.run(str(target)).stdout == "from-script\n"


def test_put_secret_replacing_world_readable_file(case, tmp_path):
    target = tmp_path / "env"
    case.host.put_files([Upload("old", str(target), 0o644)])
    case.host.put_files([Upload("new-secret", str(target), 0o600)])
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.read_text() == "new-secret"


def test_put_under_home_with_tilde(case):
    case.host.put_files([Upload("x", "~/work/dir/f.txt", 0o640)])
    f = case.home / "work" / "dir" / "f.txt"
    assert f.read_text() == "x"
    assert stat.S_IMODE(f.stat().st_mode) == 0o640
    case.host.put_files([Upload("rel", "work/rel.txt")])  # relative = relative to home
    assert (case.home / "work" / "rel.txt").read_text() == "rel"


def test_put_onto_directory_fails(case, tmp_path):
    with pytest.raises(HostError, match="cannot write"):
        case.host.put_files([Upload("x", str(tmp_path))])


def _count_execs(host: Host) -> list[str]:
    """Every command the host runs from now on (its one primitive, wrapped on the instance)."""
    seen: list[str] = []
    real = host._exec

    def counted(command, **kw):
        seen.append(command)
        return real(command, **kw)

    host._exec = counted  # type: ignore[method-assign]
    return seen


def test_put_files_writes_every_file_in_one_command(case, tmp_path):
    d = tmp_path / "w"
    run = d / "run"
    (d / "logs").mkdir(parents=True)
    (d / "logs" / "p.log").write_text("last run\n")
    blob = bytes(range(256)) * 300  # binary, > one read of head -c
    files = [
        Upload("#!/bin/sh\necho one\n", str(d / "one.sh"), 0o755),
        Upload(blob, str(run / "blob"), 0o644),
        Upload(b"", str(run / "empty"), 0o600),
        Upload("TOKEN=s3cr3t\n", str(run / "one.secrets.env"), 0o600),
    ]
    execs = _count_execs(case.host)
    try:
        case.host.put_files(
            files, private_dirs=[str(d), str(run)], keep_previous=[str(d / "logs" / "p.log")]
        )
    finally:
        del case.host._exec
    assert len(execs) == 1
    assert (d / "one.sh").read_text() == "#!/bin/sh\necho one\n"
    assert (run / "blob").read_bytes() == blob
    assert (run / "empty").read_bytes() == b""
    assert (run / "one.secrets.env").read_text() == "TOKEN=s3cr3t\n"
    modes = {f: stat.S_IMODE((Path(f.path)).stat().st_mode) for f in files}
    assert modes == {f: f.mode for f in files}
    assert stat.S_IMODE(run.stat().st_mode) == 0o700  # made private
    assert (d / "logs" / "p.log.prev").read_text() == "last run\n"
    assert not (d / "logs" / "p.log").exists()
    assert sorted(p.name for p in run.iterdir()) == ["blob", "empty", "one.secrets.env"]


def test_put_files_refuses_an_unsafe_dir_before_writing(case, tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(UnsafePathError, match="writable by others"):
        case.host.put_files([Upload("x", str(d / "f"))], private_dirs=[str(d)])
    assert list(d.iterdir()) == []


NOBODY = 65534


def test_private_dirs_check_every_parent_once_and_name_the_bad_one(case, tmp_path):
    base = tmp_path / "base"
    dirs = [base / "w", base / "w" / "logs", base / "w" / "run", base / "other"]
    case.host.private_dirs([str(d) for d in dirs])  # shared parents: all fine, all made
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o700 for d in dirs)
    # a parent others may write, not sticky: they could rename our dir away
    base.chmod(0o777)
    with pytest.raises(UnsafePathError) as ei:
        case.host.private_dirs([str(dirs[1]), str(dirs[3])])
    assert f"{base} (a parent of {dirs[1]}) is writable by others (mode 777)" in str(ei.value)
    base.chmod(0o1777)  # sticky, like /tmp: others cannot rename what is ours
    case.host.private_dirs([str(d) for d in dirs])
    # a parent owned by someone else (neither root nor us)
    base.chmod(0o755)
    os.chown(base, NOBODY, NOBODY)
    with pytest.raises(UnsafePathError, match=rf"{base} \(a parent of .*\) is owned by .*{NOBODY}"):
        case.host.private_dirs([str(dirs[2])])
    os.chown(base, os.getuid(), os.getgid())
    # the dir itself: a link, or ours but writable by others
    (base / "link").symlink_to(dirs[0])
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        case.host.private_dirs([str(dirs[0]), str(base / "link")])
    dirs[2].chmod(0o770)
    with pytest.raises(UnsafePathError, match=rf"{dirs[2]} is writable by others \(mode 770\)"):
        case.host.private_dirs([str(d) for d in dirs])


def test_put_files_names_the_file_it_could_not_write(case, tmp_path):
    (tmp_path / "dir").mkdir()
    files = [Upload("a", str(tmp_path / "a")), Upload("b", str(tmp_path / "dir"))]
    with pytest.raises(HostError, match=f"cannot write {tmp_path / 'dir'}: .*is a directory"):
        case.host.put_files(files)
    assert (tmp_path / "a").read_text() == "a"  # written before the failing one


# -- start_detached / stop / is_alive -----------------------------------------------------------
def test_start_detached_runs_in_own_session_with_closed_stdin(case, tmp_path):
    pid_file, log_file = tmp_path / "run" / "p.pid", tmp_path / "logs" / "p.log"
    t0 = time.monotonic()
    pid = case.host.start_tracked(
        "echo started; echo to-stderr >&2; exec sleep 300",
        pid_file=str(pid_file),
        log_file=str(log_file),
    ).pid
    assert time.monotonic() - t0 < 30, "start_detached must return while the process runs"
    try:
        assert int(pid_file.read_text()) == pid
        assert case.host.is_alive(pid)
        # Leader of its own session and process group.
        assert os.getpgid(pid) == pid
        assert os.getsid(pid) == pid
        assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
        assert os.readlink(f"/proc/{pid}/fd/1") == str(log_file)
        assert wait_for(lambda: "to-stderr" in log_file.read_text())
        assert log_file.read_text().splitlines() == ["started", "to-stderr"]
    finally:
        assert case.host.stop(pid, grace=2) is True
    assert not case.host.is_alive(pid)
    assert live_group(pid) == []


def test_start_detached_argv_cwd_and_log_append(case, tmp_path):
    log_file = tmp_path / "app.log"
    log_file.write_text("previous run\n")
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    pid = case.host.start_tracked(
        ["sh", "-c", 'pwd; echo "$1"', "x", "it's a 'quoted' arg"],
        pid_file=str(tmp_path / "app.pid"),
        log_file=str(log_file),
        cwd=str(workdir),
    ).pid
    assert wait_for(lambda: not case.host.is_alive(pid))
    assert wait_for(lambda: len(log_file.read_text().splitlines()) == 3)
    assert log_file.read_text().splitlines() == [
        "previous run",
        str(workdir),
        "it's a 'quoted' arg",
    ]


def test_start_detached_relative_paths_are_under_home(case):
    pid = case.host.start_tracked("echo hi", pid_file="run/x.pid", log_file="~/logs/x.log").pid
    assert int((case.home / "run" / "x.pid").read_text()) == pid
    assert wait_for(lambda: (case.home / "logs" / "x.log").read_text() == "hi\n")


def test_start_detached_failures_are_host_errors(case, tmp_path):
    with pytest.raises(HostError, match="cannot start"):
        case.host.start_tracked(
            "true",
            pid_file=str(tmp_path / "p"),
            log_file=str(tmp_path / "l"),
            cwd=str(tmp_path / "missing"),
        )


def test_start_tracked_returns_the_start_time_in_one_command(case, tmp_path):
    execs = _count_execs(case.host)
    try:
        started = case.host.start_tracked(
            "exec sleep 300", pid_file=str(tmp_path / "p"), log_file=str(tmp_path / "l")
        )
    finally:
        del case.host._exec
    try:
        assert len(execs) == 1
        assert int((tmp_path / "p").read_text()) == started.pid
        stat_fields = Path(f"/proc/{started.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert started.start_time == int(stat_fields[19])  # field 22: starttime
    finally:
        assert case.host.stop(started.pid, grace=1, start_time=started.start_time) is True


def test_start_tracked_of_a_process_that_ended_at_once_has_no_start_time(case, tmp_path):
    started = case.host.start_tracked(
        "exit 0", pid_file=str(tmp_path / "p"), log_file=str(tmp_path / "l")
    )
    assert started.pid > 1
    # it may still have run when its start time was read: then it was that process's own
    assert started.start_time is None or isinstance(started.start_time, int)
    assert wait_for(lambda: not case.host.is_alive(started.pid))


def test_detached_process_outlives_host_connection(case, tmp_path):
    pid = case.host.start_tracked(
        "exec sleep 300", pid_file=str(tmp_path / "p"), log_file=str(tmp_path / "l")
    ).pid
    start = start_time_of(pid)
    case.host.close()  # drops the SSH connection (the next call reconnects)
    assert running(pid)
    assert case.host.is_alive(pid, start)
    assert case.host.stop(pid, grace=2, start_time=start)


def test_stop_escalates_to_kill_and_leaves_no_orphans(case, tmp_path):
    pid = case.host.start_tracked(
        # The leader and its children ignore SIGTERM; one grandchild runs in a subshell.
        "trap '' TERM; sleep 1000 & (sleep 1000 & wait) & echo ready; wait",
        pid_file=str(tmp_path / "p"),
        log_file=str(tmp_path / "l"),
    ).pid
    assert wait_for(lambda: len(live_group(pid)) >= 4), live_group(pid)
    t0 = time.monotonic()
    assert case.host.stop(pid, grace=0.5) is True
    took = time.monotonic() - t0
    assert 0.5 <= took < 20, took
    assert live_group(pid) == []
    assert not case.host.is_alive(pid)
    assert start_time_of(pid) is None


def test_stop_term_is_enough_for_well_behaved_process(case, tmp_path):
    pid = case.host.start_tracked(
        "trap 'echo got-term; exit 0' TERM; while :; do sleep 0.1; done",
        pid_file=str(tmp_path / "p"),
        log_file=str(tmp_path / "l"),
    ).pid
    t0 = time.monotonic()
    assert case.host.stop(pid, grace=20) is True
    assert time.monotonic() - t0 < 10
    assert "got-term" in (tmp_path / "l").read_text()
    assert live_group(pid) == []


def test_stop_is_idempotent(case, tmp_path):
    pid = case.host.start_tracked(
        "exec sleep 300", pid_file=str(tmp_path / "p"), log_file=str(tmp_path / "l")
    ).pid
    assert case.host.stop(pid, grace=1) is True
    assert case.host.stop(pid, grace=1) is False
    assert case.host.stop(4_000_000, grace=1) is False  # > pid_max: never existed
    with pytest.raises(ValueError):
        case.host.stop(1)


def test_stop_kills_group_left_behind_by_dead_leader(case, tmp_path):
    pid = case.host.start_tracked(
        "sleep 1000 & echo child $!", pid_file=str(tmp_path / "p"), log_file=str(tmp_path / "l")
    ).pid
    assert wait_for(lambda: not case.host.is_alive(pid))
    assert len(live_group(pid)) == 1  # the orphaned sleep still in the group
    assert case.host.stop(pid, grace=1) is True
    assert live_group(pid) == []


def test_dead_leader_children_are_found_by_their_log_and_stopped(case, tmp_path):
    """Issue 26: kill -9 of the leader leaves its children (holding the log); find_tracked
    finds them by the log they hold, stop(log_file=...) stops the leaderless group, and a
    log nobody of that group holds proves nothing (the group is not touched)."""
    log_file = str(tmp_path / "l")
    started = case.host.start_tracked(
        "sleep 1000 & sleep 1000 & wait", pid_file=str(tmp_path / "p"), log_file=log_file
    )
    pid = started.pid
    assert wait_for(lambda: len(live_group(pid)) == 3), live_group(pid)
    case.host.run(f"kill -9 {pid}", check=True)
    assert wait_for(lambda: not case.host.is_alive(pid))
    children = sorted(int(r.split()[0]) for r in live_group(pid))
    assert len(children) == 2
    found, holders = case.host.find_tracked(
        [(str(tmp_path / "p"), log_file, pid)], [log_file, str(tmp_path / "other")]
    )
    assert found == {}  # the leader is gone...
    assert sorted(holders[0]) == [(c, pid) for c in children]  # ...its group is not
    assert 1 not in holders
    # another log: no proof the group is ours, so nothing is signalled
    assert case.host.stop(pid, grace=1, log_file=str(tmp_path / "other")) is False
    assert sorted(int(r.split()[0]) for r in live_group(pid)) == children
    assert case.host.stop(pid, grace=1, start_time=started.start_time, log_file=log_file)
    assert live_group(pid) == []
    assert case.host.find_tracked([], [log_file]) == ({}, {})


def test_pid_reuse_guard(case, tmp_path):
    pid = case.host.start_tracked(
        "exec sleep 300", pid_file=str(tmp_path / "p"), log_file=str(tmp_path / "l")
    ).pid
    start = start_time_of(pid)
    assert isinstance(start, int)
    assert case.host.is_alive(pid, start)
    assert not case.host.is_alive(pid, start + 1)
    # A "different process" with the same pid must not be touched.
    assert case.host.stop(pid, grace=1, start_time=start + 1) is False
    assert case.host.is_alive(pid)
    assert case.host.stop(pid, grace=1, start_time=start) is True


def test_is_alive_false_after_external_kill(case, tmp_path):
    pid = case.host.start_tracked(
        "exec sleep 300", pid_file=str(tmp_path / "p"), log_file=str(tmp_path / "l")
    ).pid
    assert case.host.is_alive(pid)
    case.host.run(f"kill -9 {pid}", check=True)
    # Even if nobody reaps it (a zombie), it is not alive.
    assert wait_for(lambda: not case.host.is_alive(pid))
    assert start_time_of(pid) is None
    assert case.host.stop(pid) is False


# -- logs -----------------------------------------------------------------------------------------
def test_read_log(case, tmp_path):
    f = tmp_path / "x.log"
    f.write_text("".join(f"line {i}\n" for i in range(100)))
    assert case.host.read_log(str(f), lines=3) == "line 97\nline 98\nline 99\n"
    assert case.host.read_log(str(f)).count("\n") == 50
    assert case.host.read_log(str(tmp_path / "missing.log")) == ""


def _tails_of(path: Path) -> list[str]:
    out = subprocess.run(["ps", "-wweo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    return [
        line
        for line in out.splitlines()
        if "tail" in line and str(path) in line and " Z" not in line
    ]


def test_follow_log_existing_new_lines_and_close(case, tmp_path):
    f = tmp_path / "f.log"
    f.write_text("old1\nold2\nold3\n")
    gen = case.host.follow_log(str(f), lines=2)
    assert next(gen) == "old2"
    assert next(gen) == "old3"
    with f.open("a") as fh:
        fh.write("new1\n")
    assert next(gen) == "new1"
    assert _tails_of(f)
    gen.close()
    assert wait_for(lambda: not _tails_of(f)), _tails_of(f)
    with pytest.raises(StopIteration):
        next(gen)


def test_follow_log_as_context_manager(case, tmp_path):
    f = tmp_path / "cm.log"
    f.write_text("a\nb\n")
    with case.host.follow_log(str(f)) as lines:
        assert _tails_of(f)  # tail runs as soon as follow_log returns
        assert [next(lines), next(lines)] == ["a", "b"]
    assert wait_for(lambda: not _tails_of(f)), _tails_of(f)


def test_follow_log_waits_for_file_and_stops_on_event(case, tmp_path):
    f = tmp_path / "later.log"
    stop = threading.Event()
    got: list[str] = []

    def consume():
        got.extend(case.host.follow_log(str(f), stop=stop, poll_interval=0.05))

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.5)
    f.write_text("hello\n")
    assert wait_for(lambda: got == ["hello"]), got
    stop.set()
    t.join(5)
    assert not t.is_alive()
    assert wait_for(lambda: not _tails_of(f)), _tails_of(f)


def test_close_stops_followers(case, tmp_path):
    f = tmp_path / "c.log"
    f.write_text("x\n")
    got: list[str] = []
    t = threading.Thread(target=lambda: got.extend(case.host.follow_log(str(f), lines=5)))
    t.start()
    assert wait_for(lambda: got == ["x"])
    case.host.close()
    t.join(5)
    assert not t.is_alive()
    assert wait_for(lambda: not _tails_of(f)), _tails_of(f)


def test_exec_owned_script_refuses_a_script_others_can_write(tmp_path):
    from pdlaunch.hosts import LocalHost
    from pdlaunch.hosts.shell import exec_owned_script

    host = LocalHost()
    script = tmp_path / "engine.sh"
    marker = tmp_path / "ran"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    for mode, runs in ((0o777, False), (0o755, True)):
        script.chmod(mode)
        log = tmp_path / f"log-{mode:o}"
        pid = host.start_tracked(
            exec_owned_script(str(script)), pid_file=str(tmp_path / "pid"), log_file=str(log)
        ).pid
        deadline = time.monotonic() + 10
        while host.is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists() is runs, log.read_text()
        if not runs:
            assert "writable by others" in log.read_text()
