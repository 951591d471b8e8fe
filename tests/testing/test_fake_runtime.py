"""pdlaunch.testing.FakeRuntime under the real lifecycle: the scenarios of
tests/system/lifecycle/test_lifecycle_scenarios.py (which runs them on SSH and Slurm through the
CLI), with the same expectations where that suite asserts them (up, a second up that keeps
what runs, status, logs, down twice; an engine that exits: rolled back, its log's last lines,
nothing left, no record; SIGINT during up; down and up after a kill -9 of `up`; status with a
node that does not answer), plus the faults only a fake shows on demand.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pdlaunch.runtime import lifecycle
from pdlaunch.runtime.lifecycle import Interrupted, LaunchError, UpOptions
from pdlaunch.runtime.state import deployment_dir
from pdlaunch.testing import FakeRuntime, plan_from

A, B = "10.0.0.1", "10.0.0.2"


def topology(name: str) -> dict:
    return {
        "deployment": name,
        "model": {"name": "fake-model"},
        "hosts": {A: {"local": False}, B: {"local": False}},
        "prefill": [{"host": A, "device": "cpu", "port": 8100}],
        "decode": [{"host": B, "device": "cpu", "port": 8200}],
        "router": {"host": A, "port": 8123},
    }


def opts(**kw) -> UpOptions:
    return UpOptions(**{"timeout": 60.0, "poll_interval": 0.02, "stop_grace": 0.1, **kw})


@pytest.fixture
def fake():
    rt = FakeRuntime()
    yield rt
    rt.close()


def nothing_left(fake: FakeRuntime, name: str) -> None:
    assert fake.running(name) == [], "a process outlived the run"
    assert name not in fake.records, "the record outlived its processes"


def test_up_status_adopt_down(fake: FakeRuntime) -> None:
    plan = plan_from(topology("sc-up"))
    first = lifecycle.up(fake, plan, opts())
    assert first.changed and first.backend == "fake"
    assert first.canary is not None and first.canary.ok, first.canary
    assert "1 prefill → decode pair(s)" in first.canary.message
    # The endpoint is where the router really listens once placed, not the plan's port.
    assert first.endpoint.startswith("http://127.0.0.1:") and not first.endpoint.endswith(":8123")

    report = lifecycle.status(fake, "sc-up")
    assert report is not None and report.healthy and report.observation.backend == "fake"
    assert report.endpoint == first.endpoint
    assert {r["process"] for r in report.rows} == {"prefill-0", "decode-0", "router"}
    assert all(r["health"] == "healthy" and r["alive"] for r in report.rows), report.rows
    starts = [e for e in fake.events if e[0] == "start"]

    again = lifecycle.up(fake, plan, opts())
    assert again.changed is False and "already up and unchanged" in again.message
    assert again.endpoint == first.endpoint
    assert [e for e in fake.events if e[0] == "start"] == starts, "something was restarted"

    assert list(lifecycle.logs(fake, "sc-up", "prefill-0", lines=5))
    result = lifecycle.down(fake, "sc-up")
    assert sorted(result.stopped) == ["decode-0", "prefill-0", "router"]
    # router first, then decode, then prefill
    assert [e[2] for e in fake.events if e[0] == "stop"] == ["router", "decode-0", "prefill-0"]
    nothing_left(fake, "sc-up")
    assert "nothing recorded" in lifecycle.down(fake, "sc-up").message  # idempotent


def test_an_engine_that_exits_rolls_back_and_leaves_nothing(fake: FakeRuntime) -> None:
    fake.behave("decode-0", exits_after=2, log=("loading weights",))
    with pytest.raises(LaunchError) as info:
        lifecycle.up(fake, plan_from(topology("sc-exit")), opts())
    err = info.value
    assert err.rolled_back is True
    [decode] = [f for f in err.failures if f.name == "decode-0"]
    assert "exited during start" in decode.reason
    assert "simulated engine failure" in decode.log_tail  # its own log says why
    assert "loading weights" in decode.log_tail
    nothing_left(fake, "sc-exit")
    assert lifecycle.status(fake, "sc-exit") is None


def test_sigint_during_up_rolls_back(fake: FakeRuntime) -> None:
    fake.behave("decode-0", hang=True)

    def interrupt_once_started() -> None:
        deadline = time.monotonic() + 20
        while fake.process("sc-int", "decode-0") is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # well inside the wait for health
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(Interrupted) as info:
        lifecycle.up(fake, plan_from(topology("sc-int")), opts(timeout=30))
    assert "interrupted by SIGINT: rolled back" in info.value.message
    assert info.value.rolled_back is True
    nothing_left(fake, "sc-int")


def test_down_after_kill_9_of_pdlaunch_in_the_middle_of_up(fake: FakeRuntime) -> None:
    plan = plan_from(topology("sc-kill"))
    fake.leave_running(plan)  # the engines run; the killed `up` recorded them as starting
    assert sorted(fake.running("sc-kill")) == ["decode-0", "prefill-0"]
    result = lifecycle.down(fake, "sc-kill")
    assert sorted(result.stopped) == ["decode-0", "prefill-0"]
    nothing_left(fake, "sc-kill")


def test_up_after_kill_9_of_pdlaunch_adopts_what_the_first_one_started(fake) -> None:
    plan = plan_from(topology("sc-adopt"))
    engines = fake.leave_running(plan).processes.copy()
    result = lifecycle.up(fake, plan, opts())
    assert result.changed is True and result.adopted == ["decode-0", "prefill-0"]
    for name, proc in engines.items():  # the same processes run on: only the router started
        assert fake.records["sc-adopt"].processes[name] is proc and proc.running
    assert [e[2] for e in fake.events if e[0] == "start"][-1:] == ["router"]
    report = lifecycle.status(fake, "sc-adopt")
    assert report is not None and report.healthy
    lifecycle.down(fake, "sc-adopt")
    nothing_left(fake, "sc-adopt")


def test_status_names_the_process_whose_node_does_not_answer(fake: FakeRuntime) -> None:
    lifecycle.up(fake, plan_from(topology("sc-mute")), opts(canary="router"))
    fake.behave("decode-0", unreachable=True)
    report = lifecycle.status(fake, "sc-mute")
    assert report is not None and not report.healthy
    rows = {r["process"]: r for r in report.rows}
    assert rows["decode-0"]["alive"] is None and B in rows["decode-0"]["error"]  # unknown, not dead
    assert rows["prefill-0"]["health"] == "healthy"
    # down cannot prove it gone while its host does not answer: the record is kept
    with pytest.raises(LaunchError, match="decode-0"):
        lifecycle.down(fake, "sc-mute")
    assert fake.records["sc-mute"].status == "failed"
    fake.behave("decode-0", unreachable=False)
    lifecycle.down(fake, "sc-mute")
    nothing_left(fake, "sc-mute")


# -- what only a fake shows on demand -------------------------------------------------------------
def test_a_process_that_survives_the_rollback_stays_recorded(fake: FakeRuntime) -> None:
    fake.behave("prefill-0", survives_stop=True)
    fake.behave("decode-0", exits_after=1)
    with pytest.raises(LaunchError) as info:
        lifecycle.up(fake, plan_from(topology("sc-stuck")), opts())
    assert info.value.rolled_back is False
    assert "rollback could not stop" in info.value.message and "prefill-0" in info.value.message
    assert fake.running("sc-stuck") == ["prefill-0"]
    assert fake.records["sc-stuck"].status == "failed"  # kept for `down`, never lost
    fake.behave("prefill-0", survives_stop=False)
    lifecycle.down(fake, "sc-stuck")
    nothing_left(fake, "sc-stuck")


def test_a_start_refused_and_a_health_deadline_name_the_process(fake: FakeRuntime) -> None:
    fake.behave("router", refuse_start="vllm-router: command not found")
    with pytest.raises(LaunchError, match=r"router on 10\.0\.0\.1: could not start") as info:
        lifecycle.up(fake, plan_from(topology("sc-refused")), opts())
    assert info.value.rolled_back is True
    nothing_left(fake, "sc-refused")

    fake.behave("router", refuse_start=None)
    fake.behave("decode-0", hang=True)
    with pytest.raises(LaunchError, match=r"decode-0 on 10\.0\.0\.2: not healthy before the dead"):
        lifecycle.up(fake, plan_from(topology("sc-slow")), opts(timeout=1.5))
    nothing_left(fake, "sc-slow")


def test_healthy_after_n_polls(fake: FakeRuntime) -> None:
    fake.behave("decode-0", healthy_after=6)
    lifecycle.up(fake, plan_from(topology("sc-polls")), opts(canary=False))
    decode = fake.process("sc-polls", "decode-0")
    assert decode is not None and decode.polls == 7  # 6 answered 503, the 7th 200
    assert decode.tail(100).count("GET /health -> 503") == 6


def test_a_decode_that_recomputes_fails_the_canary(fake: FakeRuntime) -> None:
    fake.behave("decode-0", serves_kv=False)
    with pytest.raises(LaunchError, match="canary failed") as info:
        lifecycle.up(fake, plan_from(topology("sc-nokv")), opts())
    assert "prefill-0 → decode-0" in info.value.message and "KV did not move" in str(info.value)
    nothing_left(fake, "sc-nokv")


def test_a_changed_plan_is_refused_unless_replace(fake: FakeRuntime) -> None:
    lifecycle.up(fake, plan_from(topology("sc-chg")), opts(canary=False))
    changed = topology("sc-chg")
    changed["router"]["port"] = 8124
    with pytest.raises(LaunchError, match="differs from this topology"):
        lifecycle.up(fake, plan_from(changed), opts(canary=False))
    assert sorted(fake.running("sc-chg")) == ["decode-0", "prefill-0", "router"]  # untouched
    result = lifecycle.up(fake, plan_from(changed), opts(canary=False, replace=True))
    assert result.changed
    assert len([e for e in fake.events if e[0] == "stop"]) == 3  # the old three stopped
    lifecycle.down(fake, "sc-chg")
    nothing_left(fake, "sc-chg")


def test_follow_log_sees_new_lines_until_the_process_stops(fake: FakeRuntime) -> None:
    lifecycle.up(fake, plan_from(topology("sc-logs")), opts(canary=False))
    proc = fake.process("sc-logs", "decode-0")
    assert proc is not None
    got: list[str] = []
    lines = lifecycle.logs(fake, "sc-logs", "decode-0", lines=1, follow=True)
    reader = threading.Thread(target=lambda: got.extend(lines), daemon=True)
    reader.start()
    while not got:  # the last line already there, first
        time.sleep(0.01)
    proc.log("a new line")
    while "a new line" not in got:
        time.sleep(0.01)
    proc.stop()
    reader.join(timeout=30)
    assert not reader.is_alive(), "following did not end when the process stopped"
    assert got[-2:] == ["a new line", "decode-0: terminated"], got
    with pytest.raises(LaunchError, match="has no process 'nope'"):
        list(lifecycle.logs(fake, "sc-logs", "nope"))


def test_leave_running_makes_the_lock_directory_down_looks_for(fake: FakeRuntime) -> None:
    fake.leave_running(plan_from(topology("sc-dir")), names=["prefill-0"])
    assert deployment_dir("sc-dir").is_dir()


def test_status_of_an_engine_that_exited_after_up(fake: FakeRuntime) -> None:
    lifecycle.up(fake, plan_from(topology("sc-died")), opts(canary=False))
    decode = fake.process("sc-died", "decode-0")
    assert decode is not None
    decode.stop()  # it ends on its own, as an engine killed by the OOM killer
    report = lifecycle.status(fake, "sc-died")
    assert report is not None and not report.healthy
    row = next(r for r in report.rows if r["process"] == "decode-0")
    assert row["alive"] is False and row["health"] != "healthy", row
    lifecycle.down(fake, "sc-died")
    nothing_left(fake, "sc-died")
