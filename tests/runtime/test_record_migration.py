"""The one record (pdlaunch.runtime.record, format 2, ``record.json``) and its migration from
the format-1 files the backends wrote before it: ``state.json`` (`up` over SSH) and
``slurm.json`` (a Slurm job), each written here as that code wrote it (its working view's
fields, ``"format": 1``, sorted keys; tests/fixtures/record holds captured ones)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from pdlaunch.backends.slurm import record as slurm_record
from pdlaunch.backends.ssh.records import unrecorded_state
from pdlaunch.runtime import record, record_store
from pdlaunch.runtime.state import DeploymentState, deployment_dir
from tests.support.slurm_specs import fake_spec, planned

ROOT = Path(__file__).resolve().parents[2]

def test_a_slurm_record_keeps_the_dp_ranks_each_api_server_fronts(tmp_path: Path) -> None:
    """`pdlaunch canary` on a running Slurm job pins every DP rank as `up` did: the ranks
    travel plan -> Slurm record -> stored record -> the doctor's view the canary reads."""
    from pdlaunch.backends.slurm.doctor import slurm_state
    from pdlaunch.plan.build import build_plan
    from pdlaunch.spec.load import load

    plan = build_plan(load(ROOT / "topologies" / "gb200-xpyd.yaml")[0])
    want = {p.name: p.dp_ranks for p in plan.processes}
    assert want["decode-0-node1"] == [4, 5, 6, 7]  # hybrid LB: the node's own ranks
    slurm_record.save_slurm(slurm_record.record_of(plan, "31"))
    rec = record_store.find(plan.deployment, place=False)
    assert rec is not None
    assert {p.name: p.dp_ranks for p in rec.processes} == want
    assert {p.name: p.dp_ranks for p in slurm_state(rec).processes} == want
    assert slurm_record.to_slurm(rec) == rec.native
    # a record written before the ranks were kept reads as one engine per process
    older = json.loads(rec.stored_json())
    for proc in older["processes"]:
        del proc["dp_ranks"]
    assert all(p.dp_ranks == [] for p in record.Record.model_validate(older).processes)


PORTS = {"prefill": 18101, "decode": 18102, "side": 18103, "router": 18104, "metrics": 18105}


def _plan(tmp_path: Path, name: str, hosts=("pd-a", "pd-b")):
    bins = {"vllm": Path("/opt/vllm/bin/vllm"), "router": Path("/opt/router/bin/vllm-router")}
    spec = fake_spec(name, tmp_path / "work", list(hosts), bins, PORTS)
    return planned(spec, tmp_path / f"{name}.yaml")[2]


def _write_format1(deployment: str, name: str, fields: dict) -> Path:
    """A format-1 file as `save_state`/`save_record` wrote it before format 2."""
    d = deployment_dir(deployment)
    d.mkdir(parents=True, exist_ok=True)
    path = d / name
    path.write_text(json.dumps({**fields, "format": 1}, indent=2, sort_keys=True) + "\n")
    return path


def legacy_state(state: DeploymentState) -> Path:
    return _write_format1(state.deployment, "state.json", state.to_json())


def legacy_slurm(srec: slurm_record.SlurmRecord) -> Path:
    return _write_format1(srec.deployment, "slurm.json", asdict(srec))


def _ssh_state(tmp_path: Path, name: str) -> DeploymentState:
    state = unrecorded_state(_plan(tmp_path, name), status="up")
    state.topology = str(tmp_path / f"{name}.yaml")
    state.known_hosts = "/home/u/.ssh/known_hosts"
    for i, p in enumerate(state.processes):
        p.pid, p.start_time = 1000 + i, 5000 + i
    return state


def test_an_ssh_state_json_reads_as_a_record(tmp_path: Path) -> None:
    state = _ssh_state(tmp_path, "ssh-dep")
    path = legacy_state(state)

    rec = record_store.find("ssh-dep")
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
    assert by_name["prefill-0"].log_path == state.processes[0].log_path
    assert not by_name["prefill-0"].log_local
    # Everything the SSH runtime needs to find and stop it is in its typed handles.
    h = by_name["decode-0"].handle
    assert isinstance(h, record.SshProcessHandle)
    assert h.pid_path == state.process("decode-0").pid_path and h.ssh.connect_timeout == 10.0
    # ... and reads back as the working view it was, field for field.
    assert rec.native == state and record.to_state(rec) == state
    assert record_store.read_file(path) == rec
    assert not (deployment_dir("ssh-dep") / "record.json").exists()  # reading writes nothing


