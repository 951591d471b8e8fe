"""The probe registry: one module per tool family, ids written once, device families named
by devices.py. That the runner needs no change for a new device kind or probe module is shown
by doing it: tests/plan/test_new_accelerator.py."""

from __future__ import annotations

from pathlib import Path

from pdlaunch.check.probes import MODULES, PROBES, families_of, select_probes
from pdlaunch.spec.devices import PROFILES


def ids(selected) -> list[str]:
    return [p.id for p in selected]


def test_ids_unique_and_each_probe_lives_in_its_family_module():
    assert len({p.id for p in PROBES}) == len(PROBES)
    for module in MODULES:
        family = module.__name__.rsplit(".", 1)[1]
        assert module.PROBES, family
        assert {p.family for p in module.PROBES} == {family}, module.__name__
    for p in PROBES:
        assert p.alternative_to is None or p.alternative_to in PROBES
        assert p.scope == "pair" or p.pair_call is None, p.id


def test_device_families_and_devices_py_name_each_other():
    named = {f for prof in PROFILES.values() for f in prof.probe_families}
    device_probe_families = {p.family for p in PROBES if p.needs.device}
    assert named == device_probe_families == {"nvidia", "gaudi", "ascend", "cpu"}
    assert families_of(["cuda"]) == {"nvidia"} and families_of(["cpu"]) == {"cpu"}


def test_selection():
    cuda = families_of(["cuda"])
    assert ids(select_probes(cuda, {"rdma", "ucx"})) == [
        "rdma.sysfs",
        "ucx.transports",
        "ucx.env",
        "nvidia.smi",
        "nvidia.peermem",
        "node_addr.resolve",
        "ports.listen",
        "versions",
        "nixl.progress_shim",
        "model.path",
        "vllm.argv",
    ]
    no_rdma = ids(select_probes(cuda, {"ucx"}))
    assert "nvidia.smi" in no_rdma and "nvidia.peermem" not in no_rdma  # GPUDirect needs RDMA
    assert ids(select_probes(families_of(["npu"]), set())) == [
        "ascend.npu_smi",
        "ascend.hccn_conf",
        "ascend.link",
        "ascend.link_stat",
        "ascend.ip",
        "ascend.tls",
        "ports.listen",
        "versions",
        "nixl.progress_shim",
        "model.path",
        "vllm.argv",
    ]
    assert ids(select_probes(families_of(["cpu"]), set(), fast_only=True)) == [
        "cpu.cores",
        "ports.listen",
        "versions",
        "nixl.progress_shim",
        "model.path",
    ]
    ascend_rdma = families_of(["npu"]), {"rdma"}
    assert ids(select_probes(*ascend_rdma, scope="pair", optional=True)) == [
        "ascend.ping",
        "ports.reach",
        "bandwidth.ib_write_bw",
    ]
    assert "bandwidth.ib_write_bw" not in ids(select_probes(*ascend_rdma, scope="pair"))
    # `up`'s quick subset pings the NPUs (the Ascend guide's connectivity check)
    assert "ascend.ping" in ids(select_probes(*ascend_rdma, scope="pair", fast_only=True))
    assert ids(select_probes(set(), {"rdma"}, alternatives=True))[:3] == [
        "rdma.sysfs",
        "rdma.ibv_devinfo",
        "rdma.link",
    ]


def test_ucx_probe_loads_ucx_the_way_the_engine_will():
    # The Gaudi guide installs UCX under /tmp/ucx_install/lib and exports it in
    # LD_LIBRARY_PATH (topology defaults.ld_library_path): the probe's ucx_info and module
    # search run with that path, and look in the node's Python path for nixl[cu12]'s UCX.
    from pdlaunch.check.runner import CheckOptions, group_hosts, host_jobs
    from pdlaunch.plan.build import build_plan
    from pdlaunch.spec.load import load

    root = Path(__file__).resolve().parents[2]
    topo, _ = load(root / "topologies" / "gaudi-prefill-cuda-decode.yaml")
    plan = build_plan(topo)
    gaudi = next(h for h in group_hosts(plan) if h.label.startswith("10.0.0.2"))
    # the engine runs in the guide's image: so does the probe of the UCX it loads
    (outer,) = [
        j for j in host_jobs(plan, gaudi, CheckOptions(fast=True)) if j.name.startswith("docker ")
    ]
    assert "; docker run --rm --pull=never --name pdl-gaudi-cuda-check-" in outer.command
    (job,) = [j for j in outer.inner if j.name == "ucx.transports"]
    assert job.command.startswith(
        "export LD_LIBRARY_PATH=/tmp/ucx_install/lib:/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu"
        "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; PATH=/tmp/ucx_install/bin:"
    )
    assert "for d in /tmp/ucx_install/lib/ucx " in job.command
    assert "*.libs" in job.command  # wheels on the node's Python path


def test_gb200_local_dp_is_judged_against_each_nodes_gpus():
    # GB200 guide: DP 8 over two nodes, --data-parallel-size-local 4 on 4-GPU nodes. A node
    # showing fewer GPUs than its local DP ranks x TP fails before anything starts.
    from pdlaunch.check.probes.base import CommandOutput
    from pdlaunch.check.results import Status
    from pdlaunch.check.runner import CheckOptions, group_hosts, host_jobs
    from pdlaunch.plan.build import build_plan
    from pdlaunch.spec.load import load

    root = Path(__file__).resolve().parents[2]
    topo, _ = load(root / "topologies" / "gb200-xpyd.yaml")
    plan = build_plan(topo)
    host = next(h for h in group_hosts(plan) if h.label.startswith("gb200-p0-worker"))
    (smi,) = [j for j in host_jobs(plan, host, CheckOptions(fast=True)) if j.name == "nvidia.smi"]
    # nvidia-smi CSV of a node with two GPUs (format: tests/fixtures/check/SOURCES.md)
    two = CommandOutput(0, "0, NVIDIA GB200, 189471, 189000\n1, NVIDIA GB200, 189471, 189000\n")
    rows = smi.evaluate(two)
    assert rows[0].status is Status.FAIL
    assert rows[0].message.startswith("2 GPU device(s) visible, plan needs 4 (prefill-0-node1 4")
    assert "dp.local_size" in rows[0].fix
    four = CommandOutput(0, "".join(f"{i}, NVIDIA GB200, 189471, 189000\n" for i in range(4)))
    assert smi.evaluate(four)[0].status is Status.OK
