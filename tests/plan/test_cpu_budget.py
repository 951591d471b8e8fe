"""The CPU budget: CPU engines are bound only to cores their host has (`hosts.H.cpus`), a
host whose engines want more cores than it has is warned about, and several NIXL CPU
engines on one host are named (they all compute on the last core)."""

from __future__ import annotations

import yaml

from pdlaunch.plan.build import build_plan
from pdlaunch.rules import validate
from pdlaunch.spec.load import load_text


def _cpu(port: int, **extra) -> dict:
    return {"host": "127.0.0.1", "device": "cpu", "port": port, "block_size": 32, **extra}


def topo_text(decodes: int = 2, cpus: int | None = 2, **decode_extra) -> str:
    data: dict = {
        "deployment": "t",
        "model": {"name": "/m"},
        "prefill": [_cpu(8100)],
        "decode": [_cpu(8200 + i, **decode_extra) for i in range(decodes)],
        "router": {"host": "127.0.0.1"},
    }
    if cpus is not None:
        data["hosts"] = {"127.0.0.1": {"cpus": cpus}}
    return yaml.safe_dump(data, sort_keys=False)


def _load(text: str):
    return load_text(text, "t.yaml")


def binds(text: str) -> dict[str, str]:
    topo, _ = _load(text)
    plan = build_plan(topo)
    return {
        p.name: p.env["VLLM_CPU_OMP_THREADS_BIND"] for p in plan.processes if p.role != "router"
    }


def test_1p2d_on_two_cores_binds_only_cores_that_exist():
    # Before: decode-1 got VLLM_CPU_OMP_THREADS_BIND=2 on a 2-core host.
    assert binds(topo_text(cpus=2)) == {"prefill-0": "0", "decode-0": "1", "decode-1": "0"}


def test_unknown_cores_keep_one_core_per_engine_in_order():
    assert binds(topo_text(cpus=None)) == {"prefill-0": "0", "decode-0": "1", "decode-1": "2"}


def test_tp_ranks_wrap_and_split_per_rank():
    text = topo_text(decodes=1, cpus=3, tp=2)
    # prefill takes core 0; decode's two ranks get cores 1 and 2, one list per rank.
    assert binds(text)["decode-0"] == "1|2"


def _findings(text: str):
    topo, source = _load(text)
    return validate(topo, source)


def test_explicit_core_beyond_the_host_is_an_error_naming_it():
    text = topo_text(decodes=1, cpus=2, devices=[3])
    found = [f for f in _findings(text) if f.rule == "cpu-cores"]
    assert [f.severity for f in found] == ["error"]
    assert "core(s) 3" in found[0].message and "has 2" in found[0].message
    assert found[0].field == ("decode", 0, "devices")


def test_oversubscribed_host_is_warned_with_its_numbers():
    found = [f for f in _findings(topo_text(cpus=2)) if f.rule == "cpu-budget"]
    busy = [f for f in found if "threads busy" in f.message]
    assert len(busy) == 1 and busy[0].severity == "warning"
    # 3 engines x (1 OMP thread + the worker's busy loop) = 6 on 2 cores; NIXL's progress
    # thread sleeps (kv_connector.progress_delay_us, on for CPU by default).
    assert "has 2 cores" in busy[0].message and "keep 6 threads busy" in busy[0].message
    # points at the key the user wrote (not its canonical "localhost"), on its line
    assert busy[0].field == ("hosts", "127.0.0.1", "cpus") and busy[0].line is not None
    text = topo_text(cpus=2)
    assert text.splitlines()[busy[0].line - 1].strip() == "cpus: 2"


def test_enough_cores_gives_no_busy_warning_but_still_names_shared_nixl_core():
    found = [f for f in _findings(topo_text(decodes=1, cpus=64)) if f.rule == "cpu-budget"]
    assert not [f for f in found if "threads busy" in f.message]
    nixl = [f for f in found if "NIXL" in f.message]
    assert len(nixl) == 1 and "prefill-0, decode-0" in nixl[0].message
    assert nixl[0].source.endswith("base_worker.py:701-714")


def test_cpus_must_be_positive():
    import pytest

    from pdlaunch.spec.load import LoadError

    with pytest.raises(LoadError):
        _load(topo_text(cpus=0))


# -- cores read from the host (`up`, `check`) -----------------------------------------------------


def test_measured_cores_fill_only_what_the_topology_leaves_unset():
    from pdlaunch.plan.cpu import hosts_without_cpus, with_host_cpus

    bare, _ = _load(topo_text(cpus=None))
    assert hosts_without_cpus(bare) == ["127.0.0.1"]
    measured = with_host_cpus(bare, {"127.0.0.1": 2})
    plan = build_plan(measured)
    got = {p.name: p.env["VLLM_CPU_OMP_THREADS_BIND"] for p in plan.processes if p.role != "router"}
    assert got == binds(topo_text(cpus=2))  # as if the user had written `cpus: 2`
    assert build_plan(bare).by_role("decode")[1].env["VLLM_CPU_OMP_THREADS_BIND"] == "2"
    declared, _ = _load(topo_text(cpus=4))
    assert hosts_without_cpus(declared) == []
    assert with_host_cpus(declared, {"127.0.0.1": 2}).settings_of("127.0.0.1").cpus == 4
    pinned, _ = _load(topo_text(cpus=None, devices=[0]))  # decodes pinned by `devices:`
    assert hosts_without_cpus(pinned) == ["127.0.0.1"]  # the prefill still is not


def test_usable_cores_is_the_run_from_core_zero_the_mask_allows():
    from pdlaunch.check.probes.cpu import parse_cpu_list
    from pdlaunch.plan.cpu import usable_cores

    assert usable_cores(parse_cpu_list("0-1")) == 2
    assert usable_cores(parse_cpu_list("0-3,8")) == 4
    assert usable_cores(parse_cpu_list("4-7")) == 0  # `cpus: N` cannot name these: left unset
