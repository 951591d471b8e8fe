"""The core count `up` and `check` read from a host whose cores the topology does not give
(check/host_cpus.py): a host's command output is input, so whatever it answers is judged by the
cpu probe's own parser, bounded, and a host that answers nonsense is left out (the topology's
order binds it and the preflight says why), never a traceback or an unbounded set."""

from __future__ import annotations

import time

import pytest
import yaml

from pdlaunch.check.host_cpus import measure_cpus
from pdlaunch.check.probes.cpu import MAX_CPUS, parse_affinity, parse_cpu_list
from pdlaunch.hosts import CommandResult, HostConnectionError
from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import load_text


class Answers:
    """A HostPool stand-in: every host answers ``stdout`` (or raises ``error``)."""

    def __init__(self, stdout: str = "", error: Exception | None = None) -> None:
        self.stdout, self.error, self.asked = stdout, error, 0

    def get(self, host, local, ssh):
        if self.error is not None:
            raise self.error
        return self

    def run(self, command, timeout=None, check=False):
        self.asked += 1
        return CommandResult(0, self.stdout, "")


def _plan():
    cpu = {"host": "127.0.0.1", "device": "cpu", "block_size": 32}
    data = {
        "deployment": "t",
        "model": {"name": "/m"},
        "prefill": [{**cpu, "port": 8100}],
        "decode": [{**cpu, "port": 8200}, {**cpu, "port": 8201}],
        "router": {"host": "127.0.0.1"},
    }
    return build_plan(load_text(yaml.safe_dump(data), "t.yaml")[0])


def test_a_real_answer_gives_the_run_of_cores_from_zero():
    pool = Answers("2\n8\nCpus_allowed_list:\t0-1\n")
    assert measure_cpus(_plan(), ["127.0.0.1"], pool) == {"127.0.0.1": 2}
    assert pool.asked == 1  # one command a host, however many engines it runs


@pytest.mark.parametrize(
    "stdout",
    [
        "",  # nothing
        "2\n",  # cut short
        "two\nfour\nCpus_allowed_list: 0-1\n",  # not numbers
        "2\n2\nCpus_allowed_list: 1-0\n",  # a range backwards
        "2\n2\nCpus_allowed_list: -1\n",  # negative
        "2\n2\nCpus_allowed_list: 4-7\n",  # no core 0: `cpus: N` cannot name these
        "2\n2\nCpus_allowed_list: 0-" + "9" * 5000 + "\n",  # a 5,000-digit number
        f"2\n2\nCpus_allowed_list: 0-{10**12}\n",  # a trillion cores: never expanded
        "<html>503 Service Unavailable</html>",
    ],
)
def test_an_answer_that_is_not_the_commands_output_is_left_out(stdout: str):
    t = time.monotonic()
    assert measure_cpus(_plan(), ["127.0.0.1"], Answers(stdout)) == {}
    assert time.monotonic() - t < 2.0


def test_a_host_that_cannot_be_reached_is_left_out():
    pool = Answers(error=HostConnectionError("127.0.0.1: connection refused"))
    assert measure_cpus(_plan(), ["127.0.0.1"], pool) == {}


def test_a_long_mask_is_bounded_by_the_largest_cpu_count():
    many = ",".join(str(i) for i in range(MAX_CPUS))  # ~350 KB on one line
    assert len(parse_cpu_list(many)) == MAX_CPUS
    with pytest.raises(ValueError, match="not a CPU range"):
        parse_cpu_list(f"0-{MAX_CPUS}")
    assert parse_affinity("4\n8\nCpus_allowed_list:\t0-3\n") == (4, 8, "0-3", {0, 1, 2, 3})
