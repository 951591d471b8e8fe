"""The sh scripts the hosts send (pdlaunch/hosts/sh/*.sh): each parses, each does its job when
sent through the module that uses it, and values reach them quoted, never as code.

Run on this machine through LocalHost (the SSH host sends the very same text: tests/hosts/
test_local.py runs its suite against both). The container scripts are exercised against real
podman in test_containers.py.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import time
from importlib import resources
from pathlib import Path

import pytest

from pdlaunch.hosts import HostError, LocalHost, UnsafePathError, Upload
from pdlaunch.hosts.logs import LOG_TAIL_MAX_BYTES
from pdlaunch.hosts.shell import exec_owned_script, script, with_args

SCRIPTS = sorted(p.name for p in resources.files("pdlaunch.hosts").joinpath("sh").iterdir()
                 if p.name.endswith(".sh"))  # fmt: skip

# A file/dir name that is code if it ever reaches the shell unquoted.
NASTY = "a b'c\"$(touch PWNED);`touch PWNED2`"


@pytest.fixture
def host(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    h = LocalHost("127.0.0.1")
    yield h
    h.close()


def no_pwned(root: Path) -> bool:
    return not any(p.name.startswith("PWNED") for p in root.rglob("*")) and not any(
        Path(n).exists() for n in ("PWNED", "PWNED2")
    )


def live_group(pgid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True)
    return [int(p) for p, g, st in (ln.split() for ln in out.stdout.splitlines())
            if int(g) == pgid and not st.startswith("Z")]  # fmt: skip


def wait_for(pred, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := pred()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


# -- every shipped script parses ------------------------------------------------------------------
def test_the_scripts_ship_beside_the_code():
    assert {
        "proc.sh", "start.sh", "stop.sh", "find.sh", "private-dirs.sh", "put.sh", "read-log.sh",
        "follow-log.sh", "stop-tail.sh", "exec-owned.sh", "containers.sh",
        "container-remove.sh", "container-state.sh",
    } <= set(SCRIPTS)  # fmt: skip


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_script_parses(name, shell):
    """``bash -n``, and ``sh -n`` (the targets run them with /bin/sh, dash on Debian)."""
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} not installed")
    res = subprocess.run([shell, "-n", "-c", script(name)], capture_output=True, text=True)
    assert res.returncode == 0, f"{name}: {res.stderr}"


# -- start.sh -------------------------------------------------------------------------------------
def test_start_quotes_every_value_and_starts_a_session_leader(host, tmp_path):
    d = tmp_path / NASTY
    d.mkdir()
    started = host.start_tracked(
        ["sh", "-c", 'pwd; echo "$1"; exec sleep 300', "x", NASTY],
        pid_file=str(d / "p.pid"),
        log_file=str(d / "p.log"),
        cwd=str(d),
    )
    try:
        assert int((d / "p.pid").read_text()) == started.pid
        assert os.getsid(started.pid) == os.getpgid(started.pid) == started.pid
        stat = Path(f"/proc/{started.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert started.start_time == int(stat[19])
        assert wait_for(lambda: len((d / "p.log").read_text().splitlines()) == 2)
        assert (d / "p.log").read_text().splitlines() == [str(d), NASTY]
        assert no_pwned(tmp_path)
    finally:
        host.stop(started.pid, grace=1)


# -- stop.sh (on proc.sh's _group) ----------------------------------------------------------------
def test_stop_kills_a_group_that_ignores_sigterm_and_proves_it_gone(host, tmp_path):
    started = host.start_tracked(
        "trap '' TERM; sleep 1000 & (trap '' TERM; sleep 1000 & wait) & wait",
        pid_file=str(tmp_path / "p"),
        log_file=str(tmp_path / "l"),
    )
    assert wait_for(lambda: len(live_group(started.pid)) >= 4), live_group(started.pid)
    t0 = time.monotonic()
    assert host.stop(started.pid, grace=0.3, start_time=started.start_time) is True
    assert time.monotonic() - t0 >= 0.3  # it waited the grace, then escalated
    assert live_group(started.pid) == []  # proven gone when stop returns, not later
    assert host.stop(started.pid, grace=0.3, start_time=started.start_time) is False


def test_stop_leaves_a_reused_pid_alone(host, tmp_path):
    started = host.start_tracked("exec sleep 300", pid_file=str(tmp_path / "p"),
                                 log_file=str(tmp_path / "l"))  # fmt: skip
    assert host.stop(started.pid, grace=1, start_time=started.start_time + 1) is False
    assert live_group(started.pid) == [started.pid]
    assert host.stop(started.pid, grace=1, start_time=started.start_time) is True


# -- proc.sh --------------------------------------------------------------------------------------
def test_proc_functions_read_proc(host, tmp_path):
    log = tmp_path / NASTY
    started = host.start_tracked("sleep 1000 & sleep 1000 & wait", pid_file=str(tmp_path / "p"),
                                 log_file=str(log))  # fmt: skip
    pid = started.pid
    try:
        assert wait_for(lambda: len(live_group(pid)) == 3)
        res = host.run(
            script("proc.sh") + f"\nPGID={pid}; _group; echo --; _holders {shlex.quote(str(log))}"
            f"; echo --; _stat {pid}; _alive {pid} && echo alive; _alive 4000000 || echo gone",
        )
        group, holders, rest = res.stdout.split("--\n")
        assert sorted(map(int, group.split())) == sorted(live_group(pid))
        # every member holds the log the leader was started with: (pid, pgid) each
        assert sorted(tuple(map(int, ln.split())) for ln in holders.splitlines()) == sorted(
            (p, pid) for p in live_group(pid)
        )
        stat, *flags = rest.splitlines()
        assert int(stat.split()[19]) == started.start_time
        assert flags == ["alive", "gone"]
        assert no_pwned(tmp_path)
    finally:
        host.stop(pid, grace=1)


# -- find.sh --------------------------------------------------------------------------------------
def test_find_takes_a_pid_only_while_it_holds_our_log(host, tmp_path):
    started = host.start_tracked("exec sleep 300", pid_file=str(tmp_path / "p"),
                                 log_file=str(tmp_path / "l"))  # fmt: skip
    try:
        # a pid file naming a live process that does not hold the log: a reused pid
        (tmp_path / "other.pid").write_text(f"{os.getpid()}\n")
        (tmp_path / "bad.pid").write_text("1; touch PWNED\n")
        found, _ = host.find_tracked(
            [
                (str(tmp_path / "p"), str(tmp_path / "l"), None),
                (str(tmp_path / "other.pid"), str(tmp_path / "l"), None),
                (str(tmp_path / "bad.pid"), str(tmp_path / "l"), None),
                (str(tmp_path / "missing.pid"), str(tmp_path / "l"), None),
            ],
            [],
        )
        assert found == {0: (started.pid, started.start_time)}
        assert no_pwned(tmp_path)
    finally:
        host.stop(started.pid, grace=1)


# -- private-dirs.sh and put.sh -------------------------------------------------------------------
def test_put_files_writes_nasty_names_exactly_and_keeps_the_previous_log(host, tmp_path):
    d = tmp_path / NASTY
    (d / "logs").mkdir(parents=True)
    (d / "logs" / "x.log").write_text("old run\n")
    (d / "logs" / "y.log").symlink_to("/etc/passwd")  # a link is removed, never written through
    host.put_files(
        [Upload(b"\x00\xff" * 5000, str(d / "blob"), 0o600), Upload("$HOME", str(d / NASTY))],
        private_dirs=[str(d), str(d / "run")],
        keep_previous=[str(d / "logs" / "x.log"), str(d / "logs" / "y.log")],
    )
    assert (d / "blob").read_bytes() == b"\x00\xff" * 5000
    assert oct((d / "blob").stat().st_mode & 0o777) == "0o600"
    assert (d / NASTY).read_text() == "$HOME"
    assert (d / "logs" / "x.log.prev").read_text() == "old run\n"
    assert not (d / "logs" / "x.log").exists() and not (d / "logs" / "y.log").is_symlink()
    assert oct((d / "run").stat().st_mode & 0o777) == "0o700"  # made private
    assert no_pwned(tmp_path)


def test_private_dirs_refuses_a_dir_others_can_write(host, tmp_path):
    d = tmp_path / NASTY
    d.mkdir(mode=0o700)
    host.private_dirs([str(d / "sub")])
    d.chmod(0o777)
    with pytest.raises(UnsafePathError, match="writable by others"):
        host.private_dirs([str(d / "sub")])
    assert no_pwned(tmp_path)


# -- read-log.sh and follow-log.sh ----------------------------------------------------------------
def test_read_log_tails_quoted_paths_and_refuses_links(host, tmp_path):
    log = tmp_path / NASTY
    log.write_text("".join(f"{i}\n" for i in range(10)))
    assert host.read_log(str(log), lines=2) == "8\n9\n"
    assert host.read_log(str(tmp_path / "none")) == ""
    (tmp_path / "link").symlink_to(log)
    with pytest.raises(Exception, match="symbolic link"):
        host.read_log(str(tmp_path / "link"))
    assert no_pwned(tmp_path)


def test_follow_log_follows_a_quoted_path_and_stops_its_tail(host, tmp_path):
    log = tmp_path / NASTY
    log.write_text("a\nb\n")
    with host.follow_log(str(log), lines=1) as lines:
        assert next(lines) == "b"
        with log.open("a") as f:
            f.write("c\n")
        assert next(lines) == "c"
        tail = lines._stream.pid
        assert Path(f"/proc/{tail}/comm").read_text().strip() == "tail"
    assert wait_for(lambda: not Path(f"/proc/{tail}").exists() or
                    Path(f"/proc/{tail}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
    assert no_pwned(tmp_path)


# -- stop-tail.sh ---------------------------------------------------------------------------------
def test_stop_tail_kills_a_tail_and_nothing_else(host, tmp_path):
    (tmp_path / "f").write_text("")
    tail = subprocess.Popen(["tail", "-F", str(tmp_path / "f")], stdout=subprocess.DEVNULL)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        time.sleep(0.2)  # let tail exec (comm is "tail" only then)
        host.run(with_args("stop-tail.sh", str(sleeper.pid)), check=True)
        host.run(with_args("stop-tail.sh", str(tail.pid)), check=True)
        assert tail.wait(10) is not None
        assert sleeper.poll() is None  # a pid that is not a tail is never killed
    finally:
        for p in (tail, sleeper):
            p.kill()
            p.wait()


# -- exec-owned.sh --------------------------------------------------------------------------------
@pytest.mark.parametrize("what", ["ours", "link", "writable", "missing"])
def test_exec_owned_runs_only_a_file_of_ours_nobody_else_can_write(host, tmp_path, what):
    d = tmp_path / NASTY
    d.mkdir()
    real = d / "real.sh"
    real.write_text("#!/bin/sh\necho ran\n")
    real.chmod(0o755)
    path = {"ours": real, "link": d / "link.sh", "writable": real, "missing": d / "no.sh"}[what]
    if what == "link":
        path.symlink_to(real)
    if what == "writable":
        real.chmod(0o757)
    res = host.run(exec_owned_script(str(path)))
    if what == "ours":
        assert (res.rc, res.stdout) == (0, "ran\n")
    else:
        assert res.rc == 96 and "refusing to run" in res.stderr and res.stdout == ""
    assert no_pwned(tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_read_log_refuses_what_is_not_a_regular_file_without_blocking(host, tmp_path, kind):
    # issue 32: a FIFO at a log's path blocked `tail` until the command's timeout; a device
    # (a real /dev/zero node, made here) never ends.
    log = tmp_path / "engine.log"
    if kind == "fifo":
        os.mkfifo(log)
    else:
        os.mknod(log, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    t0 = time.monotonic()
    with pytest.raises(HostError, match="not a regular file"):
        host.read_log(str(log), lines=5)
    assert time.monotonic() - t0 < 10


def test_read_log_of_one_endless_line_comes_back_bounded(host, tmp_path):
    log = tmp_path / "engine.log"
    with open(log, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB of NULs, no newline, sparse: no disk used
        f.seek(0, os.SEEK_END)
        f.write(b"\nlast line\n")
    assert host.read_log(str(log), lines=1) == "last line\n"
    text = host.read_log(str(log), lines=5)
    assert text.endswith("last line\n") and len(text) <= LOG_TAIL_MAX_BYTES


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_follow_log_refuses_what_read_log_refuses(host, tmp_path, kind):
    log = tmp_path / "engine.log"
    if kind == "fifo":
        os.mkfifo(log)
    else:
        (tmp_path / "private").write_text("not a log\n")
        log.symlink_to(tmp_path / "private")
    with pytest.raises(HostError, match="cannot follow"):
        host.follow_log(str(log), lines=1)
