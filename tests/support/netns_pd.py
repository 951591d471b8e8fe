"""The PD and multi-node DP topologies of the namespace-cluster engine suite
(tests/system/netns/test_netns_pd.py), and a parser of `ss -tnp` output to see which process
holds which connection across namespace hosts. Pure: no namespace, no engine."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

from tests.support.engine_requests import SERVED
from tests.support.engines import BIN

# each namespace has its own port space: fixed ports cannot clash with other tests
PREFILL_HTTP, DECODE_HTTP, SIDE_CHANNEL, ROUTER_HTTP, PLAIN_HTTP = 8100, 8200, 5600, 8123, 8300


# ------------------------------------------------------------------------- topology (pure)


def topology(
    *,
    deployment: str,
    model: str,
    work_dir: str,
    user: str,
    key_file: str,
    prefill: str,
    decode: list[str],
    router: str,
    router_ports: tuple[int, int] = (ROUTER_HTTP, 29000),
    local_router: bool = False,
    decode_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """topologies/local-cpu.yaml moved onto namespace hosts: one prefill, one decode (DP over
    the nodes in ``decode`` when there are two), the router on ``router``."""
    engine = {
        "device": "cpu",
        "block_size": 32,
        "enforce_eager": True,
        "prefix_caching": False,
    }
    dec: dict[str, Any] = {**engine, "port": DECODE_HTTP, "devices": [1]}
    if len(decode) == 1:
        dec["host"] = decode[0]
    else:  # the GB200 guide's shape: leader serves HTTP, the other nodes run --headless
        dec["hosts"] = decode
        dec["dp"] = {"size": len(decode), "local_size": 1}
    if decode_args:
        dec["extra_args"] = list(decode_args)
    topo: dict[str, Any] = {
        "deployment": deployment,
        "model": {"name": model, "served_name": SERVED, "dtype": "float32", "max_model_len": 1024},
        "defaults": {
            "ssh": {"user": user, "port": 22, "key": key_file},
            "work_dir": work_dir,
            # the venv is on the filesystem every namespace host shares; a login over SSH
            # does not have it on PATH
            "vllm_bin": str(BIN / "vllm"),
            # no sm: NIXL between namespaces must go through the veths, as between machines
            "ucx_tls": "tcp,self",
            "env": {
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "UCX_NET_DEVICES": "eth0",  # the namespace's only link to the other hosts
                "PDLAUNCH_PYTHON": sys.executable,  # check's version probe: this interpreter
            },
        },
        # Each namespace is its own host to pdlaunch, so by default every engine would bind
        # core 0 of this machine; pin prefill and decode apart.
        "prefill": [{**engine, "host": prefill, "port": PREFILL_HTTP, "devices": [0]}],
        "decode": [dec],
        # a long KV lease, as in local-cpu.yaml: a stalled request on 2 cores must not lose it
        "kv_connector": {
            "kind": "nixl",
            "side_channel_port": SIDE_CHANNEL,
            "kv_lease_duration": 600,
        },
        "router": {
            "host": router,
            "port": router_ports[0],
            "prometheus_port": router_ports[1],
            "binary": str(BIN / "vllm-router"),
        },
    }
    if local_router:  # the control host runs the router itself: no SSH, bound to the bridge
        topo["router"]["bind"] = router
        topo["hosts"] = {router: {"local": True}}
    return topo


# ------------------------------------------------------------------------- ss output (pure)


@dataclass(frozen=True)
class Sock:
    state: str
    local: tuple[str, int]
    peer: tuple[str, int]
    process: str  # first process name ss names ("" when none)


def _endpoint(text: str) -> tuple[str, int]:
    addr, _, port = text.rpartition(":")
    return addr.strip("[]"), int(port) if port.isdigit() else -1


_PROCESS = re.compile(r'users:\(\("([^"]+)"')


def parse_ss(text: str) -> list[Sock]:
    """Rows of `ss -Htn[l]p` (State Recv-Q Send-Q Local Peer [Process])."""
    out = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 5:
            continue
        m = _PROCESS.search(line)
        out.append(Sock(cols[0], _endpoint(cols[3]), _endpoint(cols[4]), m.group(1) if m else ""))
    return out


def listening(ss_text: str, port: int) -> set[tuple[str, int]]:
    return {s.local for s in parse_ss(ss_text) if s.state == "LISTEN" and s.local[1] == port}


def engine_ports(ss_text: str) -> set[int]:
    """Ports a vLLM process (API server, EngineCore, Worker) listens on."""
    return {
        s.local[1]
        for s in parse_ss(ss_text)
        if s.state == "LISTEN" and s.process.lower().startswith("vllm")
    }


def connections_to(ss_text: str, address: str, ports: set[int]) -> list[Sock]:
    """Established connections of vLLM processes to ``address`` on one of ``ports``."""
    return [
        s
        for s in parse_ss(ss_text)
        if s.state == "ESTAB"
        and s.peer[0] == address
        and s.peer[1] in ports
        and s.process.lower().startswith("vllm")
    ]
