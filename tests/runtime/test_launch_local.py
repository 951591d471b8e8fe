"""`up`/`down`/`status`/`logs` on the control host itself (LocalHost), with the fake engine
and router: happy path, idempotence, --replace, faults and rollback, secrets, the lock."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pdlaunch.observe.health import post_json
from pdlaunch.plan.build import build_plan
from pdlaunch.runtime.record_store import load_state
from pdlaunch.runtime.state import DeploymentLock
from pdlaunch.spec.load import load
from tests.support.deployments import SECRET_ENV, cli
from tests.support.processes import procs_under, wait_no_procs


def _status_json(target) -> dict:
    res = cli("status", target, "--json")
    return json.loads(res.stdout)


def test_up_status_logs_idempotent_replace_down(make_deployment, state_dir):
    dep = make_deployment("happy")
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 0, res.output
    assert "happy is up: 3 process(es) healthy" in res.output
    assert "served disaggregated" in res.output
    assert f"http://127.0.0.1:{dep.ports['router']}/v1" in res.output
    state = load_state("happy")
    assert state is not None and state.status == "up"
    assert {p.name: p.pid is not None for p in state.processes} == {
        "prefill-0": True,
        "decode-0": True,
        "router": True,
    }
    assert sorted(procs_under(dep.work_root)) == sorted(p.pid for p in state.processes)

    # status (by topology file and by name), table and JSON
    st = _status_json(dep.path)
    assert st["healthy"] is True
    assert [(r["process"], r["alive"], r["health"]) for r in st["processes"]] == [
        ("prefill-0", True, "healthy"),
        ("decode-0", True, "healthy"),
        ("router", True, "healthy"),
    ]
    assert all(r["uptime_s"] is not None and r["pid"] for r in st["processes"])
    res = cli("status", "happy")
    assert res.exit_code == 0 and "decode-0" in res.output

    # logs: the engine's own lines; NAME alone works when one deployment is recorded
    res = cli("logs", "decode-0", "-n", "50")
    assert res.exit_code == 0, res.output
    assert "serving on http://127.0.0.1:" in res.output
    res = cli("logs", dep.path, "nope")
    assert res.exit_code == 1 and "no process 'nope'" in res.output

    # unchanged and healthy: nothing to do, same pids
    res = cli("up", dep.path)
    assert res.exit_code == 0, res.output
    assert "already up and unchanged" in res.output
    assert [p.pid for p in load_state("happy").processes] == [p.pid for p in state.processes]

    # changed: say what, refuse without --replace
    dep.spec["router"]["policy"] = "random"
    dep.write()
    res = cli("up", dep.path)
    assert res.exit_code == 1
    assert "--replace" in res.output and "router:" in res.output
    assert "round_robin" in res.output and "random" in res.output
    assert "nothing was started" in res.output
    assert [p.pid for p in load_state("happy").processes] == [p.pid for p in state.processes]
    res = cli("up", dep.path, "--replace", "--timeout", "120")
    assert res.exit_code == 0, res.output
    new = load_state("happy")
    assert all(a.pid != b.pid for a, b in zip(new.processes, state.processes, strict=True))
    assert len(procs_under(dep.work_root)) == 3

    # down: everything stops, state goes; again: nothing to do
    res = cli("down", dep.path, "--grace", "5")
    assert res.exit_code == 0, res.output
    assert "happy is down (3 process(es) stopped)" in res.output
    assert wait_no_procs(dep.work_root) == []
    assert load_state("happy") is None
    res = cli("down", dep.path)
    assert res.exit_code == 0 and "nothing to stop" in res.output
    res = cli("status", dep.path)
    assert res.exit_code == 1 and "not running" in res.output


def test_down_without_state_finds_processes_by_pid_file_and_log(make_deployment, state_dir):
    dep = make_deployment("lost")
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 0, res.output
    pids = sorted(p.pid for p in load_state("lost").processes)
    shutil.rmtree(state_dir)  # the record is gone (another control host, a wiped home)

    # by name there is nothing to go on: nothing is touched
    res = cli("down", "lost")
    assert res.exit_code == 0 and "nothing recorded; nothing to stop" in res.output
    assert sorted(procs_under(dep.work_root)) == pids

    # a pid file naming an unrelated process (a reused pid) must not get it killed; the
    # process it lost track of is still found, by the log it holds open (issue 26)
    plan = build_plan(load(dep.path)[0])
    decoy = subprocess.Popen(["sleep", "60"], start_new_session=True)
    prefill = plan.by_role("prefill")[0]
    Path(prefill.pid_path).write_text(f"{decoy.pid}\n")
    try:
        res = cli("down", dep.path, "--grace", "5")
        assert res.exit_code == 0, res.output
        assert "3 process(es) found by their pid files and stopped" in res.output
        assert decoy.poll() is None, "down killed a process that only a pid file named"
        assert wait_no_procs(dep.work_root) == []
        res = cli("down", dep.path)
        assert res.exit_code == 0 and "no process of it runs" in res.output
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()
        for pid in procs_under(dep.work_root):
            os.kill(pid, signal.SIGKILL)


def test_process_exits_at_start_rolls_back(make_deployment):
    dep = make_deployment(
        "exits", decode_env={"FAKE_VLLM_MODE": "exit"}, prefill_env={"FAKE_VLLM_DELAY": "0.3"}
    )
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 1
    assert "decode-0 on 127.0.0.1: exited during start" in res.output
    assert "simulated engine failure at start" in res.output  # last log lines shown
    assert "rolled back" in res.output
    assert wait_no_procs(dep.work_root) == []
    assert load_state("exits") is None
    # down after a failed up: fine, nothing to do
    res = cli("down", dep.path)
    assert res.exit_code == 0 and "nothing to stop" in res.output


def test_health_never_comes_rolls_back(make_deployment):
    dep = make_deployment("hangs", prefill_env={"FAKE_VLLM_MODE": "hang"})
    t0 = time.monotonic()
    res = cli("up", dep.path, "--timeout", "3", "--grace", "2")
    assert res.exit_code == 1
    assert time.monotonic() - t0 < 60
    assert "prefill-0 on 127.0.0.1: not healthy before the deadline" in res.output
    assert wait_no_procs(dep.work_root) == []
    assert load_state("hangs") is None


def test_unhealthy_router_and_router_exit(make_deployment):
    dep = make_deployment("rexit", router_env={"FAKE_ROUTER_MODE": "exit"})
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 1
    assert "router on 127.0.0.1: exited during start" in res.output
    assert "simulated router failure" in res.output
    assert wait_no_procs(dep.work_root) == []


def test_canary_catches_non_disaggregated_serving(make_deployment):
    dep = make_deployment("bypass", router_env={"FAKE_ROUTER_MODE": "bypass"})
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 1
    assert "canary failed" in res.output and "not disaggregated" in res.output
    assert 'source="external_kv_transfer"' in res.output
    assert wait_no_procs(dep.work_root) == []


def test_canary_catches_a_partial_kv_transfer(make_deployment):
    dep = make_deployment("partial", decode_env={"FAKE_VLLM_MODE": "partial_kv"})
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 1, res.output
    assert "some of prefill's KV blocks were not transferred" in res.output
    assert wait_no_procs(dep.work_root) == []


def test_canary_catches_disaggregated_serving_that_answers_wrong(make_deployment):
    # Decode loads the KV (the counters say "disaggregated") but decodes garbage, HTTP 200:
    # only comparing with prefill alone can see it.
    dep = make_deployment("corrupt", decode_env={"FAKE_VLLM_MODE": "corrupt_kv"})
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 1, res.output
    # The pair's own direct request catches it, before the router's (pdlaunch/observe/canary.py).
    assert "prefill-0 → decode-0: " in res.output
    assert "decode read KV it cannot use correctly" in res.output
    assert "' garbage garbage garbage garbage garbage garbage garbage garbage'" in res.output
    assert "prefill alone answers ' tok tok tok tok tok tok tok tok'" in res.output
    assert "rolled back" in res.output
    assert wait_no_procs(dep.work_root) == []
    # the same deployment with a decode that reads its KV right passes
    dep = make_deployment("correct")
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 0, res.output
    assert "answered as prefill alone does" in res.output
    assert cli("down", dep.path).exit_code == 0


def test_killed_process_shows_dead_in_status(make_deployment):
    dep = make_deployment("killed", router_env={"FAKE_ROUTER_MODE": "bypass"})
    res = cli("up", dep.path, "--no-canary", "--timeout", "120", "--json")
    assert res.exit_code == 0, res.output  # the canary would fail: --no-canary skips it
    data = json.loads(res.stdout)
    assert data["ok"] and data["changed"] and data["canary"] is None
    assert data["endpoint"] == f"http://127.0.0.1:{dep.ports['router']}"
    decode = load_state("killed").process("decode-0")
    os.killpg(decode.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while decode.pid in procs_under(dep.work_root) and time.monotonic() < deadline:
        time.sleep(0.05)
    res = cli("status", dep.path, "--json")
    assert res.exit_code == 1
    rows = {r["process"]: r for r in json.loads(res.stdout)["processes"]}
    assert rows["decode-0"]["alive"] is False and rows["decode-0"]["health"] != "healthy"
    assert rows["prefill-0"]["alive"] is True and rows["router"]["alive"] is True
    res = cli("status", dep.path)
    assert res.exit_code == 1 and "no" in res.output
    # up adopts the processes still running and starts decode again; here the canary fails
    # (the router bypasses decode), so it stops the decode it started and keeps the others
    res = cli("up", dep.path)
    assert res.exit_code == 1, res.output
    assert "still running, as before this `up` (recorded): prefill-0, router" in res.output
    st = load_state("killed")
    assert st.process("decode-0").pid is None
    alive = procs_under(dep.work_root)
    assert st.process("prefill-0").pid in alive and st.process("router").pid in alive
    assert cli("down", dep.path).exit_code == 0
    assert wait_no_procs(dep.work_root) == []


def test_secret_reaches_process_and_leaks_nowhere(make_deployment, monkeypatch, tmp_path):
    secret = "s3cr3t-" + os.urandom(8).hex()
    monkeypatch.setenv(SECRET_ENV, secret)
    dep = make_deployment(
        "secret",
        env={"HF_TOKEN": "${env:" + SECRET_ENV + "}", "FAKE_VLLM_REQUIRE_ENV": "HF_TOKEN"},
    )
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 0, res.output  # the fake engine exits 4 without HF_TOKEN
    outputs = [res.output]
    outputs.append(cli("status", dep.path, "--json").output)
    outputs.append(cli("logs", dep.path, "prefill-0").output)
    assert "required variable HF_TOKEN is set" in outputs[-1]
    for name in ("prefill-0", "decode-0"):
        f = dep.work_dir / "run" / f"{name}.secrets.env"
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert secret in f.read_text()  # the only place it may be
    outputs.append(cli("down", dep.path).output)
    assert not list((dep.work_dir / "run").glob("*.secrets.env"))  # removed by down
    assert all(secret not in o for o in outputs)
    for f in tmp_path.rglob("*"):  # scripts, logs, pid files, state, topology
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_missing_secret_is_refused_before_anything_starts(make_deployment, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    dep = make_deployment("nosecret", decode_env={"HF_TOKEN": "${env:" + SECRET_ENV + "}"})
    res = cli("up", dep.path)
    assert res.exit_code == 1
    assert f"secret(s) not set in this shell: {SECRET_ENV} (for decode-0)" in res.output
    assert "nothing was started" in res.output
    assert not dep.work_root.exists()
    assert load_state("nosecret") is None


def test_concurrent_up_is_refused(make_deployment):
    dep = make_deployment("locked")
    with DeploymentLock("locked", "up"):
        res = cli("up", dep.path)
        assert res.exit_code == 1
        assert "locked by another pdlaunch run" in res.output
        res = cli("down", dep.path)
        assert res.exit_code == 1 and "locked" in res.output
    assert procs_under(dep.work_root) == []


def test_second_up_process_refused_and_down_after_killed_up(make_deployment, state_dir):
    """A real second process: `up` #1 is waiting for a slow engine; `up` #2 is refused.
    Then `up` #1 is killed hard (no rollback): the state it wrote lets `down` clean up."""
    dep = make_deployment("crash", prefill_env={"FAKE_VLLM_DELAY": "60"})
    env = dict(os.environ, PDLAUNCH_STATE_DIR=str(state_dir))
    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from pdlaunch.cli import main; main()",
            "up",
            str(dep.path),
            "--timeout",
            "120",
            "--skip-check",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = load_state("crash")
            if st is not None and all(p.pid for p in st.processes if p.role != "router"):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("first up never recorded its processes")
        res = cli("up", dep.path)
        assert res.exit_code == 1 and "locked by another pdlaunch run" in res.output
    finally:
        first.kill()
        first.wait()
    assert len(procs_under(dep.work_root)) == 2  # orphans of the killed `up`
    res = cli("status", dep.path, "--json")
    assert json.loads(res.stdout)["status"] == "starting"
    res = cli("down", dep.path, "--grace", "2")
    assert res.exit_code == 0, res.output
    assert "2 process(es) stopped" in res.output
    assert wait_no_procs(dep.work_root) == []


