"""`down` never leaves a container of the deployment running (issue 32, class 1), and a record
cannot point it at another deployment's container (class 2), against the real rootful podman
(scripts/install.sh) with `sleep` containers of the test image (scripts/container-image.sh),
started as pdlaunch's process script starts them (`podman run` in the foreground, its name,
labels and --cidfile, its log as stdout), on the local host.

The case of the issue: every `podman run` client killed -9 (or a host rebooted into a running
container) leaves no live pid; `down` used to answer "0 process(es) stopped", delete the
record and leave the containers running."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdlaunch.backends.ssh.records import unrecorded_state
from pdlaunch.plan.build import build_plan
from pdlaunch.runtime import record_store
from pdlaunch.runtime.state import DeploymentState
from tests.support.deployments import Deployment, cli

IMAGE = "localhost/pdlaunch-engine:test"
TRACEBACK = "Traceback (most recent call last)"


def podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.fixture(scope="module")
def ready() -> None:
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip("needs rootful podman (scripts/install.sh; CI runs as root)")
    if podman("image", "exists", IMAGE).returncode != 0:
        pytest.skip(f"{IMAGE} is missing (scripts/container-image.sh)")


def labelled(deployment: str) -> dict[str, str]:
    """name -> state of every container carrying the deployment's label."""
    res = podman("ps", "-a", "--format", "json", "--filter",
                 f"label=pdlaunch.deployment={deployment}")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return {c["Names"][0]: c["State"] for c in json.loads(res.stdout or "[]")}


@pytest.fixture
def names(ready: None) -> Iterator[list[str]]:
    """Deployment names of this test; every container of theirs is removed afterwards."""
    made: list[str] = []
    yield made
    for dep in made:
        for c in podman("ps", "-a", "-q", "--filter", f"name=pdl-{dep}-").stdout.split():
            podman("rm", "-f", "-t", "0", c)
        mine = podman("ps", "-a", "-q", "--filter", f"label=pdlaunch.deployment={dep}")
        for c in mine.stdout.split():
            podman("rm", "-f", "-t", "0", c)


def in_containers(
    make_deployment, names: list[str], stem: str, *, ssh: tuple[Any, Any, Path] | None = None
) -> tuple[Deployment, DeploymentState]:
    """The 1P1D stand-in topology with its engines in podman containers (the router on the
    host), planned; nothing started yet. ``ssh``: (sshd cluster, host, tmp dir): the host is
    a real sshd on this machine, reached over SSH."""
    from pdlaunch.spec.load import load

    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    names.append(name)
    if ssh is None:
        dep = make_deployment(name)
        known = None
    else:
        cluster, h, tmp = ssh
        known = str(cluster.write_known_hosts(tmp / "known_hosts", hosts=[h]))
        dep = make_deployment(name, host=h.host, ssh={
            "user": cluster.user, "port": h.port, "key": str(cluster.key_file),
            "connect_timeout": 3,
        })  # fmt: skip
    dep.spec["defaults"]["container"] = {"image": IMAGE, "runtime": "podman",
                                         "mounts": ["/usr:/usr:ro"]}  # fmt: skip
    dep.spec["router"]["container"] = {"enabled": False}
    dep.write()
    state = unrecorded_state(build_plan(load(dep.path)[0]), status="up")
    state.topology = str(dep.path)
    state.known_hosts = known  # as `up --known-hosts` records it
    return dep, state


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def run_client(ref: dict[str, str], log: str, cwd: str) -> subprocess.Popen:
    """`podman run` in the foreground as the process script execs it, its log as stdout."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    Path(ref["cid_path"]).parent.mkdir(parents=True, exist_ok=True)
    argv = ["podman", "run", "--rm", "--pull=never", "--name", ref["name"],
            "--cidfile", ref["cid_path"], "--label", f"pdlaunch.deployment={ref['deployment']}",
            "--label", f"pdlaunch.process={ref['process']}", "--net=host",
            "-v", "/usr:/usr:ro", IMAGE, "/usr/bin/sleep", "600"]  # fmt: skip
    with open(log, "ab") as out:
        client = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                  stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while labelled(ref["deployment"]).get(ref["name"]) != "running":
        assert client.poll() is None, Path(log).read_text()
        assert time.monotonic() < deadline, "the container did not start"
        time.sleep(0.2)
    return client


def detached(deployment: str, name: str, process: str, *, label: bool = True) -> str:
    """A container started apart from any record (`podman run -d`)."""
    argv = ["run", "-d", "--name", name, "--net=host", "-v", "/usr:/usr:ro"]
    if label:
        argv += ["--label", f"pdlaunch.deployment={deployment}",
                 "--label", f"pdlaunch.process={process}"]  # fmt: skip
    res = podman(*argv, IMAGE, "/usr/bin/sleep", "600")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def start_engines(state: DeploymentState) -> dict[str, subprocess.Popen]:
    """Each engine's container started by its client, recorded as `up` records it."""
    clients = {}
    for ps in state.processes:
        if ps.container is None:
            continue
        client = run_client(ps.container, ps.log_path, ps.work_dir)
        ps.pid, ps.start_time = client.pid, start_time(client.pid)
        clients[ps.name] = client
    record_store.save_state(state)
    return clients


