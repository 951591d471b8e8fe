"""A new accelerator is one entry in pdlaunch/spec/devices.py.

A fictitious kind registered in the devices table alone (no other module touched) loads
from a topology, passes the rules, gets its visible-devices variable in the plan, and makes
`check` select the probe families its entry names, with params from its processes. A kind
with tools of its own adds one probe module; the runner is not touched either way.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdlaunch.check import probes
from pdlaunch.check.probes import CommandOutput, Needs, Probe, ProbeContext
from pdlaunch.check.probes.accelerators import eval_accelerators, inventory_calls, parse_smi_csv
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.check.runner import CheckOptions, group_hosts, host_jobs, run_check
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec import devices
from pdlaunch.spec.load import LoadError, load_text
from pdlaunch.spec.topology import Topology
from tests.support.sshd import free_port

# A GPU-like accelerator whose vendor tools are NVIDIA's (an nvidia-smi compatible driver).
XPU = devices.DeviceProfile(
    kind="xpu9",
    kv_buffer_device="xpu9",
    visible_devices_var="XPU9_VISIBLE_DEVICES",
    ucx_tls="tcp,self,sm",
    layouts=frozenset({"NHD", "HND"}),
    default_layout="HND",
    default_block_size=16,
    block_multiple_of=16,
    probe_families=("nvidia",),
    source="fictitious: tests/plan/test_new_accelerator.py",
)


def topology(kind: str) -> str:
    p, d, r, m = (free_port() for _ in range(4))
    return f"""
deployment: new-accelerator
model: {{name: Qwen/Qwen3-0.6B}}
prefill: [{{host: 127.0.0.1, device: {kind}, port: {p}, tp: 2, devices: [0, 1]}}]
decode: [{{host: 127.0.0.1, device: {kind}, port: {d}, devices: [2]}}]
router: {{host: 127.0.0.1, port: {r}, prometheus_port: {m}}}
"""


def load_valid(text: str) -> Topology:
    topo, source = load_text(text)
    findings = validate(topo, source)
    assert not has_errors(findings), [f.message for f in findings]
    return topo


def test_unknown_kind_is_refused_until_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LoadError) as err:
        load_text(topology("xpu9"))
    assert "must be 'cuda', 'hpu', 'npu' or 'cpu'" in str(err.value.problems[0].message)
    schema = Topology.model_json_schema()["$defs"]["Instance"]["properties"]["device"]
    assert schema["enum"] == ["cuda", "hpu", "npu", "cpu"]

    monkeypatch.setitem(devices.PROFILES, XPU.kind, XPU)
    load_valid(topology("xpu9"))
    schema = Topology.model_json_schema()["$defs"]["Instance"]["properties"]["device"]
    assert schema["enum"] == ["cuda", "hpu", "npu", "cpu", "xpu9"]


def test_one_entry_in_devices_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(devices.PROFILES, XPU.kind, XPU)
    plan = build_plan(load_valid(topology("xpu9")))
    prefill, decode = plan.by_role("prefill")[0], plan.by_role("decode")[0]
    assert (prefill.device, prefill.env["XPU9_VISIBLE_DEVICES"]) == ("xpu9", "0,1")
    assert decode.env["XPU9_VISIBLE_DEVICES"] == "2"
    assert prefill.kv_transfer_config["kv_buffer_device"] == "xpu9"
    assert prefill.ucx_tls == "tcp,self,sm"

    (host,) = group_hosts(plan)
    assert host.families == {"nvidia"}
    jobs = {j.name: j for j in host_jobs(plan, host, CheckOptions(fast=True))}
    assert "nvidia.smi" in jobs and "nvidia.peermem" not in jobs  # no RDMA in this plan
    assert not {n for n in jobs if n.startswith(("gaudi.", "ascend."))}
    # the inventory probe's params come from the new kind's processes
    assert jobs["nvidia.smi"].command.endswith("--format=csv,noheader,nounits")
    (smi,) = [r for r in jobs["nvidia.smi"].evaluate(_smi_output(3)) if r.status is Status.OK]
    assert smi.data["need"] == 3 and "3 GPU device(s)" in smi.message
    short = jobs["nvidia.smi"].evaluate(_smi_output(2))
    assert [(r.status, r.message) for r in short] == [
        (
            Status.FAIL,
            "2 GPU device(s) visible, plan needs 3 (decode-0 1, prefill-0 2; TP x local DP each)",
        ),
        (Status.FAIL, "planned GPU device 2 not present"),
    ]


def _smi_output(n: int) -> CommandOutput:
    return CommandOutput(0, "".join(f"{i}, Fictitious XPU, 1000, 990\n" for i in range(n)))


def _fpu_smi(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    return eval_accelerators("FPU", parse_smi_csv(out.stdout), ctx)


def test_a_kind_with_its_own_tools_adds_one_probe_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """An accelerator whose tools are new: the devices.py entry names a family, and that
    family's module (here one probe, registered as a module of pdlaunch/check/probes/ would
    be) supplies the command; `pdlaunch check` runs it for real on the local host."""
    fpu = replace(
        XPU, kind="fpu", visible_devices_var="FPU_VISIBLE_DEVICES", probe_families=("fpu",)
    )
    monkeypatch.setitem(devices.PROFILES, fpu.kind, fpu)
    smi = Probe(
        "fpu.smi",
        "FPUs and free memory",
        "printf '0, FPU-1, 1000, 990\\n1, FPU-1, 1000, 995\\n2, FPU-1, 1000, 999\\n'",
        _fpu_smi,
        "fpu-smi",
        needs=Needs(device=True),
        calls=inventory_calls("fpu"),
    )
    monkeypatch.setattr(probes, "PROBES", (*probes.PROBES, smi))
    plan = build_plan(load_valid(topology("fpu")))
    assert plan.by_role("decode")[0].env["FPU_VISIBLE_DEVICES"] == "2"

    report = run_check(plan, CheckOptions(fast=True))
    (row,) = [r for r in report.results if r.probe == "fpu.smi"]
    assert row.status is Status.OK, row
    assert row.message == "3 FPU device(s), 3 with >= 80% memory free (need 3)"
    assert report.hosts[0].to_dict()["probe_families"] == ["fpu"]
    assert not [r for r in report.results if r.probe.startswith("nvidia.")]