def test_canary_through_the_real_vllm_router(make_deployment):
    """vllm-router (--vllm-pd-disaggregation) forwards prefill's kv_transfer_params to decode;
    the fake engines count the prompt as external_kv_transfer only then."""
    dep = make_deployment("realrouter")
    dep.spec["router"]["binary"] = shutil.which("vllm-router")
    dep.write()
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 0, res.output
    assert "served disaggregated" in res.output
    assert cli("down", dep.path).exit_code == 0
    assert wait_no_procs(dep.work_root) == []


def test_unwritable_work_dir_fails_before_starting(make_deployment, monkeypatch, tmp_path):
    monkeypatch.setenv(SECRET_ENV, "x")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    dep = make_deployment("nodir", env={"HF_TOKEN": "${env:" + SECRET_ENV + "}"})
    dep.spec["defaults"]["work_dir"] = str(blocker / "work")
    dep.write()
    res = cli("up", dep.path)
    assert res.exit_code == 1
    assert "preparing the hosts failed" in res.output and "nothing was started" in res.output
    assert load_state("nodir") is None


def test_preflight_check_refuses_an_occupied_port(make_deployment):
    """`up` runs the fast check first: a taken HTTP port stops it before anything starts."""
    import socket

    dep = make_deployment("preflight")
    port = dep.spec["prefill"][0]["port"]
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        res = cli("up", dep.path, "--with-check", "--timeout", "60")
    assert res.exit_code == 1, res.output
    assert "preflight check failed" in res.output and str(port) in res.output
    assert load_state("preflight") is None