def test_a_slurm_json_reads_as_a_record_unplaced_without_asking_slurm(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "slurm-dep")
    path = legacy_slurm(slurm_record.record_of(plan, "4242"))

    rec = record_store.find("slurm-dep", place=False)  # place=False: no Slurm command runs
    assert rec is not None and rec.backend == "slurm" and rec.status == "submitted"
    assert isinstance(rec.handle, record.SlurmHandle)
    assert rec.handle.job_id == "4242" and rec.handle.job_state is None
    assert rec.handle.driver_log.endswith("slurm-4242.log")
    assert rec.handle.work_dirs == [str(tmp_path / "work" / "slurm-dep")]
    # Nothing says where Slurm put the job yet: no host, no URL (never the plan's pd-a).
    assert rec.endpoint is None
    assert all(p.host is None and p.health_url is None for p in rec.processes)
    assert all(p.log_local for p in rec.processes)
    assert record_store.log_path(rec, "driver") == rec.handle.driver_log
    with pytest.raises(record.RecordError, match="known: prefill-0, decode-0, router, driver"):
        record_store.log_path(rec, "nope")
    assert record_store.read_file(path) == rec
    assert slurm_record.to_slurm(rec) == rec.native


def test_placed_slurm_processes_get_their_nodes_urls(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "placed")
    srec = slurm_record.record_of(plan, "7")
    placed = {
        "prefill-0": ("node3", "http://10.0.0.3:18101"),
        "decode-0": ("node4", "http://10.0.0.4:18102"),
        "router": ("node3", "http://10.0.0.3:18104"),
    }
    rec = slurm_record.from_slurm(srec, placed, "RUNNING")
    assert rec.endpoint == "http://10.0.0.3:18104"
    assert rec.router is not None and rec.router.health_url == "http://10.0.0.3:18104/health"
    assert rec.router.metrics_url == "http://10.0.0.3:18105/metrics"
    assert rec.process("decode-0").metrics_url == "http://10.0.0.4:18102/metrics"
    assert [p.name for p in rec.engines()] == ["prefill-0", "decode-0"]
    # Where Slurm put it is what was found, not what was started: never stored.
    stored = json.loads(rec.stored_json())
    assert "job_state" not in stored["handle"] and "source" not in stored


def test_a_slurm_json_written_before_metrics_port_still_reads(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "older")
    path = legacy_slurm(slurm_record.record_of(plan, "9"))
    data = json.loads(path.read_text())
    for p in data["processes"]:
        del p["metrics_port"]  # as pdlaunch wrote slurm.json before it kept the router's
    path.write_text(json.dumps(data))
    rec = slurm_record.from_slurm(slurm_record.load_slurm("older"), {"router": ("n", "http://n:1")})
    assert rec.router is not None and rec.router.metrics_url is None  # not known: not guessed


def test_format_2_round_trips_for_both_runtimes(tmp_path: Path) -> None:
    state = _ssh_state(tmp_path, "rt-ssh")
    path = record_store.save_state(state)
    assert path == deployment_dir("rt-ssh") / "record.json"
    data = json.loads(path.read_text())
    assert data["format"] == 2 and data["backend"] == "ssh" and "source" not in data
    assert data["processes"][1]["handle"]["pid_path"] == state.process("decode-0").pid_path
    assert record_store.load_state("rt-ssh") == state  # every field, the pids included
    assert (path.stat().st_mode & 0o777) == 0o600

    srec = slurm_record.record_of(_plan(tmp_path, "rt-slurm"), "11")
    srec.scripts_hash = "ab" * 32
    path = slurm_record.save_slurm(srec)
    data = json.loads(path.read_text())
    assert data["format"] == 2 and data["handle"]["job_id"] == "11"
    assert slurm_record.load_slurm("rt-slurm") == srec
    rec = record_store.find("rt-slurm", place=False)
    again = record.Record.parse(rec.to_json())
    # Equal in every field (the runtime's working view is not part of format 2).
    assert again.model_dump() == rec.model_dump() and again.native is None


def test_format_2_refuses_a_bad_field_and_a_record_that_points_elsewhere(
    tmp_path: Path,
) -> None:
    path = record_store.save_state(_ssh_state(tmp_path, "bad2"))
    good = path.read_text()
    data = json.loads(good)
    data["processes"][0]["pid"] = "12"  # a string where a pid is an int
    with pytest.raises(record.RecordError, match=r"processes\.0\.pid"):
        record.Record.parse(json.dumps(data))
    path.write_text(json.dumps(data))
    named = r"record\.json is damaged: processes\[0\]\.pid: .*found '12'"
    with pytest.raises(record.RecordError, match=named):
        record_store.find("bad2")
    # Well-formed, but naming a file outside the deployment's dir for `down` to delete: the
    # SSH runtime's own check refuses it (never acted on).
    data = json.loads(good)
    data["processes"][0]["handle"]["secrets_path"] = "/etc/passwd"
    path.write_text(json.dumps(data))
    with pytest.raises(record.RecordError, match="pdlaunch deletes files only in"):
        record_store.load_state("bad2")
    data = json.loads(good)
    data["processes"][0]["handle"] = {"kind": "slurm"}  # one record, one backend
    path.write_text(json.dumps(data))
    with pytest.raises(record.RecordError, match="damaged"):
        record_store.load_state("bad2")


