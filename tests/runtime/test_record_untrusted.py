"""A record is data, never instructions (issue 32, class 2): a `record.json` edited to name
another process, a file outside the deployment, a program as the container runtime, or built
to exhaust the parser is refused as damaged (naming the file and the field), and nothing it
names is signalled, deleted or executed. The processes and files here are real (local host,
the stand-in engines' topology of tests/support/deployments.py); the container cases that
need podman are in tests/backends/test_ssh_containers_down.py."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pdlaunch.backends.ssh.records import unrecorded_state
from pdlaunch.plan.build import build_plan
from pdlaunch.runtime import record_store
from pdlaunch.runtime.state import DeploymentState
from tests.support.deployments import Deployment, cli

TRACEBACK = "Traceback (most recent call last)"


def recorded(make_deployment: Callable[..., Deployment], name: str) -> tuple[Deployment, Path]:
    """The 1P1D stand-in topology ``name``, recorded as `up` records it (no pid yet)."""
    from pdlaunch.spec.load import load

    dep = make_deployment(name)
    state = unrecorded_state(build_plan(load(dep.path)[0]), status="up")
    state.topology = str(dep.path)
    return dep, record_store.save_state(state)


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def proc(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in data["processes"] if p["name"] == name)


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def sleeper(log: Path, cwd: Path) -> subprocess.Popen:
    """A process with ``log`` open as stdout, in its own session: what pdlaunch's start
    leaves behind, or someone else's process."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(["sleep", "600"], stdout=out, stderr=subprocess.STDOUT,
                                cwd=cwd, start_new_session=True)  # fmt: skip


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


@pytest.mark.parametrize("via", ["pid", "pid_file"])
def test_down_never_stops_a_process_the_record_borrows(
    make_deployment, procs, tmp_path: Path, via: str
) -> None:
    """The decode's entry names someone else's process: its pid and real start time (or a
    pid file holding its pid), and its log as log_path. The survey would find it "ours" (it
    holds that log), so `down` would kill it: the log path is not the decode's own."""
    _, path = recorded(make_deployment, "borrow")
    victim = sleeper(tmp_path / "elsewhere" / "victim.log", tmp_path / "elsewhere")
    procs.append(victim)
    pid_file = tmp_path / "elsewhere" / "victim.pid"
    pid_file.write_text(f"{victim.pid}\n")

    def borrow(data: dict[str, Any]) -> None:
        d = proc(data, "decode-0")
        d["log_path"] = str(tmp_path / "elsewhere" / "victim.log")
        if via == "pid":
            d["pid"], d["start_time"] = victim.pid, start_time(victim.pid)
        else:
            d["handle"]["pid_path"] = str(pid_file)

    edit(path, borrow)
    res = cli("down", "borrow")
    assert alive(victim), res.output
    assert res.exit_code != 0 and TRACEBACK not in res.output
    assert "is damaged" in res.output and "processes[1].log_path" in res.output, res.output
    assert path.exists()  # kept: nothing was proven gone


@pytest.mark.parametrize("escape", ["absolute", "dotdot"])
def test_a_process_name_never_leads_a_path_out_of_the_deployment(
    make_deployment, procs, tmp_path: Path, escape: str
) -> None:
    """A process named ``/…/evil`` or ``../../outside/evil``: joined to the work dir as a
    string, its secrets path "is" the deployment's own, and `down` would delete a
    ``*.secrets.env`` outside it. The name is refused as a name."""
    dep, path = recorded(make_deployment, "names")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.secrets.env").write_text("TOKEN=keep-me\n")
    name = str(outside / "evil") if escape == "absolute" else "../../outside/evil"
    # prefill-0 really runs (its own log open), so `down` has something to stop
    prefill = sleeper(dep.work_dir / "logs" / "prefill-0.log", dep.work_dir)
    procs.append(prefill)

    def rename(data: dict[str, Any]) -> None:
        p = proc(data, "prefill-0")
        p["pid"], p["start_time"] = prefill.pid, start_time(prefill.pid)
        d = proc(data, "decode-0")
        d["name"] = name
        d["handle"]["secrets_path"] = os.path.join(d["work_dir"], "run", f"{name}.secrets.env")

    edit(path, rename)
    res = cli("down", "names")
    assert (outside / "evil.secrets.env").read_text() == "TOKEN=keep-me\n", res.output
    assert res.exit_code != 0 and TRACEBACK not in res.output
    assert "processes[1].name" in res.output and "not a name" in res.output, res.output


def test_status_never_runs_a_program_the_record_names_as_container_runtime(
    make_deployment, tmp_path: Path
) -> None:
    _, path = recorded(make_deployment, "runtime")
    marker = tmp_path / "PWNED"
    program = tmp_path / "not-podman"
    program.write_text(f"#!/bin/sh\ntouch {marker}\necho running\n")
    program.chmod(0o755)

    def containerise(data: dict[str, Any]) -> None:
        d = proc(data, "decode-0")
        d["handle"]["container"] = {
            "runtime": str(program), "name": "pdl-runtime-decode-0",
            "cid_path": os.path.join(d["work_dir"], "run", "decode-0.cid"),
            "deployment": "runtime", "process": "decode-0",
        }  # fmt: skip

    edit(path, containerise)
    for args in (["status", "runtime"], ["status", "runtime", "--json"], ["down", "runtime"]):
        res = cli(*args)
        assert not marker.exists(), res.output
        assert res.exit_code != 0 and TRACEBACK not in res.output
        assert "container.runtime" in res.output and "not one of docker, podman" in res.output


