"""KV lease rule: the lease prefill holds a finished request's blocks for must cover reading
the longest prompt's KV (kvlease.py has the lease semantics per release).

What it needs and where it comes from:

- the longest prompt: ``model.max_model_len`` (vLLM refuses longer prompts); unset: the model's
  own limit, unknown here, and the rule says nothing;
- KV bytes a token: the model's config.json on this host (layers x KV heads x head dim x 2 x
  the KV dtype's size); a hub id or a path only the nodes have: the rule says nothing;
- the read rate: pdlaunch keeps no record of `check --bandwidth`, so the rule assumes a
  conservative one per device kind, named in the finding: CPU 0.02 GB/s (NIXL over UCX on
  loopback measured 0.029-0.044 GB/s on the project machine, tests/fixtures/bench/hops and
  README), any accelerator 1 GB/s (a TCP path of the 10 GbE class; RDMA does 10-50x that).
  `pdlaunch bench` measures the real rate and the real gap and compares them with the lease;
- the margin: 2x one read: on releases with a timer (VLLM_NIXL_ABORT_REQUEST_TIMEOUT, before
  0.22) nothing renews it while decode queues and reads; on releases with kv_lease_duration
  decode renews it by heartbeats, but only for requests it has received and after its
  handshake with that prefill (base_worker.py:3179-3195), so the first lease must cover the
  hand-off and, for a prompt decode reads only after another long read, that read.
"""

from __future__ import annotations

from collections.abc import Iterator

from pdlaunch.fsutil import ReadRefused
from pdlaunch.plan import lease as kvlease
from pdlaunch.rules.base import Finding, rule, warning
from pdlaunch.spec.topology import Topology

SOURCE = (
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:82-88; "
    "base_worker.py:532,3014-3061,3179-3195; vllm/envs.py (VLLM_NIXL_ABORT_REQUEST_TIMEOUT)"
)
ASSUMED_GBPS = {"cpu": 0.02}
ASSUMED_GBPS_ACCELERATOR = 1.0
MARGIN = 2.0


def topology_lease(topo: Topology) -> kvlease.Lease | None:
    """The shortest lease the topology's prefills run with (their releases' defaults where
    it sets none)."""
    kvc = topo.kv_connector
    if kvc.kind != "nixl":
        return None
    leases = []
    for inst in topo.prefill:
        reads = kvlease.release_reads_lease(topo.vllm_version_of(inst))
        if kvc.kv_lease_duration:
            leases.append(kvlease.Lease(float(kvc.kv_lease_duration), "kv_lease_duration"))
            continue
        env = {kvlease.ABORT_TIMEOUT: str(kvc.abort_request_timeout)}
        cfg = {"kv_connector": "NixlConnector"}
        lease = kvlease.lease_of(cfg, env if kvc.abort_request_timeout else {}, reads)
        if lease is not None:
            leases.append(lease)
    return min(leases, key=lambda x: x.seconds) if leases else None


@rule("kv-lease-budget", "the KV lease covers reading the longest prompt's KV", SOURCE)
def kv_lease_budget(topo: Topology) -> Iterator[Finding]:
    prompt = topo.model.max_model_len
    lease = topology_lease(topo)
    if prompt is None or lease is None:
        return
    try:
        per_token = kvlease.model_kv_bytes_per_token(
            topo.model.name, topo.model.dtype, topo.model.kv_cache_dtype
        )
    except ReadRefused as exc:
        # Not the topology's fault, and the engines read their own copy: a warning, so
        # `validate` says why the budget was not checked instead of hanging or failing.
        yield warning(
            "kv-lease-budget",
            ("model", "name"),
            f"{exc}: the KV lease budget is not checked",
            "point model.name at the model directory whose config.json the engines load",
            SOURCE,
        )
        return
    if per_token is None:
        return
    devices = {inst.device for _, _, inst in topo.instances()}
    rate = min(ASSUMED_GBPS.get(d, ASSUMED_GBPS_ACCELERATOR) for d in devices)
    read_s = kvlease.needed_lease_s(prompt, per_token, rate)
    need = MARGIN * read_s
    if lease.seconds >= need:
        return
    field = ("kv_connector", "kv_lease_duration")
    yield warning(
        "kv-lease-budget",
        field,
        f"a {prompt}-token prompt is {prompt * per_token / 1e9:.2f} GB of KV "
        f"({per_token} bytes a token); at an assumed {rate:g} GB/s "
        f"({'/'.join(sorted(devices))}; no measured rate is recorded) decode reads it in "
        f"{read_s:.0f} s, and the lease ({lease.seconds:g} s, {lease.source}) should cover "
        f"{MARGIN:g}x that: prefill frees blocks decode has not read yet (expired leases, "
        "recompute, or reads of freed blocks)",
        f"set kv_connector.kv_lease_duration to at least {need:.0f} (or lower "
        "model.max_model_len); `pdlaunch bench` measures the real gap and rate",
        SOURCE,
    )
