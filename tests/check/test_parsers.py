"""Parsers of `pdlaunch check` over real command output (tests/fixtures/check/SOURCES.md)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdlaunch.check import parsers as p
from pdlaunch.check.parsers import CommandOutput, ProbeContext
from pdlaunch.check.probes import PROBES, PROBES_BY_ID, select_probes
from pdlaunch.check.results import CheckResult, Status, has_failure, worst

FX = Path(__file__).resolve().parent.parent / "fixtures" / "check"


def fx(name: str) -> str:
    return (FX / name).read_text()


def ctx(required: bool = True, target: str = "h1", **params) -> ProbeContext:
    return ProbeContext(target, required, params)


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


def test_ibv_devinfo_roce_mixed():
    ports = p.parse_ibv_devinfo(fx("ibv_devinfo_roce_mixed.txt"))
    assert [(x.name, x.state, x.link_layer) for x in ports] == [
        ("mlx5_0:1", "ACTIVE", "Ethernet"),
        ("mlx5_1:1", "DOWN", "Ethernet"),
        ("mlx5_2:1", "ACTIVE", "Ethernet"),
    ]
    assert all(x.phys_state is None for x in ports)  # only -v prints phys_state
    res = p.eval_ibv_devinfo(CommandOutput(0, fx("ibv_devinfo_roce_mixed.txt")), ctx())
    assert statuses(res) == [Status.OK, Status.WARN, Status.OK]  # unused down port: WARN
    res = p.eval_ibv_devinfo(
        CommandOutput(0, fx("ibv_devinfo_roce_mixed.txt")), ctx(devices=["mlx5_1"])
    )
    assert statuses(res) == [Status.FAIL]  # planned port down
    res = p.eval_ibv_devinfo(
        CommandOutput(0, fx("ibv_devinfo_roce_mixed.txt")),
        ctx(devices=["mlx5_0"], link_layer="InfiniBand"),
    )
    assert statuses(res) == [Status.FAIL] and "link layer" in res[0].message


def test_ibv_devinfo_vv_ib_port_down():
    ports = p.parse_ibv_devinfo(fx("ibv_devinfo_vv_ib_port_down.txt"))
    assert [(x.name, x.state, x.phys_state, x.link_layer) for x in ports] == [
        ("mlx5_0:1", "ACTIVE", "LINK_UP", "InfiniBand"),
        ("mlx5_1:1", "DOWN", "DISABLED", "InfiniBand"),
    ]
    res = p.eval_ibv_devinfo(
        CommandOutput(0, fx("ibv_devinfo_vv_ib_port_down.txt")),
        ctx(devices=["mlx5_0:1", "mlx5_2"], link_layer="InfiniBand"),
    )
    assert statuses(res) == [Status.FAIL, Status.OK]
    assert "mlx5_2 not present" in res[0].message


def test_sysfs_healthy_and_disabled_and_absent():
    ok = p.eval_rdma_sysfs(
        CommandOutput(0, fx("sysfs_ib_healthy.txt")), ctx(link_layer="InfiniBand")
    )
    assert statuses(ok) == [Status.OK]
    assert ok[0].data["phys_state"] == "LINK_UP"
    bad = p.eval_rdma_sysfs(CommandOutput(0, fx("sysfs_port_disabled.txt")), ctx())
    assert Status.FAIL in statuses(bad)  # no ACTIVE port at all
    assert bad[0].data == {
        "device": "mlx5_0",
        "port": 1,
        "state": "DOWN",
        "phys_state": "DISABLED",
        "link_layer": "Ethernet",
    }
    none = CommandOutput(2, "", fx("sysfs_missing.stderr"))
    assert statuses(p.eval_rdma_sysfs(none, ctx(required=True))) == [Status.FAIL]
    assert statuses(p.eval_rdma_sysfs(none, ctx(required=False))) == [Status.SKIP]


def test_rdma_link_forms():
    ports = p.parse_rdma_link(fx("rdma_link_mixed.txt"))
    assert [(x.name, x.state, x.phys_state, x.netdev) for x in ports][:2] == [
        ("mlx5_0:1", "ACTIVE", "LINK_UP", "eno33"),
        ("mlx5_1:1", "DOWN", "DISABLED", "eno34"),
    ]
    ib = p.parse_rdma_link(fx("rdma_link_ib_and_roce.txt"))
    assert [(x.name, x.state) for x in ib] == [
        ("ibp23s0:1", "ACTIVE"),
        ("roceo1:1", "ACTIVE"),
        ("roceo2:1", "DOWN"),
    ]
    res = p.eval_rdma_link(
        CommandOutput(0, fx("rdma_link_mixed.txt")), ctx(devices=["mlx5_0", "mlx5_2"])
    )
    assert statuses(res) == [Status.OK, Status.OK]
    nl = CommandOutput(1, "", fx("rdma_link_no_netlink.stderr"))
    assert statuses(p.eval_rdma_link(nl, ctx())) == [Status.FAIL]
    assert statuses(p.eval_rdma_link(nl, ctx(required=False))) == [Status.SKIP]
    assert statuses(p.eval_rdma_link(CommandOutput(127), ctx(required=False))) == [Status.SKIP]


# --------------------------------------------------------------------------- UCX


def test_ucx_transports_parse():
    tls = p.parse_ucx_transports(fx("ucx_info_d_ib_cuda.txt"))
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
    grep_only = p.parse_ucx_transports(fx("ucx_info_d_hpcx_transports.txt"))
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
    avail = p.parse_ucx_transports(fx("ucx_info_d_ib_cuda.txt"))
    assert p.ucx_tls_missing(tls, avail) == missing


def test_ucx_tls_against_tcp_only_build():
    avail = {"self", "tcp", "sysv", "posix", "cma"}
    assert p.ucx_tls_missing("ib,rc,cuda_copy", avail) == ["ib", "rc", "cuda_copy"]
    assert p.ucx_tls_missing("sm,self", avail) == []
    assert p.split_ucx_tls("^ib") == (True, ["ib"])


def test_ucx_eval():
    out = CommandOutput(0, fx("ucx_info_d_ib_cuda.txt"))
    assert statuses(p.eval_ucx_transports(out, ctx(ucx_tls="ib,rc,cuda_copy"))) == [Status.OK]
    res = p.eval_ucx_transports(out, ctx(ucx_tls="rc,gaudi_gdr"))
    assert statuses(res) == [Status.FAIL] and "gaudi_gdr" in res[0].message
    assert "Gaudi" in res[0].fix
    assert statuses(p.eval_ucx_transports(out, ctx())) == [Status.OK]
    missing = CommandOutput(127, "", fx("ucx_info_missing.stderr"))
    assert statuses(p.eval_ucx_transports(missing, ctx(required=False))) == [Status.SKIP]
    assert statuses(p.eval_ucx_transports(missing, ctx(required=True))) == [Status.FAIL]
    garbage = CommandOutput(0, "something else entirely\n")
    res = p.eval_ucx_transports(garbage, ctx(ucx_tls="tcp"))
    assert statuses(res) == [Status.WARN] and "could not parse" in res[0].message


def test_ucx_env():
    env = p.parse_env(fx("env_stray_ucx.txt"))
    assert env["UCX_TLS"] == "tcp" and env["HOME"] == "/root"
    res = p.eval_ucx_env(
        CommandOutput(0, fx("env_stray_ucx.txt")),
        ctx(planned_env={"UCX_TLS": "tcp", "UCX_NET_DEVICES": "mlx5_1:1"}),
    )
    msgs = {r.data["var"]: r for r in res}
    assert set(msgs) == {"UCX_NET_DEVICES", "UCX_LOG_LEVEL"}  # UCX_TLS matches the plan
    assert all(r.status is Status.WARN for r in res)
    assert "stray UCX_LOG_LEVEL" in msgs["UCX_LOG_LEVEL"].message
    clean = p.eval_ucx_env(CommandOutput(0, fx("env_clean.txt")), ctx())
    assert statuses(clean) == [Status.OK]


# ------------------------------------------------------------------------ NVIDIA


def test_nvidia_smi_csv_and_thresholds():
    text = fx("nvidia_smi_h100_third_party.csv")
    devs = p.parse_smi_csv(text)
    assert devs == [p.Accel(0, "NVIDIA H100 80GB HBM3", 81559.0, 79000.0)]
    assert statuses(p.eval_nvidia_smi(CommandOutput(0, text), ctx(need=1))) == [Status.OK]
    res = p.eval_nvidia_smi(CommandOutput(0, text), ctx(need=2))
    assert Status.FAIL in statuses(res) and "plan needs 2" in res[0].message
    res = p.eval_nvidia_smi(CommandOutput(0, text), ctx(need=1, min_free_fraction=0.99))
    assert statuses(res) == [Status.FAIL]
    res = p.eval_nvidia_smi(CommandOutput(0, text), ctx(need=1, devices=[3]))
    assert Status.FAIL in statuses(res)


def test_nvidia_smi_tolerates_units_and_na():
    devs = p.parse_smi_csv(
        "index, name, memory.total [MiB], memory.free [MiB]\n0, Tesla T4, 15360 MiB, [N/A]\n"
    )
    assert devs == [p.Accel(0, "Tesla T4", 15360.0, None)]


def test_nvidia_smi_no_driver_and_absent():
    out = CommandOutput(9, fx("nvidia_smi_no_driver.txt"))
    res = p.eval_nvidia_smi(out, ctx())
    assert statuses(res) == [Status.FAIL] and "driver" in res[0].message
    assert statuses(p.eval_nvidia_smi(CommandOutput(127), ctx(required=False))) == [Status.SKIP]


def test_peermem():
    ok = p.eval_peermem(CommandOutput(0, fx("lsmod_grep_nvidia_peermem.txt")), ctx())
    assert statuses(ok) == [Status.OK] and ok[0].data["module"] == "nvidia_peermem"
    bad = p.eval_peermem(CommandOutput(0, fx("lsmod_grep_no_peermem.txt")), ctx())
    assert statuses(bad) == [Status.FAIL] and bad[0].data["gdrdrv"] is True
    assert "modprobe nvidia_peermem" in bad[0].fix
    legacy = "Module                  Size  Used by\nnv_peer_mem            16384  0\n"
    assert statuses(p.eval_peermem(CommandOutput(0, legacy), ctx())) == [Status.OK]


# ------------------------------------------------------------------------- Gaudi


def test_hl_smi_devices():
    text = fx("hl_smi_q_third_party.csv")
    res = p.eval_hl_smi(CommandOutput(0, text), ctx(need=2, min_free_fraction=0.8))
    assert statuses(res) == [Status.OK]
    res = p.eval_hl_smi(CommandOutput(0, text), ctx(need=2, min_free_fraction=0.9))
    assert Status.FAIL in statuses(res)  # device 0 has 81% free, 2 needed
    assert statuses(p.eval_hl_smi(CommandOutput(127), ctx(required=False))) == [Status.SKIP]


def test_hl_links():
    up = fx("hl_smi_link_up.txt")
    assert p.parse_hl_link(up)[21] == "UP" and len(p.parse_hl_link(up)) == 18
    out = CommandOutput(0, "== 0000:bb:00.0 ==\n" + up)
    assert statuses(p.eval_hl_links(out, ctx())) == [Status.OK]
    # no DOWN capture was found; derive one from the real UP listing (SOURCES.md)
    down = up.replace("port 10:        UP", "port 10:        DOWN")
    res = p.eval_hl_links(CommandOutput(0, "== 0000:bb:00.0 ==\n" + down), ctx())
    assert statuses(res) == [Status.FAIL] and res[0].data["down"] == [10]
    assert statuses(p.eval_hl_links(CommandOutput(0, "weird"), ctx())) == [Status.WARN]


# ------------------------------------------------------------------------ Ascend


def test_npu_smi_info():
    text = fx("npu_smi_info_910b3x8.txt")
    npus = p.parse_npu_smi_info(text)
    assert [n.index for n in npus] == list(range(8))
    assert npus[0] == p.Npu(0, "910B3", "OK", 3338.0, 65536.0)
    assert statuses(p.eval_npu_smi(CommandOutput(0, text), ctx(need=8))) == [Status.OK]
    assert Status.FAIL in statuses(p.eval_npu_smi(CommandOutput(0, text), ctx(need=16)))
    row3 = "| 3     910B3               | OK     "
    sick = text.replace(row3, row3.replace("OK   ", "Alarm"))
    res = p.eval_npu_smi(CommandOutput(0, sick), ctx(need=8))
    assert Status.FAIL in statuses(res)


def test_hccn_link_ip():
    link = CommandOutput(
        0, "== npu 0 ==\n" + fx("hccn_link_up.txt") + "== npu 1 ==\nlink status: DOWN\n"
    )
    assert statuses(p.eval_hccn_link(link, ctx())) == [Status.OK, Status.FAIL]
    ip = fx("hccn_ip_doc.txt")  # the published sample masks the address: 10.xx.xx.10
    res = p.eval_hccn_ip(CommandOutput(0, "== npu 0 ==\n" + ip), ctx())
    assert statuses(res) == [Status.WARN]
    real = ip.replace("10.xx.xx.10", "29.1.137.205")
    res = p.eval_hccn_ip(
        CommandOutput(0, "== npu 0 ==\n" + real + "== npu 7 ==\n"),
        ctx(expected={0: "29.1.137.205"}),
    )
    assert statuses(res) == [Status.OK, Status.FAIL]
    res = p.eval_hccn_ip(CommandOutput(0, "== npu 0 ==\n" + real), ctx(expected={"0": "1.2.3.4"}))
    assert statuses(res) == [Status.FAIL]
    assert statuses(p.eval_hccn_link(CommandOutput(127), ctx(required=False))) == [Status.SKIP]


def test_hccn_tls_host_and_cluster():
    ok = p.eval_hccn_tls(CommandOutput(0, fx("hccn_tls_consistent.txt")), ctx())
    assert statuses(ok) == [Status.OK] and ok[0].data["tls"] == {0: 0, 1: 0, 2: 0, 3: 0}
    mixed = p.eval_hccn_tls(CommandOutput(0, fx("hccn_tls_mixed.txt")), ctx())
    assert statuses(mixed) == [Status.FAIL]
    assert p.parse_hccn_tls(fx("hccn_tls_full_cert.txt")) == {0: 0}
    same = {"p0": {0: 0, 1: 0}, "d0": {0: 0, 1: 0}}
    assert statuses(p.compare_ascend_tls(same)) == [Status.OK]
    diff = {"p0": {0: 0, 1: 0}, "d0": {0: 1, 1: 1}}
    res = p.compare_ascend_tls(diff)
    assert statuses(res) == [Status.FAIL] and "d0/npu0" in res[0].message
    assert statuses(p.compare_ascend_tls({})) == [Status.SKIP]


def test_hccn_ping():
    assert p.parse_hccn_ping(fx("hccn_ping_ok.txt")) == {
        "timeouts": 0,
        "sent": 3,
        "received": 3,
        "loss": 0.0,
    }
    out = CommandOutput(
        0,
        "== npu 3 -> 29.1.137.205 ==\n"
        + fx("hccn_ping_ok.txt")
        + "== npu 0 -> 10.10.100.10 ==\n"
        + fx("hccn_ping_partial_loss.txt"),
    )
    res = p.eval_hccn_ping(out, ctx(target="p0 -> d0"))
    assert statuses(res) == [Status.OK, Status.FAIL]
    assert res[1].data["loss"] == pytest.approx(33.33) and res[1].target == "p0 -> d0"


def test_hccn_conf():
    text = fx("hccn_conf_8npu.txt")
    conf = p.parse_hccn_conf(text)
    assert conf[0]["address"] == "29.1.137.205" and conf[7]["netmask"] == "255.255.0.0"
    assert statuses(p.eval_hccn_conf(CommandOutput(0, text), ctx(npus=[0, 7]))) == [Status.OK]
    res = p.eval_hccn_conf(CommandOutput(0, text), ctx(npus=[0, 1]))
    assert statuses(res) == [Status.FAIL] and "NPU(s) 1" in res[0].message
    gone = CommandOutput(1, "", "cat: /etc/hccn.conf: No such file or directory\n")
    assert statuses(p.eval_hccn_conf(gone, ctx())) == [Status.FAIL]


# ------------------------------------------------------------------------- ports


def test_ss_listeners_forms():
    ls = p.parse_ss_listeners(fx("ss_ltnH_local.txt"))
    assert ("0.0.0.0", 18000) in ls and ("::", 18001) in ls and ("127.0.0.1", 18002) in ls
    assert ("::1", 18003) in ls and ("*", 18004) in ls
    assert p.parse_ss_listeners("LISTEN 0 4096 127.0.0.53%lo:53 0.0.0.0:*\n") == [
        ("127.0.0.53", 53)
    ]


def test_ports_free():
    out = CommandOutput(0, fx("ss_ltnH_local.txt"))
    planned = {
        18000: "http",
        18001: "nixl side channel",
        18002: "kv",
        18003: "x",
        18004: "y",
        18099: "free one",
    }
    res = p.eval_ports_free(out, ctx(ports=planned))
    by_port = {r.data["port"]: r.status for r in res}
    assert by_port == {
        18000: Status.FAIL,
        18001: Status.FAIL,
        18002: Status.FAIL,
        18003: Status.FAIL,
        18004: Status.FAIL,
        18099: Status.OK,
    }
    assert statuses(p.eval_ports_free(out, ctx(ports=[18099]))) == [Status.OK]
    assert statuses(p.eval_ports_free(out, ctx())) == [Status.SKIP]


def test_port_reach():
    ok = p.eval_port_reach(CommandOutput(0, fx("reach_open.json")), ctx(target="router -> p0"))
    assert statuses(ok) == [Status.OK]
    refused = p.eval_port_reach(CommandOutput(0, fx("reach_refused.json")), ctx())
    assert statuses(refused) == [Status.OK] and "nothing listening" in refused[0].message
    dns = p.eval_port_reach(CommandOutput(0, fx("reach_dns_error.json")), ctx())
    assert statuses(dns) == [Status.FAIL] and "Name or service" in dns[0].message
    timeout = json.dumps(
        {"host": "10.0.0.9", "pdlaunch_probe": 1, "port": 8000, "result": "timeout"}
    )  # our own format; no route to force one here
    assert statuses(p.eval_port_reach(CommandOutput(0, timeout), ctx())) == [Status.FAIL]


# ---------------------------------------------------------------------- versions


def test_versions_per_host():
    venv = p.parse_versions(fx("versions_venv.json"))
    assert venv["vllm"] == "0.32.0+cpu" and venv["nixl"] == "1.5.1"
    assert statuses(
        p.eval_versions(CommandOutput(0, fx("versions_venv.json")), ctx(need_nixl=True))
    ) == [Status.OK]
    sysres = p.eval_versions(CommandOutput(0, fx("versions_system_python.json")), ctx())
    assert statuses(sysres) == [Status.FAIL] and "vLLM not installed" in sysres[0].message
    rc = int(fx("versions_python_missing.rc"))
    assert statuses(p.eval_versions(CommandOutput(rc), ctx())) == [Status.FAIL]


def test_compare_versions():
    venv = p.parse_versions(fx("versions_venv.json"))
    system = p.parse_versions(fx("versions_system_python.json"))
    assert statuses(p.compare_versions({"a": venv, "b": dict(venv)})) == [Status.OK]
    res = p.compare_versions({"p0": venv, "d0": system})
    assert [r.status for r in res] == [Status.FAIL, Status.FAIL]  # vllm, nixl missing on d0
    other = dict(venv, vllm="0.31.1", python="3.12.3")
    res = p.compare_versions({"p0": venv, "d0": other})
    assert [(r.status, r.message.split()[0]) for r in res] == [
        (Status.FAIL, "vllm"),
        (Status.WARN, "python"),
    ]
    local = dict(venv, vllm="0.32.0+cu128")
    assert statuses(p.compare_versions({"p0": venv, "d0": local})) == [Status.WARN]
    patch = dict(venv, python="3.11.2")
    assert statuses(p.compare_versions({"p0": venv, "d0": patch})) == [Status.OK]
    assert statuses(p.compare_versions({"p0": venv})) == [Status.SKIP]


# -------------------------------------------------------------------- model path


def test_model_path():
    ok = p.eval_model_path(CommandOutput(0, fx("ls_model_ok.txt")), ctx(path="/m"))
    assert statuses(ok) == [Status.OK]
    gone = p.eval_model_path(CommandOutput(2, "", fx("ls_model_missing.stderr")), ctx(path="/x"))
    assert statuses(gone) == [Status.FAIL]
    assert statuses(p.eval_model_path(CommandOutput(0, "README.md\n"), ctx())) == [Status.WARN]


# --------------------------------------------------------------------- bandwidth


def test_ib_write_bw():
    text = fx("ib_write_bw_roce_client.txt")
    assert p.parse_ib_write_bw(text) == {"bytes": 65536.0, "peak_gbps": 0.0, "avg_gbps": 98.03}
    assert statuses(p.eval_ib_write_bw(CommandOutput(0, text), ctx(min_gbps=90))) == [Status.OK]
    assert statuses(p.eval_ib_write_bw(CommandOutput(0, text), ctx(min_gbps=190))) == [Status.WARN]
    mb = text.replace("[Gb/sec]", "[MB/sec]")
    assert p.parse_ib_write_bw(mb)["avg_gbps"] == pytest.approx(98.03 * 8 / 1000)
    fail = CommandOutput(1, "", " Couldn't connect to 10.0.0.1:18515\n")
    assert statuses(p.eval_ib_write_bw(fail, ctx())) == [Status.FAIL]


# -------------------------------------------------------------- probes and safety


def test_probe_selection_and_rendering():
    nv = [pr.id for pr in select_probes({"nvidia"}, {"rdma", "ucx"})]
    assert nv == [
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
    asc = [pr.id for pr in select_probes({"ascend"}, {"hccl"}, model_is_local=False)]
    assert asc == [
        "ascend.npu_smi",
        "ascend.hccn_conf",
        "ascend.link",
        "ascend.ip",
        "ascend.tls",
        "ports.listen",
        "versions",
        "vllm.argv",
    ]
    pairs = [pr.id for pr in select_probes({"ascend"}, {"rdma"}, scope="pair", bandwidth=True)]
    assert pairs == ["ascend.ping", "ports.reach", "bandwidth.ib_write_bw"]
    assert "bandwidth.ib_write_bw" not in [
        pr.id for pr in select_probes({"nvidia"}, {"rdma"}, scope="pair")
    ]
    assert [pr.id for pr in select_probes({"gaudi"}, {"ucx"}, fast_only=True)][:2] == [
        "ucx.transports",
        "ucx.env",
    ]
    cmd = PROBES_BY_ID["ascend.ping"].render({"pairs": [(0, "29.1.137.205")]})
    assert "hccn_tool -i 0 -ping -g address 29.1.137.205" in cmd
    cmd = PROBES_BY_ID["model.path"].render({"path": "/models/it's here"})
    assert cmd == "ls -1 -- '/models/it'\"'\"'s here'"
    assert PROBES_BY_ID["ports.listen"].render().endswith("ss -ltnH")
    assert len({pr.id for pr in PROBES}) == len(PROBES)


# Real probe output (the fixtures above), whole or cut anywhere: closer to what an
# evaluator half-understands than random text is.
PROBE_OUTPUTS = sorted(
    f.read_text() for f in FX.iterdir() if f.name not in ("SOURCES.md", "generate_local.py")
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
    """Each evaluator itself, not its `_guard` (which turns any exception into a WARN and so
    hides it), returns result rows on any output. The guard is only trusted for what it
    does before the evaluator runs: answering an absent tool."""
    output = CommandOutput(rc, out, err)
    c = ctx(ucx_tls="rc,cuda_copy", ports=[8000], need=1, path="/m", npus=[0])
    for pr in PROBES:
        evaluator = inspect.unwrap(pr.evaluate)
        assert evaluator is not pr.evaluate, f"{pr.id}: evaluator is not guarded"
        tool = inspect.getclosurevars(pr.evaluate).nonlocals["tool"]
        res = pr.evaluate(output, c)
        if tool is not None and p.tool_missing(output):
            assert statuses(res) == [Status.FAIL] and "not found" in res[0].message, res
        else:
            raw = evaluator(output, c)  # an exception here fails the test, with its traceback
            assert res == raw, f"{pr.id}: the guard changed the evaluator's result"
        assert isinstance(res, list) and res
        assert all(isinstance(r, CheckResult) for r in res)
        assert {(r.probe, r.target) for r in res} == {(pr.id, "h1")}, res
