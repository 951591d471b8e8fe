"""`up` binds CPU engines within the cores the host really lets them use when the topology
does not say how many it has (issue 31): a 1-prefill + 2-decode CPU topology on a 2-core host
used to bind decode-1 to core 2, which the preflight then refused."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.support.deployments import cli
from tests.support.sshd import free_ports

ALLOWED = {0, 1}


@pytest.fixture
def two_cores():
    """This process (so the hosts' shells and engines it starts) may use cores 0 and 1 only,
    as on a 2-core laptop, whatever this machine has."""
    before = os.sched_getaffinity(0)
    if not before >= ALLOWED:
        pytest.fail(f"the test needs cores 0 and 1; this process may use {sorted(before)}")
    os.sched_setaffinity(0, ALLOWED)
    yield
    os.sched_setaffinity(0, before)


def bound_cores(work_dir) -> dict[str, set[int]]:
    """VLLM_CPU_OMP_THREADS_BIND of each uploaded process script, as core sets."""
    out = {}
    for path in work_dir.rglob("*.sh"):
        m = re.search(r"VLLM_CPU_OMP_THREADS_BIND=['\"]?([0-9,|-]+)", path.read_text())
        if m:
            cores = set()
            for part in re.split(r"[,|]", m.group(1)):
                lo, _, hi = part.partition("-")
                cores.update(range(int(lo), int(hi or lo) + 1))
            out[path.stem] = cores
    return out


def test_up_binds_within_the_hosts_cores_when_the_topology_gives_none(
    make_deployment, two_cores
):
    dep = make_deployment("cores")
    second = dict(dep.spec["decode"][0])
    second["port"] = free_ports("decode-1")["decode-1"]
    dep.spec["decode"].append(second)
    assert "hosts" not in dep.spec  # no `cpus:` anywhere
    dep.write()
    # `plan` reaches no host: it binds in topology order, decode-1 to core 2 (what `up` did).
    planned = json.loads(cli("plan", dep.path, "--json").stdout)
    binds = {p["name"]: p["env"].get("VLLM_CPU_OMP_THREADS_BIND") for p in planned["processes"]}
    assert binds["decode-1"] == "2", binds
    res = cli("up", dep.path, "--timeout", "60")
    try:
        assert res.exit_code == 0, res.output
        assert "127.0.0.1: 2 core(s), read from the host's affinity mask" in res.output
        bound = bound_cores(dep.work_dir)
        assert set(bound) >= {"prefill-0", "decode-0", "decode-1"}, bound
        for name, cores in bound.items():
            assert cores <= ALLOWED, (name, cores)
    finally:
        assert cli("down", dep.path).exit_code == 0
