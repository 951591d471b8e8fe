"""A deployment recorded by the pdlaunch before format 2 (``state.json``, format 1) is found,
status'd, its logs read and stopped by this one, over a real sshd (tests/sshd.py).

The record is tests/fixtures/record/state-format1.json.tmpl: the file a real `up` over sshd
wrote then (see its README), with this run's values put in (its paths, ports, the pids of
processes this test starts). So the reading side is judged against what the old writer really
wrote, not against a file written by the code under test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pdlaunch.runtime import record_store
from pdlaunch.runtime.state import deployment_dir
from tests.support.deployments import cli
from tests.support.processes import procs_under, wait_no_procs

pytestmark = pytest.mark.ssh

TEMPLATE = Path(__file__).resolve().parents[2] / "fixtures" / "record" / "state-format1.json.tmpl"
NAME = "legacy-ssh"  # the fixture's deployment (its paths name it)


def _format1_record(tmp_path: Path, cluster, host, fake_bins) -> str:
    """The fixture with this run's values: the processes `up` just started (their pids,
    start times and ports as recorded), this test's dirs, the sshd's port, user and key."""
    rec = record_store.find(NAME)
    assert rec is not None
    values = {
        "@TMP@": str(tmp_path),
        "@SSHD@": str(Path(cluster.key_file).parent.parent),
        "@FAKEBIN@": str(Path(fake_bins["vllm"]).parent),
        "@USER@": cluster.user,
        "@SSH_PORT@": str(host.port),
    }
    for p in rec.processes:
        values[f"@PID:{p.name}@"] = str(p.pid)
        values[f"@START:{p.name}@"] = str(p.start_time)
        for i, port in enumerate(p.handle.ports):
            values[f"@PORT{i}:{p.name}@"] = str(port)
    text = TEMPLATE.read_text()
    text = re.sub(r"@[A-Za-z0-9_:.-]+@", lambda m: values[m.group(0)], text)
    assert Path(cluster.key_file) == Path(values["@SSHD@"]) / "client" / "id_ed25519"
    return text


def test_a_format_1_ssh_deployment_is_found_statused_and_stopped(
    make_deployment, sshd_cluster, sshd_host, fake_bins, tmp_path
):
    ssh = {"user": sshd_cluster.user, "port": sshd_host.port,
           "key": str(sshd_cluster.key_file), "connect_timeout": 5}  # fmt: skip
    dep = make_deployment(NAME, ssh=ssh)
    res = cli("up", dep.path, "--timeout", "120", "--known-hosts", sshd_cluster.known_hosts)
    assert res.exit_code == 0, res.output
    pids = sorted(procs_under(dep.work_root))
    assert pids

    # What the old pdlaunch would have left on disk for this deployment: state.json only.
    old = _format1_record(tmp_path, sshd_cluster, sshd_host, fake_bins)
    assert json.loads(old)["format"] == 1
    (deployment_dir(NAME) / "record.json").unlink()
    legacy = deployment_dir(NAME) / "state.json"
    legacy.write_text(old)

    res = cli("status", "--json")  # found with no name: the only deployment recorded
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["deployment"] == NAME and data["backend"] == "ssh"
    rows = {r["process"]: r for r in data["processes"]}
    assert set(rows) == {"prefill-0", "decode-0", "router"}
    assert all(r["alive"] and r["health"] == "healthy" for r in rows.values()), rows
    # the pids the old record holds, each verified alive on its host
    recorded = {p["pid"] for p in json.loads(old)["processes"]}
    assert {r["pid"] for r in rows.values()} == recorded and recorded <= set(pids)
    res = cli("logs", NAME, "router")
    assert res.exit_code == 0 and "serving on" in res.output, res.output
    assert legacy.read_text() == old  # reading changes nothing

    res = cli("down", NAME)
    assert res.exit_code == 0, res.output
    assert "3 process(es) stopped" in res.output
    assert wait_no_procs(dep.work_root) == []
    # Proven gone, so forgotten: in neither format.
    assert not legacy.exists() and not (deployment_dir(NAME) / "record.json").exists()
    assert record_store.list_deployments() == []


def test_up_over_a_format_1_record_sees_what_runs_and_replaces_it_in_format_2(
    make_deployment, sshd_cluster, sshd_host, fake_bins, tmp_path
):
    """`up` of the topology over the old record: what runs is seen, never started twice (the
    recorded scripts differ: the fixture's hashes are of the captured run's); with --replace
    the old processes are stopped through the old record, and the new ones recorded in
    format 2, the old file gone."""
    ssh = {"user": sshd_cluster.user, "port": sshd_host.port,
           "key": str(sshd_cluster.key_file), "connect_timeout": 5}  # fmt: skip
    dep = make_deployment(NAME, ssh=ssh)
    known = ("--known-hosts", sshd_cluster.known_hosts)
    res = cli("up", dep.path, "--timeout", "120", *known)
    assert res.exit_code == 0, res.output
    before = set(procs_under(dep.work_root))
    old = _format1_record(tmp_path, sshd_cluster, sshd_host, fake_bins)
    (deployment_dir(NAME) / "record.json").unlink()
    legacy = deployment_dir(NAME) / "state.json"
    legacy.write_text(old)

    res = cli("up", dep.path, "--timeout", "120", *known)
    assert res.exit_code == 1, res.output
    assert "already running (3 process(es) alive)" in " ".join(res.output.split())
    assert legacy.read_text() == old and set(procs_under(dep.work_root)) == before

    res = cli("up", dep.path, "--timeout", "120", "--replace", *known)
    assert res.exit_code == 0, res.output
    assert not legacy.exists()
    data = json.loads((deployment_dir(NAME) / "record.json").read_text())
    assert data["format"] == 2 and data["backend"] == "ssh"
    now = {p["pid"] for p in data["processes"]}
    assert now.isdisjoint(before) and not before & set(procs_under(dep.work_root))

    res = cli("down", NAME)
    assert res.exit_code == 0, res.output
    assert wait_no_procs(dep.work_root) == []
    assert record_store.list_deployments() == []