def test_the_next_write_replaces_the_format_1_file(tmp_path: Path) -> None:
    state = _ssh_state(tmp_path, "mig")
    old = legacy_state(state)
    loaded = record_store.load_state("mig")
    assert loaded == state
    loaded.status = "stopping"
    new = record_store.save_state(loaded)
    assert new.name == "record.json" and not old.exists()
    assert record_store.load_state("mig").status == "stopping"

    srec = slurm_record.record_of(_plan(tmp_path, "mig-s"), "12")
    old = legacy_slurm(srec)
    loaded = slurm_record.load_slurm("mig-s")
    loaded.status = "up"
    assert slurm_record.save_slurm(loaded).name == "record.json" and not old.exists()
    record_store.remove("mig-s", "slurm")
    assert record_store.find("mig-s") is None and record_store.list_deployments() == ["mig"]


def test_a_crash_between_writing_the_new_file_and_removing_the_old_leaves_it_findable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _ssh_state(tmp_path, "crash")
    old = legacy_state(state)
    state.status = "failed"

    def killed(deployment: str, backend: str) -> None:
        raise KeyboardInterrupt  # pdlaunch dies right after record.json is renamed in place

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(record_store, "_remove_legacy", killed)
        record_store.save_state(state)
    assert old.exists() and (deployment_dir("crash") / "record.json").exists()
    # Both are there: the newer one is read (its status), the deployment listed once.
    rec = record_store.find("crash")
    assert rec.source.endswith("record.json") and rec.status == "failed"
    assert record_store.backend_of("crash") == "ssh"
    assert record_store.list_deployments() == ["crash"]
    assert [r.deployment for r in record_store.find_all()] == ["crash"]
    # The next write takes the old file away; so does forgetting the deployment.
    record_store.save_state(record_store.load_state("crash"))
    assert not old.exists()
    legacy_state(state)
    record_store.remove("crash", "ssh")
    assert record_store.find("crash") is None and record_store.list_deployments() == []


def test_a_record_of_a_newer_format_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = record_store.save_state(_ssh_state(tmp_path, "future"))
    data = json.loads(path.read_text())
    data["format"] = 3
    data["something_new"] = {"x": 1}
    text = json.dumps(data)
    path.write_text(text)
    for read in (record_store.find, record_store.load_state, record_store.backend_of):
        with pytest.raises(record.RecordFormatError) as err:
            read("future")
        assert str(path) in str(err.value) and "format 3" in str(err.value)
        assert "newer pdlaunch" in str(err.value)
    with pytest.raises(record.RecordFormatError):
        record_store.save_state(_ssh_state(tmp_path, "future"))  # never overwritten
    assert path.read_text() == text


def test_a_record_of_the_other_backend_is_refused(tmp_path: Path) -> None:
    slurm_record.save_slurm(slurm_record.record_of(_plan(tmp_path, "other"), "13"))
    with pytest.raises(record.OtherBackendError, match="Slurm job 13"):
        record_store.load_state("other")
    with pytest.raises(record.RecordError, match="not overwritten"):
        record_store.save_state(_ssh_state(tmp_path, "other"))
    assert slurm_record.load_slurm("other").job_id == "13"


def test_damaged_ambiguous_and_missing_records(tmp_path: Path, state_dir: Path) -> None:
    assert record_store.find("nothing") is None
    plan = _plan(tmp_path, "both")
    legacy_slurm(slurm_record.record_of(plan, "5"))
    legacy_state(unrecorded_state(plan))
    with pytest.raises(record.RecordError, match="--backend ssh or --backend slurm"):
        record_store.find("both")
    assert record_store.find("both", "slurm", place=False).backend == "slurm"
    assert record_store.find("both", "ssh").backend == "ssh"
    # A record of one is not written beside the other's format-1 file (it would hide it).
    with pytest.raises(record.RecordError, match="--backend slurm` first"):
        record_store.save_state(record_store.load_state("both"))

    (state_dir / "bad").mkdir()
    (state_dir / "bad" / "slurm.json").write_text('{"backend": "slurm", "job_id": 1}')
    with pytest.raises(record.RecordError, match="Nothing was cancelled or deleted"):
        record_store.find("bad", place=False)
    found = list(record_store.find_all())
    assert sorted(r.backend for r in found if isinstance(r, record.Record)) == ["slurm", "ssh"]
    errors = [str(e) for e in found if isinstance(e, record.RecordError)]
    assert len(errors) == 1 and errors[0].startswith("the Slurm record"), errors


def test_a_slurm_that_does_not_answer_leaves_the_job_unplaced_and_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Slurm client on this host: the record is found, nothing placed, and the doctor
    says "unknown" (never "dead": nothing was proven)."""
    from pdlaunch.backends.slurm.doctor import slurm_running

    plan = _plan(tmp_path, "noslurm")
    slurm_record.save_slurm(slurm_record.record_of(plan, "77"))
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rec = record_store.find("noslurm")
    assert rec is not None and isinstance(rec.handle, record.SlurmHandle)
    assert rec.handle.job_state == "UNKNOWN" and "squeue not found" in rec.handle.job_detail
    assert rec.endpoint is None and all(p.health_url is None for p in rec.processes)
    running = slurm_running(rec)
    assert {v[0] for v in running.values()} == {"unknown"}, running
    assert "job 77 is UNKNOWN (squeue not found" in running["router"][1]
