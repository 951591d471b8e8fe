"""`check`'s cpu.cores probe: the cores the plan binds CPU engines to are in the host's
affinity, and the busy threads fit its cores. Runs the probe's real command here."""

from __future__ import annotations

import os
import subprocess

from pdlaunch.check.probes.base import CommandOutput, ProbeContext
from pdlaunch.check.probes.cpu import CORES, parse_cpu_list
from pdlaunch.check.results import Status


def _real() -> CommandOutput:
    r = subprocess.run(["sh", "-c", CORES.render()], capture_output=True, text=True, check=False)
    return CommandOutput(r.returncode, r.stdout, r.stderr)


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}


def test_real_host_flags_a_core_it_does_not_have():
    usable = len(os.sched_getaffinity(0))
    ghost = max(os.sched_getaffinity(0)) + 1
    ctx = ProbeContext("h", params={"bound": {"prefill-0": [0], "decode-1": [ghost]}, "busy": 0})
    rows = CORES.judge(_real(), ctx)
    fails = [r for r in rows if r.status == Status.FAIL]
    assert len(fails) == 1 and "decode-1" in fails[0].message and str(ghost) in fails[0].message
    assert fails[0].data["usable"] == usable


def test_real_host_warns_when_busy_threads_exceed_its_cores():
    usable = len(os.sched_getaffinity(0))
    core = min(os.sched_getaffinity(0))
    ctx = ProbeContext("h", params={"bound": {"p": [core]}, "busy": usable + 1})
    rows = CORES.judge(_real(), ctx)
    assert [r.status for r in rows] == [Status.WARN]
    assert f"{usable + 1} threads busy on {usable}" in rows[0].message


def test_real_host_ok_when_it_fits():
    core = min(os.sched_getaffinity(0))
    rows = CORES.judge(_real(), ProbeContext("h", params={"bound": {"p": [core]}, "busy": 1}))
    assert [r.status for r in rows] == [Status.OK]