def _json_docs(text: str) -> list[dict]:
    docs, dec, i = [], json.JSONDecoder(), 0
    text = text.strip()
    while i < len(text):
        doc, end = dec.raw_decode(text, i)
        docs.append(doc)
        i = end
        while i < len(text) and text[i].isspace():
            i += 1
    return docs


def _requests_through(url: str, n: int, every: float) -> threading.Thread:
    def send() -> None:
        for i in range(n):
            post_json(url + "/v1/completions", {"model": "fake-model", "prompt": f"p{i} " * 40})
            time.sleep(every)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("mode", ["pd", "bypass"])
def test_status_watch_proves_disaggregation_while_serving(make_deployment, mode):
    dep = make_deployment(f"watch{mode}", router_env={"FAKE_ROUTER_MODE": mode})
    res = cli("up", dep.path, "--timeout", "120", "--no-canary")
    assert res.exit_code == 0, res.output
    router = f"http://127.0.0.1:{dep.ports['router']}"
    sender = _requests_through(router, 6, 0.25)
    res = cli("status", dep.name, "--watch", "--interval", "1", "--count", "2", "--json")
    sender.join(timeout=30)
    docs = _json_docs(res.stdout)
    assert len(docs) == 2, res.output
    decode = [p for d in docs for p in d["processes"] if p["process"] == "decode-0"]
    assert sum(p["requests"] for p in decode) > 0, docs
    if mode == "pd":
        assert res.exit_code == 0, res.output
        assert sum(p["kv_transfer_tokens"] for p in decode) > 0
        assert all(p["flags"] == [] for p in decode)
        # the fake engine exports no queue-time histogram: no lease estimate, no warning
        assert all(p["warnings"] == [] for p in decode)
    else:  # the router skipped prefill: decode answers 200 and computes every prompt itself
        assert res.exit_code == 1, res.output
        assert any("NOT DISAGGREGATED" in f for p in decode for f in p["flags"]), docs
    assert cli("down", dep.path).exit_code == 0
    assert wait_no_procs(dep.work_root) == []


