"""Launch's decisions over scripted hosts (issue 11): rollback order, partial failures,
reconciliation with what already runs, status of an unreachable host, an upload that hangs,
and the readiness loop under a fake clock.

The hosts are :class:`tests.support.fake_host.FakeHost` (no network, no shell); the plan comes
from pdlaunch's own loader, rules and planner; health answers from the fake world.
"""

from __future__ import annotations

import importlib
import json
import time

import pytest
import yaml

from pdlaunch import rules
from pdlaunch.backends.ssh.runtime import SshRuntime
from pdlaunch.hosts import HostError, ProcessSurvived
from pdlaunch.plan.build import Plan, build_plan
from pdlaunch.runtime import lifecycle
from pdlaunch.runtime.lifecycle import LaunchError, Reporter, UpOptions
from pdlaunch.runtime.lifecycle.readiness import ABORTED, DEADLINE, EXITED, READY, wait_until
from pdlaunch.runtime.record import RECORD_FILE
from pdlaunch.runtime.record_store import load_state, save_state
from pdlaunch.runtime.state import deployment_dir
from pdlaunch.spec.load import load_text
from tests.support.fake_host import FakeWorld

A, B = "10.0.0.1", "10.0.0.2"
DEP = "fk"
SECRET = "PDLAUNCH_FAKE_SECRET"
TOPOLOGY = {
    "deployment": DEP,
    "model": {"name": "fake-model"},
    "defaults": {"work_dir": "/srv/pd", "env": {"HF_TOKEN": "${env:" + SECRET + "}"}},
    "hosts": {A: {"local": False}, B: {"local": False}},
    "prefill": [{"host": A, "device": "cpu", "port": 8100}],
    "decode": [
        {"host": B, "device": "cpu", "port": 8200},
        {"host": A, "device": "cpu", "port": 8201},
    ],
    "router": {"host": A, "port": 8123},
}
# Imported by name: the package's `up` attribute is the function, which hides the module.
launch_readiness = importlib.import_module("pdlaunch.runtime.lifecycle.readiness")
launch_inspect = importlib.import_module("pdlaunch.runtime.lifecycle.inspect")
ssh_launch = importlib.import_module("pdlaunch.backends.ssh.launch")


# The one lifecycle on the SSH runtime, its hosts opened by the fake world.
def up(plan, opts, reporter=None, *, opener):
    return lifecycle.up(SshRuntime(opts.connect, opener), plan, opts, reporter)


def down(deployment, *, grace, opener):
    return lifecycle.down(SshRuntime(opener=opener), deployment, grace=grace)


def status(deployment, *, opener):
    report = lifecycle.status(SshRuntime(opener=opener), deployment)
    return (report.observation, report.rows) if report else (None, [])
ROLES = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode", "router": "router"}


def make_plan(spec: dict) -> Plan:
    topo, source = load_text(yaml.safe_dump(spec), "fk.yaml")
    findings = rules.validate(topo, source)
    assert not rules.has_errors(findings), findings
    return build_plan(topo)


PLAN = make_plan(TOPOLOGY)


def opts(**kw) -> UpOptions:
    return UpOptions(canary=False, timeout=5, poll_interval=0.01, stop_grace=0, **kw)


def stop_roles(world: FakeWorld) -> list[str]:
    return [ROLES[s.split("#")[0]] for s in world.stopped()]


def state_bytes() -> bytes:
    return (deployment_dir(DEP) / RECORD_FILE).read_bytes()


