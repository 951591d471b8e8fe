"""The probe registry: one module per tool family, ids written once, device families named
by devices.py, and a runner that names no probe, device kind or variable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pdlaunch.check import probes
from pdlaunch.check.probes import MODULES, PROBES, families_of, select_probes
from pdlaunch.devices import PROFILES

RUNNER = Path(probes.__file__).resolve().parent.parent / "runner.py"


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
        "ports.listen",
        "versions",
        "model.path",
        "vllm.argv",
    ]
    no_rdma = ids(select_probes(cuda, {"ucx"}))
    assert "nvidia.smi" in no_rdma and "nvidia.peermem" not in no_rdma  # GPUDirect needs RDMA
    assert ids(select_probes(families_of(["npu"]), set())) == [
        "ascend.npu_smi",
        "ascend.hccn_conf",
        "ascend.link",
        "ascend.ip",
        "ascend.tls",
        "ports.listen",
        "versions",
        "model.path",
        "vllm.argv",
    ]
    assert ids(select_probes(families_of(["cpu"]), set(), fast_only=True)) == [
        "cpu.cores",
        "ports.listen",
        "versions",
        "model.path",
    ]
    ascend_rdma = families_of(["npu"]), {"rdma"}
    assert ids(select_probes(*ascend_rdma, scope="pair", optional=True)) == [
        "ascend.ping",
        "ports.reach",
        "bandwidth.ib_write_bw",
    ]
    assert "bandwidth.ib_write_bw" not in ids(select_probes(*ascend_rdma, scope="pair"))
    assert ids(select_probes(set(), {"rdma"}, alternatives=True))[:3] == [
        "rdma.sysfs",
        "rdma.ibv_devinfo",
        "rdma.link",
    ]


def plan_facts_violations(source: str) -> list[str]:
    """String constants in ``source`` that name a probe, a device kind or an environment
    variable (PDLAUNCH_PYTHON, check's own setting, excepted), and reads of ``.argv``."""
    names = {p.id for p in PROBES} | set(PROFILES) | {"nvidia", "gaudi", "ascend"}
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            v = node.value
            if v in names or (
                re.fullmatch(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+", v) and v != "PDLAUNCH_PYTHON"
            ):
                out.append(v)
        elif isinstance(node, ast.Attribute) and node.attr == "argv":
            out.append(".argv")
    return out


def test_runner_reads_typed_facts_only():
    assert plan_facts_violations(RUNNER.read_text()) == []
    # negative control: what the runner used to do
    old = (
        'DEVICE_KIND = {"cuda": "nvidia"}\n'
        'if pid == "nvidia.smi":\n'
        '    tls = p.env.get("UCX_TLS")\n'
        "x = proc.argv[0]\n"
    )
    found = plan_facts_violations(old)
    assert sorted(found) == sorted(["cuda", "nvidia", "nvidia.smi", "UCX_TLS", ".argv"])