def test_doctor_names_a_known_failure_and_bundles_without_secrets(
    make_deployment, monkeypatch, tmp_path
):
    secret = "doc-s3cr3t-" + os.urandom(6).hex()
    monkeypatch.setenv(SECRET_ENV, secret)
    dep = make_deployment(
        "doctor",
        env={"HF_TOKEN": "${env:" + SECRET_ENV + "}", "FAKE_VLLM_REQUIRE_ENV": "HF_TOKEN"},
    )
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 0, res.output
    res = cli("doctor", dep.name, "--json")
    assert res.exit_code == 0, res.output  # the stand-in router has no /metrics: a warning
    assert not [f for f in json.loads(res.stdout)["findings"] if f["severity"] == "error"]
    # vLLM 0.32's message for a block-size mismatch (tests/fixtures/doctor/lines.yaml), as a
    # decode would log it, plus the secret leaking into a log line
    state = load_state("doctor")
    assert state.secret_names == [SECRET_ENV]  # the name, recorded at up; never the value
    log = state.process("decode-0").log_path
    with open(log, "a") as f:
        f.write(
            "(EngineCore pid=22775) ERROR 11-23 10:33:34 [base_worker.py:1354] AssertionError: "
            "Local block size 16 is not divisible by remote block size 32 or vice versa.\n"
            f"token is {secret}\nloaded {secret}\n"
        )
    # The topology moves away: the recorded names still say what to redact.
    dep.path.rename(tmp_path / "moved.yaml")
    bundle = tmp_path / "bundle.tar.gz"
    res = cli("doctor", dep.name, "--bundle", bundle, "--json")
    assert res.exit_code == 1, res.output
    found = {f["id"]: f for f in json.loads(res.stdout)["findings"]}
    assert found["kv-block-size-divisibility"]["process"] == "decode-0"
    assert secret not in res.output
    import tarfile

    with tarfile.open(bundle) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        assert any(m.name.endswith("decode-0.log") for m in members), [m.name for m in members]
        for m in members:
            assert secret.encode() not in tar.extractfile(m).read(), m.name
    assert cli("down", dep.name).exit_code == 0