@pytest.fixture
def world(monkeypatch, tmp_path) -> FakeWorld:
    monkeypatch.setenv("PDLAUNCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(SECRET, "s3cret-value")
    w = FakeWorld().learn(PLAN)
    monkeypatch.setattr(launch_readiness.health, "probe", w.probe)
    monkeypatch.setattr(launch_inspect.health, "probe", w.probe)
    # An engine that dies is noticed at the next liveness check (1 s in production); these
    # tests decide the same thing sooner.
    monkeypatch.setattr(launch_readiness, "ALIVE_EVERY", 0.02)
    return w


@pytest.fixture
def running(world) -> FakeWorld:
    """A deployment brought up through the fakes, the calls of that `up` forgotten."""
    result = up(PLAN, opts(), opener=world.opener)
    assert result.changed and world.alive_names() == sorted(ROLES)
    assert load_state(DEP).status == "up"
    world.calls.clear()
    return world


# -- the fake itself --------------------------------------------------------------------------
def test_a_plain_up_starts_engines_before_the_router_and_records_every_pid(world):
    result = up(PLAN, opts(), opener=world.opener)
    assert result.changed and result.adopted == []
    started = world.started()
    assert started[-1] == "router" and sorted(started[:-1]) == ["decode-0", "decode-1", "prefill-0"]
    assert {h for h, _ in world.calls_to("open")} == {A, B}
    state = load_state(DEP)
    pids = {p.name: p.pid for p in state.processes}
    assert pids == {p.name: p.pid for p in world.alive()}
    # the secret reached its hosts only as a 0600 file
    secrets = {path: world.files[(h, path)] for h, path in world.paths(".secrets.env")}
    assert secrets and all(mode == 0o600 for _, mode in secrets.values())
    assert all(b"s3cret-value" in data for data, _ in secrets.values())


def test_parallel_starts_share_state_writes_and_each_pid_is_on_disk_before_it_goes_on(
    world, monkeypatch
):
    """Many engines start at once; the record must hold each pid before its start step goes
    on (a kill -9 then still leaves `down` a record), yet not cost one whole-record write
    (fsync) per engine in a row."""
    wide = dict(
        TOPOLOGY,
        prefill=[{"host": h, "device": "cpu", "port": 8100 + i} for i, h in enumerate([A, B] * 8)],
    )
    plan = make_plan(wide)
    world.learn(plan)
    engines = len(plan.by_role("prefill")) + len(plan.by_role("decode"))
    writes = []
    real_save = ssh_launch.save_state

    def slow_save(state):  # the real write, made slow as an fsync on a busy disk
        time.sleep(0.02)
        writes.append(sum(p.pid is not None for p in state.processes))
        return real_save(state)

    monkeypatch.setattr(ssh_launch, "save_state", slow_save)
    unrecorded: list[str] = []

    class Watch(Reporter):
        def views(self, views):
            self.rows = views

        def update(self):  # after every step of every process
            # the views first: a start step shows "waiting for health" only after its pid is
            # on disk, so a record read after the views holds every pid they show
            seen = [(v.name, v.pid) for v in self.rows if v.detail == "waiting for health"]
            on_disk = load_state(DEP)
            recorded = {p.name: p.pid for p in on_disk.processes} if on_disk else {}
            unrecorded.extend(name for name, pid in seen if recorded.get(name) != pid)

    result = up(plan, opts(), Watch(), opener=world.opener)
    assert result.changed and len(world.alive()) == engines + 1
    assert unrecorded == []
    start_writes = [n for n in writes if 0 < n <= engines]
    assert 1 <= len(start_writes) < engines / 2, writes


# -- rollback ---------------------------------------------------------------------------------
def test_rollback_when_decode_0_cannot_start_stops_what_started_decode_then_prefill(world):
    world.fail(B, "start_tracked", name="decode-0")
    with pytest.raises(LaunchError) as info:
        up(PLAN, opts(), opener=world.opener)
    err = info.value
    assert "decode-0 on 10.0.0.2 could not be started" in str(err)
    assert err.rolled_back is True
    assert "router" not in world.started()  # engines first: the router never started
    assert stop_roles(world) == ["decode", "prefill"]
    assert world.alive() == []
    assert world.paths(".secrets.env") == []
    assert world.calls_to("put_files"), "secrets were uploaded before the failure"
    assert not (deployment_dir(DEP) / RECORD_FILE).exists()


def test_rollback_after_the_router_exits_stops_router_then_decode_then_prefill(world):
    world.dies_at_start.add("router")
    with pytest.raises(LaunchError) as info:
        up(PLAN, opts(), opener=world.opener)
    err = info.value
    assert "router on 10.0.0.1: exited during start" in str(err)
    assert err.rolled_back is True
    assert stop_roles(world) == ["router", "decode", "decode", "prefill"]
    # the secret files go in the same order as the processes
    rm_roles = [
        ROLES[path.rsplit("/", 1)[1].split(".")[0]]
        for _, cmd in world.calls_to("run")
        if cmd.startswith("rm -f --")
        for path in cmd.split()[3:]
    ]
    assert rm_roles[:1] == ["router"] and rm_roles[-1] == "prefill"
    assert rm_roles.index("prefill") > max(i for i, r in enumerate(rm_roles) if r == "decode")
    assert world.alive() == [] and world.paths(".secrets.env") == []
    assert not (deployment_dir(DEP) / RECORD_FILE).exists()


def test_a_stop_failing_on_host_b_keeps_exactly_that_pid_recorded(world):
    world.dies_at_start.add("router")
    world.fail(B, "stop", error=HostError(f"{B}: cannot stop: sudo said no", host=B))
    with pytest.raises(LaunchError) as info:
        up(PLAN, opts(), opener=world.opener)
    err = info.value
    assert err.rolled_back is False
    assert "decode-0" in str(err) and f"pdlaunch down {DEP}" in str(err)
    left = [p for p in world.alive()]
    assert [p.name for p in left] == ["decode-0"] and left[0].host == B
    state = load_state(DEP)
    assert state.status == "failed"
    assert [(p.name, p.pid) for p in state.started()] == [("decode-0", left[0].pid)]


def test_a_stop_that_timed_out_once_is_asked_again_and_rollback_completes(world):
    # CI: on a loaded 2-core host a stop command stalled past its timeout during rollback
    # (tests/system/netns DP MoE case); the stop is idempotent, so launch asks again.
    world.dies_at_start.add("router")
    world.hang(B, "stop", times=1)
    with pytest.raises(LaunchError) as info:
        up(PLAN, opts(), opener=world.opener)
    assert info.value.rolled_back is True, str(info.value)
    assert world.alive() == []
    assert [s.split("#")[0] for s in world.stopped()].count("decode-0") == 2


def test_a_group_alive_after_sigkill_once_is_asked_again_and_rollback_completes(world):
    # CI: two workers of a DP decode were still alive 10 s after SIGKILL on a loaded host.
    world.dies_at_start.add("router")
    world.fail(
        B,
        "stop",
        error=ProcessSurvived(f"{B}: cannot stop pid 1: still alive after SIGKILL: 2 3", host=B),
        times=1,
    )
    with pytest.raises(LaunchError) as info:
        up(PLAN, opts(), opener=world.opener)
    assert info.value.rolled_back is True, str(info.value)
    assert world.alive() == []
    assert [s.split("#")[0] for s in world.stopped()].count("decode-0") == 2


def test_a_stop_that_always_times_out_gives_up_after_three_tries_and_keeps_the_pid(world):
    world.dies_at_start.add("router")
    world.hang(B, "stop")
    with pytest.raises(LaunchError) as info:
        up(PLAN, opts(), opener=world.opener)
    err = info.value
    assert err.rolled_back is False and "3 tries" in str(err) and "decode-0" in str(err)
    assert [s.split("#")[0] for s in world.stopped()].count("decode-0") == 3
    assert [p.name for p in load_state(DEP).started()] == ["decode-0"]


# -- reconciliation ---------------------------------------------------------------------------
def test_up_again_adopts_the_survivors_and_starts_only_the_dead_decode(running):
    world = running
    old = {p.name: p.pid for p in world.alive()}
    world.kill("decode-0")
    result = up(PLAN, opts(), opener=world.opener)
    assert result.changed
    assert result.adopted == ["decode-1", "prefill-0", "router"]
    assert world.started() == ["decode-0"]
    assert world.stopped() == []
    state = load_state(DEP)
    assert state.status == "up"
    for name in ("prefill-0", "decode-1", "router"):
        assert state.process(name).pid == old[name]
    assert state.process("decode-0").pid not in (None, old["decode-0"])


def test_adopt_with_one_decode_names_prefill_and_router(world):
    spec = {**TOPOLOGY, "decode": TOPOLOGY["decode"][:1]}
    plan = make_plan(spec)
    up(plan, opts(), opener=world.opener)
    world.calls.clear()
    world.kill("decode-0")
    result = up(plan, opts(), opener=world.opener)
    assert result.adopted == ["prefill-0", "router"]
    assert world.started() == ["decode-0"] and world.stopped() == []


def test_up_refuses_when_a_host_cannot_be_surveyed_and_leaves_the_record_alone(running):
    world = running
    before = state_bytes()
    world.fail(B, "open")
    with pytest.raises(LaunchError) as info:
        up(PLAN, opts(), opener=world.opener)
    assert "cannot verify" in str(info.value) and "decode-0" in str(info.value)
    assert world.started() == [] and world.stopped() == []
    assert world.alive_names() == sorted(ROLES)
    after = state_bytes()
    # Same content first (so a failure below is only the rewrite), then the same bytes: a
    # refusal must not touch the record at all (issue 11: "the state file unchanged").
    same_but_time = {**json.loads(after), "updated_at": None}
    assert same_but_time == {**json.loads(before), "updated_at": None}
    assert after == before, "up rewrote the record it refused to act on (updated_at changed)"


def test_down_stops_a_process_whose_pid_reached_only_its_pid_file(running):
    world = running
    state = load_state(DEP)
    ps = state.process("decode-0")
    pid = ps.pid
    ps.pid = ps.start_time = None  # `up` killed -9 between the start and the record
    save_state(state)
    result = down(DEP, grace=0, opener=world.opener)
    assert "decode-0" in result.stopped
    assert f"decode-0#{pid}" in world.stopped()
    assert world.alive() == []
    assert load_state(DEP) is None


def test_down_stops_a_second_copy_beside_the_recorded_one(running):
    world = running
    recorded = load_state(DEP).process("decode-0")
    copy = world.spawn(B, recorded.pid_path, recorded.log_path)  # its pid file now names it
    assert copy.pid != recorded.pid
    down(DEP, grace=0, opener=world.opener)
    stopped = world.stopped()
    assert f"decode-0#{recorded.pid}" in stopped and f"decode-0#{copy.pid}" in stopped
    assert world.alive() == []
    assert load_state(DEP) is None


def spawn_unrecorded(world: FakeWorld) -> dict[str, int]:
    """The plan's processes running on their hosts, started from another control host."""
    return {p.name: world.spawn(p.host, p.pid_path, p.log_path).pid for p in PLAN.processes}


def test_up_refuses_unrecorded_processes_found_by_their_pid_files(world):
    spawn_unrecorded(world)
    with pytest.raises(LaunchError) as info:
        up(PLAN, opts(topology_path="fk.yaml"), opener=world.opener)
    msg = str(info.value)
    assert all(name in msg for name in ROLES)
    assert "pdlaunch down fk.yaml" in msg
    assert world.started() == [] and world.stopped() == []
    assert load_state(DEP) is None


def test_up_replace_stops_unrecorded_processes_and_starts_fresh(world):
    old = spawn_unrecorded(world)
    result = up(PLAN, opts(replace=True), opener=world.opener)
    assert result.changed and result.adopted == []
    assert sorted(world.stopped()) == sorted(f"{n}#{pid}" for n, pid in old.items())
    assert stop_roles(world) == ["router", "decode", "decode", "prefill"]
    assert sorted(world.started()) == sorted(ROLES)
    assert world.alive_names() == sorted(ROLES)
    assert not set(old.values()) & {p.pid for p in world.alive()}


# -- status -----------------------------------------------------------------------------------
def test_status_reports_an_unreachable_hosts_processes_as_unknown_not_dead(running):
    world = running
    world.fail(B, "open")
    _, rows = status(DEP, opener=world.opener)
    by = {r["process"]: r for r in rows}
    assert by["decode-0"]["alive"] is None
    assert "connection refused" in by["decode-0"]["error"]
    for name in ("prefill-0", "decode-1", "router"):
        assert by[name]["alive"] is True and by[name]["error"] is None
    assert world.stopped() == []


# -- a hanging upload -------------------------------------------------------------------------
def test_an_upload_that_hangs_names_the_host_and_leaves_nothing_started(world):
    world.hang(B, "put_files")
    with pytest.raises(LaunchError) as info:
        up(PLAN, opts(), opener=world.opener)
    assert B in str(info.value)
    assert world.started() == [] and world.alive() == []
    assert info.value.rolled_back is None  # nothing had been started
    assert world.paths(".secrets.env") == []
    assert load_state(DEP) is None


# -- readiness --------------------------------------------------------------------------------
class Clock:
    """Fake time: sleeping advances it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


class Alive:
    def __init__(self, clock: Clock, alive: bool = True):
        self.clock, self.alive, self.asked = clock, alive, []

    def __call__(self) -> bool:
        self.asked.append(self.clock.now)
        return self.alive


def test_wait_ready_on_the_first_probe():
    clock = Clock()
    alive = Alive(clock)
    out = wait_until(
        lambda t: (True, "healthy"), alive, deadline=10, clock=clock, sleep=clock.sleep
    )
    assert out.status == READY and out.ready and out.detail == "healthy"
    assert clock.slept == [] and alive.asked == []


def test_wait_an_exited_process_is_exited_not_deadline():
    clock = Clock()
    alive = Alive(clock, alive=False)
    out = wait_until(
        lambda t: (False, "connection refused"),
        alive,
        deadline=10,
        clock=clock,
        sleep=clock.sleep,
        interval=0.25,
        alive_every=1.0,
    )
    assert out.status == EXITED and out.detail == "connection refused"
    assert clock.now < 10


def test_wait_a_process_that_exits_at_the_deadline_is_exited():
    clock = Clock()
    alive = Alive(clock, alive=False)
    out = wait_until(
        lambda t: (False, "HTTP 503"),
        alive,
        deadline=0.5,
        clock=clock,
        sleep=clock.sleep,
        interval=0.25,
        alive_every=5.0,
    )
    assert out.status == EXITED
    assert alive.asked == [0.5]


def test_wait_deadline_carries_the_last_probe_detail():
    clock = Clock()
    answers = iter(f"HTTP 503 #{i}" for i in range(1000))
    last: list[str] = []

    def probe(timeout: float) -> tuple[bool, str]:
        last.append(next(answers))
        return False, last[-1]

    out = wait_until(
        probe,
        Alive(clock),
        deadline=3,
        clock=clock,
        sleep=clock.sleep,
        interval=0.25,
        alive_every=1.0,
    )
    assert out.status == DEADLINE and out.detail == last[-1] != last[0]
    assert clock.now == 3


def test_wait_aborted():
    clock = Clock()
    checks = iter([False, False, True])
    out = wait_until(
        lambda t: (False, "HTTP 503"),
        Alive(clock),
        deadline=10,
        clock=clock,
        sleep=clock.sleep,
        interval=0.25,
        aborted=lambda: next(checks),
    )
    assert out.status == ABORTED and out.detail == "HTTP 503"
    assert clock.now == 0.5


@pytest.mark.parametrize("is_up, expected", [(True, READY), (False, EXITED)])
def test_wait_headless_is_ready_iff_alive(is_up, expected):
    clock = Clock()
    alive = Alive(clock, alive=is_up)
    out = wait_until(None, alive, deadline=10, clock=clock, sleep=clock.sleep)
    assert out.status == expected and alive.asked == [0.0]


def test_wait_asks_is_alive_at_most_once_per_alive_every():
    clock = Clock()
    alive = Alive(clock)
    out = wait_until(
        lambda t: (False, "HTTP 503"),
        alive,
        deadline=10,
        clock=clock,
        sleep=clock.sleep,
        interval=0.25,
        alive_every=1.0,
    )
    assert out.status == DEADLINE
    gaps = [b - a for a, b in zip([0.0, *alive.asked], alive.asked, strict=False)]
    assert all(g >= 1.0 for g in gaps), gaps
    assert 9 <= len(alive.asked) <= 10  # asked regularly, not only at the deadline