def test_a_record_of_deep_nesting_is_damaged_not_a_traceback(make_deployment) -> None:
    _, path = recorded(make_deployment, "deep")
    path.write_text("[" * 100_000 + "]" * 100_000)
    for args in (["status", "deep"], ["status"], ["down", "deep"], ["logs", "deep", "decode-0"]):
        res = cli(*args)  # catch_exceptions=False: a RecursionError fails the test here
        assert res.exit_code != 0, res.output
        assert TRACEBACK not in res.output
        assert "is damaged" in res.output and "nests deeper than" in res.output, res.output


def test_a_genuine_record_still_reads(make_deployment) -> None:
    """The checks refuse what pdlaunch never writes, and nothing it does."""
    recorded(make_deployment, "fine")
    rec = record_store.find("fine")
    assert rec is not None and isinstance(rec.native, DeploymentState)
    assert [p.name for p in rec.processes] == ["prefill-0", "decode-0", "router"]
    assert cli("down", "fine").exit_code == 0


def _set(where: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of the decode's entry: ``where`` "" (the process) or "handle", or
    "container" (its container, made one of pdlaunch's first)."""

    def change(data: dict[str, Any]) -> None:
        d = proc(data, "decode-0")
        target = d if where == "" else d["handle"]
        if where == "container":
            run = os.path.join(d["work_dir"], "run")
            d["handle"]["container"] = {
                "runtime": "podman", "name": f"pdl-{data['deployment']}-decode-0",
                "cid_path": os.path.join(run, "decode-0.cid"),
                "deployment": data["deployment"], "process": "decode-0",
            }  # fmt: skip
            target = d["handle"]["container"]
        if value is _DUPLICATE:
            data["processes"].append(dict(d))
            return
        target[key] = value(d) if callable(value) else value

    return change


_DUPLICATE = object()
_ELSEWHERE = "/tmp/elsewhere"


@pytest.mark.parametrize(
    ("where", "key", "value", "says"),
    [
        ("handle", "pid_path", f"{_ELSEWHERE}/decode-0.pid", "processes[1].pid_path"),
        ("handle", "script_path", f"{_ELSEWHERE}/decode-0.sh", "processes[1].script_path"),
        ("", "log_path", lambda d: d["work_dir"] + "/logs/../../x.log", "processes[1].log_path"),
        ("", "host", "h; reboot", "processes[1].host"),
        ("", "name", ".hidden", "processes[1].name"),
        ("", "name", _DUPLICATE, "recorded twice"),
        ("container", "name", "someone-elses", "container.name"),
        ("container", "deployment", "other", "container.deployment"),
        ("container", "process", "prefill-0", "container.process"),
        ("container", "cid_path", f"{_ELSEWHERE}/decode-0.cid", "container.cid_path"),
        ("container", "runtime", "sh", "container.runtime"),
    ],
    ids=lambda v: v if isinstance(v, str) and "/" not in v else None,
)
def test_every_field_down_acts_on_is_checked(make_deployment, where, key, value, says) -> None:
    """Each field `down`, `status` or `logs` would act on, edited to point elsewhere: the
    record is damaged, named with the field, and `status` says so without running anything."""
    _, path = recorded(make_deployment, "fields")
    edit(path, _set(where, key, value))
    with pytest.raises(record_store.RecordError, match="is damaged") as err:
        record_store.find("fields")
    assert says in str(err.value)
    res = cli("status", "fields")
    assert res.exit_code != 0 and TRACEBACK not in res.output and says in res.output


@pytest.mark.parametrize("mode", [0o666, 0o620])
def test_a_recorded_ssh_config_others_can_change_is_refused_not_obeyed(
    make_deployment, tmp_path: Path, mode: int
) -> None:
    """A record naming an ssh_config that someone else can write (whose ProxyCommand would run
    a program) is refused as OpenSSH refuses such a config; the command names the file and the
    flag that uses it anyway, and nothing it names runs."""
    _, path = recorded(make_deployment, "sshcfg")
    marker = tmp_path / "PWNED"
    config = tmp_path / "config"
    config.write_text(f"Host *\n  ProxyCommand touch {marker}\n")
    config.chmod(mode)
    edit(path, lambda data: data["handle"].__setitem__("ssh_config", str(config)))
    for args in (["status", "sshcfg"], ["down", "sshcfg"]):
        res = cli(*args)
        assert not marker.exists(), res.output
        assert res.exit_code != 0 and TRACEBACK not in res.output
        assert "ssh_config" in res.output and "--ssh-config" in res.output, res.output
    assert record_store.find("sshcfg") is not None  # nothing stopped, so the record stays


def test_recorded_connect_files_are_kept_when_private_and_dropped_when_gone(tmp_path: Path):
    from pdlaunch.hosts.errors import UnsafePathError
    from pdlaunch.hosts.options import ConnectOptions

    private = tmp_path / "known_hosts"
    private.write_text("")
    private.chmod(0o600)
    opts = ConnectOptions().or_recorded(str(private), str(tmp_path / "gone"))
    assert opts.known_hosts == str(private) and opts.ssh_config is None
    with pytest.raises(UnsafePathError, match="not a regular file"):
        ConnectOptions().or_recorded(str(tmp_path), None)  # a directory
    # A file given on the command line is the user's choice: the recorded one is not read.
    open_to_all = tmp_path / "cfg"
    open_to_all.write_text("")
    open_to_all.chmod(0o666)
    given = ConnectOptions(ssh_config=str(private)).or_recorded(None, str(open_to_all))
    assert given.ssh_config == str(private)
