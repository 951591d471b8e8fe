"""The namespace-cluster engine suite's topologies (tests/support/netns_pd.py), checked
without a namespace or an engine: the multi-node DP shape is the GB200 guide's (leader plus
``--headless`` worker with its start rank), vLLM's own parser accepts every rendered command
(tests/fidelity/judge.py), and the suite's `ss` parser reads captured output right."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pdlaunch.plan.build import build_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load_text
from tests.support.netns_pd import (
    DECODE_HTTP,
    connections_to,
    engine_ports,
    listening,
    topology,
)


def _shapes() -> dict[str, dict[str, Any]]:
    common = dict(model="/models/tiny", work_dir="/tmp/pdlaunch", user="root",
                  key_file="/root/.ssh/id_ed25519", prefill="10.231.0.11")  # fmt: skip
    return {
        "pd": topology(
            deployment="netns-pd", decode=["10.231.0.12"], router="10.231.0.13", **common
        ),
        "dp": topology(
            deployment="netns-dp",
            decode=["10.231.0.12", "10.231.0.13"],
            router="10.231.0.1",
            router_ports=(38123, 38124),
            local_router=True,
            **common,
        ),
        "dp-moe": topology(
            deployment="netns-dp-moe",
            decode=["10.231.0.12", "10.231.0.13"],
            router="10.231.0.1",
            router_ports=(38123, 38124),
            local_router=True,
            decode_args=("--enable-expert-parallel",),
            **common,
        ),
    }


@pytest.fixture(scope="module")
def plans() -> dict:
    out = {}
    for name, data in _shapes().items():
        topo, source = load_text(yaml.safe_dump(data), f"{name}.yaml")
        findings = validate(topo, source)
        assert not has_errors(findings), [f"{f.rule}: {f.message}" for f in findings]
        out[name] = build_plan(topo)
    return out


def test_dp_topology_renders_the_gb200_shape(plans: dict) -> None:
    prefill, leader, worker, router = plans["dp"].processes

    def opt(argv: list[str], flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv else None

    assert (leader.host, worker.host) == ("10.231.0.12", "10.231.0.13")
    assert "--headless" in worker.argv and "--port" not in worker.argv
    assert "--headless" not in leader.argv and opt(leader.argv, "--port") == str(DECODE_HTTP)
    for p in (leader, worker):
        assert opt(p.argv, "--data-parallel-size") == "2"
        assert opt(p.argv, "--data-parallel-size-local") == "1"
        assert opt(p.argv, "--data-parallel-address") == "10.231.0.12"
        assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == p.host
        assert p.env["UCX_TLS"] == "tcp,self"
    assert opt(worker.argv, "--data-parallel-start-rank") == "1"
    assert opt(leader.argv, "--data-parallel-start-rank") is None  # rank 0: vLLM's default
    assert router.argv.count("--decode") == 1 and f"http://10.231.0.12:{DECODE_HTTP}" in router.argv
    assert prefill.env["VLLM_CPU_OMP_THREADS_BIND"] != leader.env["VLLM_CPU_OMP_THREADS_BIND"]


@pytest.mark.parametrize("name", ["pd", "dp", "dp-moe"])
def test_rendered_commands_pass_the_fidelity_judge(plans: dict, name: str) -> None:
    from tests.fidelity.judge import judge_plan

    verdicts = judge_plan(plans[name])
    assert set(verdicts) == {p.name for p in plans[name].processes}
    assert not {k: v for k, v in verdicts.items() if v}, verdicts


def test_the_judge_refuses_a_broken_headless_worker(plans: dict) -> None:
    """Negative control: the same headless argv with its start rank mangled is refused."""
    from tests.fidelity.judge import judge_serve

    worker = plans["dp"].by_role("decode")[1]
    argv = list(worker.argv)
    argv[argv.index("--data-parallel-start-rank") + 1] = "one"
    problems = judge_serve(argv, worker.env, "cpu")
    assert any("rejects the argv" in p for p in problems), problems


# Captured by `ip netns exec pdl20-h2 ss -Htnp` / `pdl20-h1 ss -Htlnp` during a PD run here
# (2026-11-23), trimmed.
SS_B = """\
ESTAB 9      0       10.231.20.12:55599 10.231.20.11:57609 users:(("VLLM::Worker",pid=2450,fd=139))
ESTAB 0      0       10.231.20.12:39807 10.231.20.12:35127 users:(("VLLM::Worker",pid=2450,fd=120))
ESTAB 0      0       10.231.20.12:8200  10.231.20.13:39602 users:(("vllm",pid=2163,fd=25))
ESTAB 0      0       10.231.20.12:22    10.231.20.1:40000  users:(("sshd",pid=1416,fd=4))
"""
SS_A = """\
LISTEN 0      2048         0.0.0.0:8100       0.0.0.0:*    users:(("vllm",pid=2177,fd=12))
LISTEN 0      100     10.231.20.11:5600  0.0.0.0:* users:(("VLLM::EngineCor",pid=2386,fd=49))
LISTEN 0      128     10.231.20.11:22         0.0.0.0:*    users:(("sshd",pid=1415,fd=3))
LISTEN 0      4096    10.231.20.11:57609      0.0.0.0:*    users:(("VLLM::Worker",pid=2441,fd=97))
LISTEN 0      4096             [::]:22           [::]:*    users:(("sshd",pid=9,fd=4))
"""


def test_ss_parsing() -> None:
    assert listening(SS_A, 5600) == {("10.231.20.11", 5600)}
    assert listening(SS_A, 22) == {("10.231.20.11", 22), ("::", 22)}
    assert engine_ports(SS_A) == {8100, 5600, 57609}
    (link,) = connections_to(SS_B, "10.231.20.11", engine_ports(SS_A) - {8100})
    assert link.local == ("10.231.20.12", 55599) and link.process == "VLLM::Worker"
    assert connections_to(SS_B, "10.231.20.11", {22}) == []
