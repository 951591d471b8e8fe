"""The Slurm placement rules: each finds what it should on a topology Slurm contradicts, and
nothing on the same topology put right (so each can fail)."""

from __future__ import annotations

from pathlib import Path

from pdlaunch.backends.slurm import rules as slurm_rules
from pdlaunch.backends.slurm.job import SlurmOptions
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import RULES
from pdlaunch.spec.load import load
from tests.support.slurm_specs import REPO, fake_spec, planned

PORTS = {"prefill": 18100, "decode": 18200, "side": 15600, "router": 18123, "metrics": 19123}
BINS = {"vllm": Path("/opt/fake/vllm"), "router": Path("/opt/fake/router")}


def _findings(tmp_path: Path, spec: dict, opts: SlurmOptions) -> list[tuple[str, str, str]]:
    topo, source, plan = planned(spec, tmp_path / "t.yaml")
    return [
        (f.rule, f.severity, f.where.split(" ", 1)[1])
        for f in slurm_rules.validate(topo, plan, opts, source)
    ]


def _spec(tmp_path: Path, nodes=("n1", "n2"), **kw) -> dict:
    return fake_spec("r", tmp_path, list(nodes), BINS, PORTS, **kw)


def test_slurm_rules_are_not_global_rules() -> None:
    ids = {r.id for r in RULES}
    assert not any(i.startswith("slurm") for i in ids)


def test_clean_topology_has_no_finding(tmp_path: Path) -> None:
    opts = SlurmOptions(nodelist=("n1", "n2"), cpus_per_node=2, gpus_per_node=8)
    assert _findings(tmp_path, _spec(tmp_path), opts) == []


def test_host_outside_the_nodelist(tmp_path: Path) -> None:
    found = _findings(tmp_path, _spec(tmp_path, nodes=("n1", "other")), SlurmOptions(
        nodelist=("n1", "n2")))  # fmt: skip
    assert found == [("slurm-nodelist", "error", "decode[0].host")]


def test_more_nodes_needed_than_listed(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec["prefill"][0] = {**spec["prefill"][0], "hosts": ["n1", "n3"], "dp": {"size": 2}}
    del spec["prefill"][0]["host"]
    found = _findings(tmp_path, spec, SlurmOptions(nodelist=("n1", "n2")))
    rules = [(r, w) for r, _, w in found]
    assert ("slurm-nodelist", "prefill") in rules  # 3 hosts, 2 nodes
    assert ("slurm-nodelist", "prefill[0].hosts") in rules  # n3 is not a listed node


def test_loopback_topology_on_one_listed_node_is_that_node(tmp_path: Path) -> None:
    topo, _ = load(REPO / "topologies" / "local-cpu.yaml")
    plan = build_plan(topo)
    found = {(f.rule, f.field) for f in slurm_rules.check(topo, plan, SlurmOptions(
        nodelist=("vm",)))}  # fmt: skip
    assert not any(r == "slurm-nodelist" for r, _ in found)
    # ... but its loopback listeners cannot be reached at the node's address.
    assert ("slurm-bind", ("prefill", 0, "bind")) in found
    assert ("slurm-bind", ("router", "bind")) in found
    found = {f.rule for f in slurm_rules.check(topo, plan, SlurmOptions(nodelist=("a", "b")))}
    assert "slurm-nodelist" in found


def test_specific_bind_is_refused_unless_pinned_to_that_host(tmp_path: Path) -> None:
    spec = _spec(tmp_path, nodes=("10.0.0.1", "10.0.0.2"))
    spec["decode"][0]["bind"] = "10.0.0.2"
    found = _findings(tmp_path, spec, SlurmOptions())
    assert found == [("slurm-bind", "error", "decode[0].bind")]
    assert _findings(tmp_path, spec, SlurmOptions(nodelist=("10.0.0.1", "10.0.0.2"))) == []


def test_gpus_per_node_beyond_the_partition(tmp_path: Path) -> None:
    topo, _ = load(REPO / "topologies" / "gb200-xpyd.yaml")
    plan = build_plan(topo)
    over = [f for f in slurm_rules.check(topo, plan, SlurmOptions(gpus_per_node=2))
            if f.rule == "slurm-resources"]  # fmt: skip
    assert [f.field for f in over] == [
        ("prefill", 0, "devices"), ("prefill", 1, "devices"), ("decode", 0, "devices")
    ]  # fmt: skip
    assert "needs 4 GPUs on one node" in over[0].message
    ok = slurm_rules.check(topo, plan, SlurmOptions(gpus_per_node=4))
    assert not [f for f in ok if f.rule == "slurm-resources"]


def test_cpu_cores_beyond_the_node(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec["decode"][0]["devices"] = [0, 1, 2, 3]
    found = _findings(tmp_path, spec, SlurmOptions(cpus_per_node=2))
    assert ("slurm-resources", "error", "decode[0].devices") in found


def test_pinned_gpu_index_beyond_what_slurm_gives(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec["decode"][0] = {**spec["decode"][0], "device": "cuda", "devices": [4, 5],
                         "tp": 2, "block_size": 32}  # fmt: skip
    spec["prefill"][0] = {**spec["prefill"][0], "device": "cuda", "block_size": 32}
    found = _findings(tmp_path, spec, SlurmOptions())
    assert ("slurm-devices", "error", "decode[0].devices") in found
    spec["decode"][0]["devices"] = [0, 1]
    assert not [f for f in _findings(tmp_path, spec, SlurmOptions()) if f[0] == "slurm-devices"]


def test_router_elsewhere_is_a_warning(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec["router"]["host"] = "router-node"
    found = _findings(tmp_path, spec, SlurmOptions())
    assert found == [("slurm-placement", "warning", "router.host")]
