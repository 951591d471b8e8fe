"""Parsers of `pdlaunch check` over real command output (tests/fixtures/check/SOURCES.md).

What each probe returns for each captured output is pinned in tests/fixtures/check/cases/
(test_cases.py); here: the structured records the parsers extract, the comparisons across
hosts, and that evaluators never raise on output they half understand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdlaunch.check.probes import (
    PROBES,
    CommandOutput,
    Probe,
    ProbeContext,
    ascend,
    bandwidth,
    gaudi,
    nvidia,
    ports,
    rdma,
    ucx,
    versions,
)
from pdlaunch.check.probes import accelerators as acc
from pdlaunch.check.probes.base import tool_missing
from pdlaunch.check.results import CheckResult, Status, has_failure, worst

FX = Path(__file__).resolve().parent.parent / "fixtures" / "check"


def fx(name: str) -> str:
    return (FX / name).read_text()


def statuses(results: list[CheckResult]) -> list[Status]:
    return [r.status for r in results]


# ------------------------------------------------------------------------ results


def test_result_to_dict_and_worst():
    r = CheckResult("x", "h", Status.WARN, "m", "f", {"a": 1})
    assert r.to_dict() == {
        "probe": "x",
        "target": "h",
        "status": "WARN",
        "message": "m",
        "fix": "f",
        "data": {"a": 1},
    }
    assert worst([]) is Status.SKIP
    assert worst([r, CheckResult("y", "h", Status.OK, "")]) is Status.WARN
    assert has_failure([CheckResult("y", "h", Status.FAIL, "")])


# -------------------------------------------------------------------------- RDMA


def test_ibv_devinfo_ports():
    ports_ = rdma.parse_ibv_devinfo(fx("ibv_devinfo_roce_mixed.txt"))
    assert [(x.name, x.state, x.link_layer) for x in ports_] == [
        ("mlx5_0:1", "ACTIVE", "Ethernet"),
        ("mlx5_1:1", "DOWN", "Ethernet"),
        ("mlx5_2:1", "ACTIVE", "Ethernet"),
    ]
    assert all(x.phys_state is None for x in ports_)  # only -v prints phys_state
    vv = rdma.parse_ibv_devinfo(fx("ibv_devinfo_vv_ib_port_down.txt"))
    assert [(x.name, x.state, x.phys_state, x.link_layer) for x in vv] == [
        ("mlx5_0:1", "ACTIVE", "LINK_UP", "InfiniBand"),
        ("mlx5_1:1", "DOWN", "DISABLED", "InfiniBand"),
    ]


def test_sysfs_ports_use_the_kernel_codes():
    (port,) = rdma.parse_sysfs_ports(fx("sysfs_port_disabled.txt"))
    assert port == rdma.RdmaPort("mlx5_0", 1, "DOWN", "DISABLED", "Ethernet")
    (up,) = rdma.parse_sysfs_ports(fx("sysfs_ib_healthy.txt"))
    assert (up.state, up.phys_state, up.link_layer) == ("ACTIVE", "LINK_UP", "InfiniBand")


def test_rdma_link_forms():
    ports_ = rdma.parse_rdma_link(fx("rdma_link_mixed.txt"))
    assert [(x.name, x.state, x.phys_state, x.netdev) for x in ports_][:2] == [
        ("mlx5_0:1", "ACTIVE", "LINK_UP", "eno33"),
        ("mlx5_1:1", "DOWN", "DISABLED", "eno34"),
    ]
    ib = rdma.parse_rdma_link(fx("rdma_link_ib_and_roce.txt"))
    assert [(x.name, x.state) for x in ib] == [
        ("ibp23s0:1", "ACTIVE"),
        ("roceo1:1", "ACTIVE"),
        ("roceo2:1", "DOWN"),
    ]


# --------------------------------------------------------------------------- UCX


def test_ucx_transports_parse():
    tls = ucx.parse_ucx_transports(fx("ucx_info_d_ib_cuda.txt"))
    assert tls["tcp"] == ["ens21f0", "ib0", "lo"]
    assert tls["rc_mlx5"] == ["mlx5_0:1"]
    assert set(tls) == {
        "self",
        "tcp",
        "sysv",
        "posix",
        "cuda_copy",
        "cuda_ipc",
        "gdr_copy",
        "dc_mlx5",
        "rc_verbs",
        "rc_mlx5",
        "ud_verbs",
        "ud_mlx5",
        "cma",
    }
    grep_only = ucx.parse_ucx_transports(fx("ucx_info_d_hpcx_transports.txt"))
    assert "cuda_copy" in grep_only and "rc_mlx5" in grep_only


@pytest.mark.parametrize(
    "tls, missing",
    [
        ("ib,rc,cuda_copy", []),
        ("tcp,self,sm", []),
        ("rc,gaudi_gdr", ["gaudi_gdr"]),
        ("shm,cuda,dc_x,ud_v", []),
        ("rocm,tcp", ["rocm"]),
        ("^tcp,cuda_ipc", []),
        ("all", []),
        ("rc_x:aux, tcp ", []),
    ],
)
def test_ucx_tls_aliases(tls, missing):
    avail = ucx.parse_ucx_transports(fx("ucx_info_d_ib_cuda.txt"))
    assert ucx.ucx_tls_missing(tls, avail) == missing


def test_ucx_tls_against_tcp_only_build():
    avail = {"self", "tcp", "sysv", "posix", "cma"}
    assert ucx.ucx_tls_missing("ib,rc,cuda_copy", avail) == ["ib", "rc", "cuda_copy"]
    assert ucx.ucx_tls_missing("sm,self", avail) == []
    assert ucx.split_ucx_tls("^ib") == (True, ["ib"])


@pytest.mark.parametrize(
    "tls, rdma_",
    [
        ("ib,rc,cuda_copy", True),
        ("rc_x:aux,tcp", True),
        ("ib,rc,gaudi_gdr", True),  # the seed guide's Gaudi UCX_TLS
        ("gaudi_gdr", True),
        ("tcp,self,sm", False),
        ("^rc,ud", False),  # an exclusion list asks for nothing
        ("", False),
        (None, False),
    ],
)
def test_ucx_tls_on_rdma(tls, rdma_):
    assert ucx.uses_rdma(tls) is rdma_


def test_env_parse():
    env = ucx.parse_env(fx("env_stray_ucx.txt"))
    assert env["UCX_TLS"] == "tcp" and env["HOME"] == "/root"


# ------------------------------------------------------------------- accelerators


def test_smi_csv():
    devs = acc.parse_smi_csv(fx("nvidia_smi_h100_third_party.csv"))
    assert devs == [acc.Accel(0, "NVIDIA H100 80GB HBM3", 81559.0, 79000.0)]
    hl = acc.parse_smi_csv(fx("hl_smi_q_third_party.csv"))
    assert [(d.index, d.name, d.free_mib) for d in hl] == [
        (0, "HL-225", 80000.0),
        (1, "HL-225", 95000.0),
    ]


def test_smi_csv_tolerates_units_and_na():
    devs = acc.parse_smi_csv(
        "index, name, memory.total [MiB], memory.free [MiB]\n0, Tesla T4, 15360 MiB, [N/A]\n"
    )
    assert devs == [acc.Accel(0, "Tesla T4", 15360.0, None)]
    assert devs[0].free_fraction is None


def test_lsmod_modules():
    assert nvidia.parse_lsmod(fx("lsmod_grep_no_peermem.txt")) >= {"gdrdrv"}
    assert "nvidia_peermem" in nvidia.parse_lsmod(fx("lsmod_grep_nvidia_peermem.txt"))
    assert nvidia.parse_lsmod("Module                  Size  Used by\n") == set()


def test_hl_link_ports():
    up = gaudi.parse_hl_link(fx("hl_smi_link_up.txt"))
    assert len(up) == 18 and up[21] == "UP" and set(up.values()) == {"UP"}


def test_npu_smi_info():
    npus = ascend.parse_npu_smi_info(fx("npu_smi_info_910b3x8.txt"))
    assert [n.index for n in npus] == list(range(8))
    assert npus[0] == ascend.Npu(0, "910B3", "OK", 3338.0, 65536.0)


# ------------------------------------------------------------------------ Ascend


def test_hccn_records():
    assert ascend.parse_hccn_link(fx("hccn_link_up.txt")) == "UP"
    assert ascend.parse_hccn_ip(fx("hccn_ip_doc.txt")) == ("10.xx.xx.10", "255.255.255.0")
    assert ascend.parse_hccn_tls(fx("hccn_tls_mixed.txt")) == {0: 0, 1: 1}
    assert ascend.parse_hccn_tls(fx("hccn_tls_full_cert.txt")) == {0: 0}
    conf = ascend.parse_hccn_conf(fx("hccn_conf_8npu.txt"))
    assert conf[0]["address"] == "29.1.137.205" and conf[7]["netmask"] == "255.255.0.0"


def test_hccn_ping():
    assert ascend.parse_hccn_ping(fx("hccn_ping_ok.txt")) == {
        "timeouts": 0,
        "sent": 3,
        "received": 3,
        "loss": 0.0,
    }
    lossy = ascend.parse_hccn_ping(fx("hccn_ping_partial_loss.txt"))
    assert lossy["loss"] == pytest.approx(33.33) and lossy["timeouts"] >= 1


def test_compare_ascend_tls():
    same = {"p0": {0: 0, 1: 0}, "d0": {0: 0, 1: 0}}
    assert statuses(ascend.compare_ascend_tls(same)) == [Status.OK]
    diff = {"p0": {0: 0, 1: 0}, "d0": {0: 1, 1: 1}}
    res = ascend.compare_ascend_tls(diff)
    assert statuses(res) == [Status.FAIL] and "d0/npu0" in res[0].message
    assert res[0].probe == ascend.TLS_CLUSTER and res[0].fix
    assert statuses(ascend.compare_ascend_tls({})) == [Status.SKIP]


# ------------------------------------------------------------------------- ports


def test_ss_listeners_forms():
    ls = ports.parse_ss_listeners(fx("ss_ltnH_local.txt"))
    assert ("0.0.0.0", 18000) in ls and ("::", 18001) in ls and ("127.0.0.1", 18002) in ls
    assert ("::1", 18003) in ls and ("*", 18004) in ls
    assert ports.parse_ss_listeners("LISTEN 0 4096 127.0.0.53%lo:53 0.0.0.0:*\n") == [
        ("127.0.0.53", 53)
    ]


# ---------------------------------------------------------------------- versions


def test_versions_record():
    venv = versions.parse_versions(fx("versions_venv.json"))
    assert venv["vllm"] == "0.32.0+cpu" and venv["nixl"] == "1.5.1"
    system = versions.parse_versions(fx("versions_system_python.json"))
    assert (system["vllm"], system["nixl"]) == (None, None)
    assert versions.parse_versions("not json\n") is None


def test_compare_versions():
    venv = versions.parse_versions(fx("versions_venv.json"))
    system = versions.parse_versions(fx("versions_system_python.json"))
    assert statuses(versions.compare_versions({"a": venv, "b": dict(venv)})) == [Status.OK]
    res = versions.compare_versions({"p0": venv, "d0": system})
    assert [r.status for r in res] == [Status.FAIL, Status.FAIL]  # vllm, nixl missing on d0
    other = dict(venv, vllm="0.31.1", python="3.12.3")
    res = versions.compare_versions({"p0": venv, "d0": other})
    assert [(r.status, r.message.split()[0]) for r in res] == [
        (Status.FAIL, "vllm"),
        (Status.WARN, "python"),
    ]
    local = dict(venv, vllm="0.32.0+cu128")
    assert statuses(versions.compare_versions({"p0": venv, "d0": local})) == [Status.WARN]
    patch = dict(venv, python="3.11.2")
    assert statuses(versions.compare_versions({"p0": venv, "d0": patch})) == [Status.OK]
    assert statuses(versions.compare_versions({"p0": venv})) == [Status.SKIP]


# --------------------------------------------------------------------- bandwidth


def test_ib_write_bw_report():
    text = fx("ib_write_bw_roce_client.txt")
    assert bandwidth.parse_ib_write_bw(text) == {
        "bytes": 65536.0,
        "peak_gbps": 0.0,
        "avg_gbps": 98.03,
    }
    mb = text.replace("[Gb/sec]", "[MB/sec]")
    assert bandwidth.parse_ib_write_bw(mb)["avg_gbps"] == pytest.approx(98.03 * 8 / 1000)
    assert bandwidth.parse_ib_write_bw("no report\n") is None


# ----------------------------------------------------------------------- the guard


def _raises(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    raise ValueError("boom")


def test_guard_answers_absent_tools_and_names_the_probe_on_any_exception():
    """Negative control for the test below: the guard hides an evaluator's exception as
    a WARN row, so that test must call the evaluators without it."""
    probe = Probe("demo.raises", "demo", "true", _raises, "demo", tool="demo-tool", install="x")
    (row,) = probe.judge(CommandOutput(0, "some output\n"), ProbeContext("h1"))
    assert (row.probe, row.target, row.status) == ("demo.raises", "h1", Status.WARN)
    assert "could not parse demo output" in row.message and "ValueError: boom" in row.message
    assert row.fix
    (absent,) = probe.judge(CommandOutput(127), ProbeContext("h1", required=True))
    assert (absent.status, absent.message) == (Status.FAIL, "demo-tool not found on host")
    (skip,) = probe.judge(CommandOutput(127), ProbeContext("h1", required=False))
    assert skip.status is Status.SKIP and skip.probe == "demo.raises"


# Real probe output (the fixtures above), whole or cut anywhere: closer to what an
# evaluator half-understands than random text is.
PROBE_OUTPUTS = sorted(
    f.read_text()
    for f in FX.iterdir()
    if f.is_file() and f.name not in ("SOURCES.md", "generate_local.py")
)


@st.composite
def probe_output(draw) -> str:
    text = draw(st.sampled_from(PROBE_OUTPUTS))
    start = draw(st.integers(0, len(text)))
    return text[start : draw(st.integers(start, len(text)))]


@settings(max_examples=60, deadline=None)
@given(
    rc=st.integers(-2, 255),
    out=st.one_of(st.text(max_size=300), probe_output()),
    err=st.one_of(st.text(max_size=100), probe_output()),
)
def test_evaluators_never_raise(rc, out, err):
    """Each evaluator itself, not `Probe.judge` (whose guard turns any exception into a
    WARN and so hides it), returns result rows on any output. The guard is only trusted for
    what it does before the evaluator runs: answering an absent tool."""
    output = CommandOutput(rc, out, err)
    params = {"ucx_tls": "rc,cuda_copy", "ports": [8000], "need": 1, "path": "/m", "npus": [0],
              "names": {"gpu-a01.dc1.example.com": True, "localhost": False}}  # fmt: skip
    for pr in PROBES:
        ctx = ProbeContext("h1", True, params, pr.id)
        res = pr.judge(output, ctx)
        if pr.tool is not None and tool_missing(output):
            assert statuses(res) == [Status.FAIL] and "not found" in res[0].message, res
        else:
            raw = pr.evaluate(output, ctx)  # an exception here fails the test, with its traceback
            assert res == raw, f"{pr.id}: the guard changed the evaluator's result"
        assert isinstance(res, list) and res
        assert all(isinstance(r, CheckResult) for r in res)
        assert {(r.probe, r.target) for r in res} == {(pr.id, "h1")}, res