def kill9(clients: dict[str, subprocess.Popen]) -> None:
    for c in clients.values():
        os.kill(c.pid, signal.SIGKILL)
        c.wait()


def status_rows(deployment: str) -> dict[str, dict[str, Any]]:
    res = cli("status", deployment, "--json")
    return {r["process"]: r for r in json.loads(res.output)["processes"]}


@pytest.mark.parametrize("over", ["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def test_down_removes_containers_whose_clients_are_all_gone(
    make_deployment, names, over: str, request, tmp_path: Path
) -> None:
    ssh = None
    if over == "ssh":
        ssh = (request.getfixturevalue("sshd_cluster"), request.getfixturevalue("sshd_host"),
               tmp_path)  # fmt: skip
    dep, state = in_containers(make_deployment, names, "orphans", ssh=ssh)
    assert all(p.local is (ssh is None) for p in state.processes)
    kill9(start_engines(state))
    engines = {f"pdl-{dep.name}-prefill-0", f"pdl-{dep.name}-decode-0"}
    assert labelled(dep.name) == dict.fromkeys(engines, "running")

    rows = status_rows(dep.name)  # the truth: no client, the container runs
    for name in ("prefill-0", "decode-0"):
        assert rows[name]["container"] == "running", rows[name]
        assert rows[name]["alive"] is True
        assert rows[name]["health"].startswith("container running without its client"), rows

    t0 = time.monotonic()
    res = cli("down", dep.name, "--grace", "1")  # `sleep` as a container's pid 1 ignores TERM
    took = time.monotonic() - t0
    assert res.exit_code == 0, res.output
    assert "2 container(s) removed" in res.output, res.output
    assert labelled(dep.name) == {}, "a container outlived down"
    assert record_store.locate(dep.name) is None  # forgotten only once proven gone
    assert not list(dep.work_dir.glob("run/*.cid"))
    print(f"\n[containers] down of 2 client-less containers ({over}): {took:.1f}s")


def test_down_finds_the_deployments_containers_by_their_labels(make_deployment, names) -> None:
    """Containers of the deployment the record does not name (a process since removed from
    the topology, a record rewritten without it) are found by pdlaunch's labels, shown by
    `status` and removed by `down`; a container with the label but not pdlaunch's name for
    it, one with the name but no label, and another deployment's, are left."""
    dep, state = in_containers(make_deployment, names, "labels")
    kill9(start_engines(state))
    other = f"other-{uuid.uuid4().hex[:6]}"
    names.append(other)
    gone = detached(dep.name, f"pdl-{dep.name}-decode-1", "decode-1")
    strangers = {
        detached(dep.name, f"someone-{uuid.uuid4().hex[:6]}", "decode-0"),  # not our name
        detached(other, f"pdl-{other}-decode-0", "decode-0"),  # another deployment's
        detached(dep.name, f"pdl-{dep.name}-x-{uuid.uuid4().hex[:4]}", "decode-0", label=False),
    }
    rows = status_rows(dep.name)  # status shows what down will remove, and only that
    extra = {n: r for n, r in rows.items() if n not in ("prefill-0", "decode-0", "router")}
    assert list(extra) == [f"decode-1 (container {gone[:12]})"], rows
    row = extra[f"decode-1 (container {gone[:12]})"]
    assert row["container"] == "running" and row["alive"] is True
    assert "its record does not name" in row["health"]

    res = cli("down", dep.name, "--grace", "1")
    assert res.exit_code == 0, res.output
    assert "3 container(s) removed" in res.output, res.output
    assert podman("container", "exists", gone).returncode == 1
    for cid in strangers:
        assert podman("container", "exists", cid).returncode == 0, cid
    assert set(labelled(dep.name)) == {n for n in labelled(dep.name) if "someone-" in n}


def test_a_record_cannot_point_down_at_another_deployments_container(
    make_deployment, names
) -> None:
    """Our decode's container.cid_path names the cid file of another deployment (its
    container running): `down` would remove that container and delete its cid file."""
    dep, state = in_containers(make_deployment, names, "ours")
    _, victim_state = in_containers(make_deployment, names, "victim")
    victim = victim_state.process("decode-0")
    assert victim is not None and victim.container is not None
    victim_client = run_client(victim.container, victim.log_path, victim.work_dir)
    victim_cid = Path(victim.container["cid_path"]).read_text().strip()
    clients = start_engines(state)
    try:
        path = record_store.record_path(dep.name)
        data = json.loads(path.read_text())
        decode = next(p for p in data["processes"] if p["name"] == "decode-0")
        decode["handle"]["container"]["cid_path"] = victim.container["cid_path"]
        path.write_text(json.dumps(data))
        res = cli("down", dep.name)
        assert podman("container", "exists", victim_cid).returncode == 0, res.output
        assert Path(victim.container["cid_path"]).exists()
        assert res.exit_code != 0 and TRACEBACK not in res.output
        assert "container.cid_path" in res.output and "is damaged" in res.output, res.output
    finally:
        for c in [victim_client, *clients.values()]:
            c.kill()
            c.wait()
