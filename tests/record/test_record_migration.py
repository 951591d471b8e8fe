"""The one record (pdlaunch.record, format 2) read from the files today's backends write:
``state.json`` (`up` over SSH) and ``slurm.json`` (a Slurm job), each written here by the
code that writes it in production (pdlaunch.state.save_state, slurm_record.save_record)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdlaunch import record
from pdlaunch.backends import slurm_record
from pdlaunch.runtime.ssh.records import unrecorded_state
from pdlaunch.state import save_state
from tests.support.slurm_specs import fake_spec, planned

PORTS = {"prefill": 18101, "decode": 18102, "side": 18103, "router": 18104, "metrics": 18105}


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("PDLAUNCH_STATE_DIR", str(d))
    return d


def _plan(tmp_path: Path, name: str, hosts=("pd-a", "pd-b")):
    bins = {"vllm": Path("/opt/vllm/bin/vllm"), "router": Path("/opt/router/bin/vllm-router")}
    spec = fake_spec(name, tmp_path / "work", list(hosts), bins, PORTS)
    return planned(spec, tmp_path / f"{name}.yaml")[2]


def test_an_ssh_state_json_reads_as_a_record(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "ssh-dep")
    state = unrecorded_state(plan, status="up")
    state.topology = str(tmp_path / "ssh-dep.yaml")
    state.known_hosts = "/home/u/.ssh/known_hosts"
    for i, p in enumerate(state.processes):
        p.pid, p.start_time = 1000 + i, 5000 + i
    path = save_state(state)

    rec = record.find("ssh-dep")
    assert rec is not None and rec.backend == "ssh" and rec.format == 2
    assert rec.source == str(path) and rec.status == "up"
    assert rec.endpoint == "http://pd-a:18104"
    assert isinstance(rec.handle, record.SshHandle)
    assert rec.handle.known_hosts == "/home/u/.ssh/known_hosts"
    assert rec.handle.topology == state.topology
    by_name = {p.name: p for p in rec.processes}
    assert set(by_name) == {"prefill-0", "decode-0", "router"}
    assert by_name["decode-0"].host == "pd-b" and by_name["decode-0"].pid == 1001
    assert by_name["decode-0"].start_time == 5001
    assert by_name["decode-0"].metrics_url == "http://pd-b:18102/metrics"
    # vllm-router serves Prometheus text on its own port, the second one recorded.
    assert by_name["router"].metrics_url == "http://pd-a:18105/metrics"
    assert by_name["prefill-0"].log_path == plan.processes[0].log_path
    assert not by_name["prefill-0"].log_local
    assert rec.native is not None and rec.native.deployment == "ssh-dep"
    assert record.read_migrated(path) == rec


def test_a_slurm_json_reads_as_a_record_unplaced_without_asking_slurm(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "slurm-dep")
    path = slurm_record.save_record(slurm_record.record_of(plan, "4242"))

    rec = record.find("slurm-dep", place=False)  # place=False: no Slurm command runs
    assert rec is not None and rec.backend == "slurm" and rec.status == "submitted"
    assert isinstance(rec.handle, record.SlurmHandle)
    assert rec.handle.job_id == "4242" and rec.handle.job_state is None
    assert rec.handle.driver_log.endswith("slurm-4242.log")
    assert rec.handle.work_dirs == [str(tmp_path / "work" / "slurm-dep")]
    # Nothing says where Slurm put the job yet: no host, no URL (never the plan's pd-a).
    assert rec.endpoint is None
    assert all(p.host is None and p.health_url is None for p in rec.processes)
    assert all(p.log_local for p in rec.processes)
    assert record.log_path(rec, "driver") == rec.handle.driver_log
    with pytest.raises(record.RecordError, match="known: prefill-0, decode-0, router, driver"):
        record.log_path(rec, "nope")
    assert record.read_migrated(path) == rec


def test_placed_slurm_processes_get_their_nodes_urls(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "placed")
    srec = slurm_record.record_of(plan, "7")
    placed = {
        "prefill-0": ("node3", "http://10.0.0.3:18101"),
        "decode-0": ("node4", "http://10.0.0.4:18102"),
        "router": ("node3", "http://10.0.0.3:18104"),
    }
    rec = record.from_slurm(srec, placed, "RUNNING")
    assert rec.endpoint == "http://10.0.0.3:18104"
    assert rec.router is not None and rec.router.health_url == "http://10.0.0.3:18104/health"
    assert rec.router.metrics_url == "http://10.0.0.3:18105/metrics"
    assert rec.process("decode-0").metrics_url == "http://10.0.0.4:18102/metrics"
    assert [p.name for p in rec.engines()] == ["prefill-0", "decode-0"]


def test_a_slurm_json_written_before_metrics_port_still_reads(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "older")
    path = slurm_record.save_record(slurm_record.record_of(plan, "9"))
    data = json.loads(path.read_text())
    for p in data["processes"]:
        del p["metrics_port"]  # as pdlaunch wrote slurm.json before it kept the router's
    path.write_text(json.dumps(data))
    rec = record.from_slurm(slurm_record.load_record("older"), {"router": ("n", "http://n:1")})
    assert rec.router is not None and rec.router.metrics_url is None  # not known: not guessed


def test_format_2_round_trips_and_refuses_a_bad_field(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "rt")
    slurm_record.save_record(slurm_record.record_of(plan, "11"))
    rec = record.find("rt", place=False)
    assert rec is not None
    again = record.Record.parse(rec.to_json())
    # Equal in every field (the backend's own record is not part of format 2).
    assert again.model_dump() == rec.model_dump() and again.native is None
    out = tmp_path / "rt-record.json"
    out.write_text(rec.to_json())
    assert record.read_migrated(out).model_dump() == rec.model_dump()
    data = json.loads(rec.to_json())
    data["processes"][0]["pid"] = "12"  # a string where a pid is an int
    with pytest.raises(record.RecordError, match=r"processes\.0\.pid"):
        record.Record.parse(json.dumps(data))


def test_damaged_ambiguous_and_missing_records(tmp_path: Path, state_dir: Path) -> None:
    assert record.find("nothing") is None
    plan = _plan(tmp_path, "both")
    slurm_record.save_record(slurm_record.record_of(plan, "5"))
    save_state(unrecorded_state(plan))
    with pytest.raises(record.RecordError, match="--backend ssh or --backend slurm"):
        record.find("both")
    assert record.find("both", "slurm", place=False).backend == "slurm"
    assert record.find("both", "ssh").backend == "ssh"

    (state_dir / "bad").mkdir()
    (state_dir / "bad" / "slurm.json").write_text('{"backend": "slurm", "job_id": 1}')
    with pytest.raises(record.StateError, match="Nothing was cancelled or deleted"):
        record.find("bad", place=False)
    found = list(record.find_all())
    assert sorted(r.backend for r in found if isinstance(r, record.Record)) == ["slurm", "ssh"]
    errors = [str(e) for e in found if isinstance(e, record.RecordError)]
    assert len(errors) == 1 and errors[0].startswith("the Slurm record"), errors


def test_a_slurm_that_does_not_answer_leaves_the_job_unplaced_and_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Slurm client on this host: the record is found, nothing placed, and the doctor
    says "unknown" (never "dead": nothing was proven)."""
    from pdlaunch.doctor.slurm import slurm_running

    plan = _plan(tmp_path, "noslurm")
    slurm_record.save_record(slurm_record.record_of(plan, "77"))
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rec = record.find("noslurm")
    assert rec is not None and isinstance(rec.handle, record.SlurmHandle)
    assert rec.handle.job_state == "UNKNOWN" and "squeue not found" in rec.handle.job_detail
    assert rec.endpoint is None and all(p.health_url is None for p in rec.processes)
    running = slurm_running(rec)
    assert {v[0] for v in running.values()} == {"unknown"}, running
    assert "job 77 is UNKNOWN (squeue not found" in running["router"][1]