def test_a_link_at_a_log_path_is_removed_not_appended_through(make_deployment, tmp_path):
    """A dangling link planted at a log path: the start appends to that path (`>>`), which
    would create the link's target; `up` removes the link first (issue 26)."""
    dep = make_deployment("loglink")
    logs = dep.work_dir / "logs"
    logs.mkdir(parents=True, mode=0o700)
    dep.work_dir.chmod(0o700)
    target = tmp_path / "created-through-the-link"
    (logs / "router.log").symlink_to(target)
    res = cli("up", dep.path, "--timeout", "120", "--no-canary")
    assert res.exit_code == 0, res.output
    assert not (logs / "router.log").is_symlink() and (logs / "router.log").is_file()
    assert not target.exists()
    assert cli("down", dep.path).exit_code == 0


def _group_members(pgid: int) -> list[int]:
    """Live members of a process group, read from /proc (not through pdlaunch)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            out.append(int(entry))
    return sorted(out)


def test_engine_leader_killed_children_live_until_down(make_deployment):
    """Issue 26: an engine is its process group. The API server (the recorded pid) killed
    with -9 leaves EngineCore/workers running (here: two children holding the log, as vLLM's
    do): status says partly dead, doctor says so as an error, down stops them all."""
    dep = make_deployment("orphans", decode_env={"FAKE_VLLM_CHILDREN": "2"})
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 0, res.output
    leader = load_state("orphans").process("decode-0").pid
    children = [p for p in _group_members(leader) if p != leader]
    assert len(children) == 2, _group_members(leader)
    os.kill(leader, signal.SIGKILL)  # the leader only: its children live on
    deadline = time.monotonic() + 5
    while leader in procs_under(dep.work_root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group_members(leader) == children

    res = cli("status", dep.path, "--json")
    assert res.exit_code == 1
    row = {r["process"]: r for r in json.loads(res.stdout)["processes"]}["decode-0"]
    assert row["alive"] is False and row["left_running"] == children
    assert row["health"].startswith("partly dead")
    res = cli("status", dep.path)
    assert res.exit_code == 1 and "partly" in res.output

    res = cli("doctor", dep.path, "--json")
    assert res.exit_code == 1, res.output
    found = [f for f in json.loads(res.stdout)["findings"] if f["id"] == "process-partly-dead"]
    assert [(f["process"], f["severity"]) for f in found] == [("decode-0", "error")]
    assert all(str(c) in found[0]["what"] for c in children)

    res = cli("down", dep.path)
    assert res.exit_code == 0, res.output
    assert _group_members(leader) == []
    assert wait_no_procs(dep.work_root) == []
    assert load_state("orphans") is None


def test_up_stops_what_a_dead_leader_left_before_starting_again(make_deployment):
    """`up` over a partly dead engine does not adopt it nor start a second one beside its
    children: it stops the group, then starts the engine afresh."""
    dep = make_deployment("restart", decode_env={"FAKE_VLLM_CHILDREN": "1"})
    assert cli("up", dep.path, "--timeout", "120").exit_code == 0
    leader = load_state("restart").process("decode-0").pid
    (_child,) = [p for p in _group_members(leader) if p != leader]
    os.kill(leader, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while leader in procs_under(dep.work_root) and time.monotonic() < deadline:
        time.sleep(0.05)
    res = cli("up", dep.path, "--timeout", "120")
    assert res.exit_code == 0, res.output
    assert _group_members(leader) == []  # the old child is gone
    new = load_state("restart").process("decode-0").pid
    assert new != leader and len(_group_members(new)) == 2
    assert cli("down", dep.path).exit_code == 0
    assert wait_no_procs(dep.work_root) == []
