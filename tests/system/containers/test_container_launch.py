"""`up`/`status`/`down` with engines in real rootful podman containers, the engines being the
launch tests' stand-in (tests/support/fake_vllm.py: starts in a second, serves health, metrics
and the canary's disaggregation counters), so every container guarantee is checked in
seconds: the engine runs in its named, labelled container; `status` sees a container whose
`podman run` client was killed -9; `down` removes exactly pdlaunch's containers and proves
them gone; a container exiting at once fails `up` with its log and leaves nothing; a name
another container holds fails `up` without touching that container; a missing image fails the
preflight, naming node and image; a kill -9 of pdlaunch mid-start leaves `down` able to remove
everything. The real vLLM in containers: test_container_pd.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.fake_bins import FAKES

IMAGE = "localhost/pdlaunch-engine:test"
PDLAUNCH = [sys.executable, "-m", "pdlaunch"]
ROOT = Path(__file__).resolve().parents[3]


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


@pytest.fixture(scope="module", autouse=True)
def ready() -> None:
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip("needs rootful podman (scripts/install.sh; CI runs as root)")
    if _podman("image", "exists", IMAGE).returncode != 0:
        pytest.skip(f"{IMAGE} is missing (scripts/container-image.sh)")


def _containers(deployment: str) -> list[dict[str, Any]]:
    res = _podman(
        "ps", "-a", "--format", "json", "--filter", f"label=pdlaunch.deployment={deployment}"
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout or "[]")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dep:
    def __init__(self, tmp: Path, **container: Any) -> None:
        self.name = f"ctr-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp
        python = os.path.realpath(sys.executable)  # under the base prefix, mounted below
        bins = tmp / "bin"
        bins.mkdir(exist_ok=True)
        self.fake = bins / "fake-vllm"
        body = (FAKES / "fake_vllm.py").read_text().split("\n", 1)[1]
        self.fake.write_text(f"#!{python} -S\n{body}")
        self.fake.chmod(0o755)
        router = bins / "fake-router"
        router.write_text(
            f"#!{python} -S\n" + (FAKES / "fake_router.py").read_text().split("\n", 1)[1]
        )
        router.chmod(0o755)
        base = os.path.realpath(sys.base_prefix)
        ports = [_free_port() for _ in range(4)]
        self.decode_url = f"http://127.0.0.1:{ports[1]}"
        spec = {
            "deployment": self.name,
            "model": {"name": "fake-model"},
            "defaults": {
                "work_dir": str(tmp / "work"),
                "vllm_bin": str(self.fake),
                "container": {
                    "image": IMAGE,
                    "runtime": "podman",
                    "mounts": ["/usr:/usr:ro", f"{base}:{base}:ro", f"{bins}:{bins}:ro"],
                    **container,
                },
            },
            "prefill": [{"host": "127.0.0.1", "bind": "127.0.0.1", "device": "cpu",
                         "port": ports[0]}],
            "decode": [{"host": "127.0.0.1", "bind": "127.0.0.1", "device": "cpu",
                        "port": ports[1]}],
            "kv_connector": {"side_channel_port": ports[2]},
            "router": {"host": "127.0.0.1", "bind": "127.0.0.1", "port": ports[3],
                       "binary": str(router), "container": {"enabled": False}},
        }  # fmt: skip
        self.topology = tmp / f"{self.name}.yaml"
        self.topology.write_text(yaml.safe_dump(spec))
        self.env = {**os.environ, "PDLAUNCH_STATE_DIR": str(tmp / "state")}

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*PDLAUNCH, *args], env=self.env, cwd=ROOT, capture_output=True, text=True,
            timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def status(self) -> dict[str, dict[str, Any]]:
        st = self.cli("status", str(self.topology), "--json")
        return {r["process"]: r for r in json.loads(st.stdout)["processes"]}

    def cleanup(self) -> None:
        self.cli("down", str(self.topology))
        for c in _containers(self.name):
            _podman("rm", "-f", "-t", "0", c["Id"])


@pytest.fixture
def make(tmp_path: Path):
    made: list[Dep] = []

    def build(**container: Any) -> Dep:
        d = Dep(tmp_path, **container)
        made.append(d)
        return d

    yield build
    for d in made:
        d.cleanup()


def _engine_pids(d: Dep) -> list[int]:
    """Host pids of fake engines of this deployment (inside containers or not)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(d.fake).encode() in cmd and b"podman" not in cmd:
                out.append(int(entry.name))
    return out


def test_up_status_down_with_engines_in_containers(make) -> None:
    d = make()
    up = d.cli("up", str(d.topology), "--json", "--skip-check")
    assert up.returncode == 0, up.stdout + up.stderr
    assert json.loads(up.stdout)["canary"]["ok"]
    running = {c["Names"][0]: c for c in _containers(d.name)}
    assert set(running) == {f"pdl-{d.name}-prefill-0", f"pdl-{d.name}-decode-0"}
    assert all(c["State"] == "running" for c in running.values())
    c = running[f"pdl-{d.name}-decode-0"]
    assert (
        c["Labels"]["pdlaunch.process"] == "decode-0" and c["Labels"]["pdlaunch.role"] == "decode"
    )
    # The engine inside runs in its own pid namespace (it is in the container).
    pid = int(_podman("inspect", "--format", "{{.State.Pid}}", c["Id"]).stdout)
    assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    assert str(d.fake).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()

    # kill -9 the decode's `podman run` client: the container runs on, and status says so.
    rows = d.status()
    assert rows["decode-0"]["container"] == "running"
    client = rows["decode-0"]["pid"]
    assert b"podman" in Path(f"/proc/{client}/cmdline").read_bytes()
    os.kill(client, signal.SIGKILL)
    for _ in range(100):
        if not Path(f"/proc/{client}").exists():
            break
        time.sleep(0.1)
    row = d.status()["decode-0"]
    assert row["alive"] is True and row["container"] == "running", row
    assert row["health"] == "container running without its client; healthy", row

    t = time.monotonic()
    down = d.cli("down", str(d.topology))
    took = time.monotonic() - t
    assert down.returncode == 0, down.stdout + down.stderr
    assert _containers(d.name) == [], "a container outlived down"
    assert _engine_pids(d) == []
    assert not list((d.tmp / "work").glob("*/run/*.cid"))
    print(f"\n[containers] down with a client-less container: {took:.1f}s")


def test_a_container_that_exits_at_once_fails_up_and_leaves_nothing(make) -> None:
    d = make()
    spec = yaml.safe_load(d.topology.read_text())
    spec["decode"][0]["env"] = {"FAKE_VLLM_MODE": "exit"}
    d.topology.write_text(yaml.safe_dump(spec))
    up = d.cli("up", str(d.topology), "--json", "--skip-check")
    assert up.returncode != 0
    out = json.loads(up.stdout)
    assert "decode-0" in out["error"], out
    assert _containers(d.name) == [] and _engine_pids(d) == []


def test_a_name_someone_else_holds_fails_up_and_their_container_is_left_alone(make) -> None:
    d = make()
    stranger = f"pdl-{d.name}-decode-0"
    made = _podman("run", "-d", "--name", stranger, "--net=host", "-v", "/usr:/usr:ro", IMAGE,
                   "/usr/bin/sleep", "300")  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        up = d.cli("up", str(d.topology), "--json", "--skip-check")
        assert up.returncode != 0
        assert "already in use" in up.stdout, up.stdout[-3000:]
        down = d.cli("down", str(d.topology))
        assert down.returncode == 0, down.stdout + down.stderr
        assert _containers(d.name) == []  # ours: none left
        st = _podman("inspect", "--format", "{{.State.Status}}", stranger)
        assert st.stdout.strip() == "running", "pdlaunch touched a container it did not start"
    finally:
        _podman("rm", "-f", "-t", "0", stranger)
    assert _engine_pids(d) == []


def test_a_missing_image_is_a_preflight_failure_naming_node_and_image(make) -> None:
    d = make(image="localhost/pdlaunch-absent:0")
    t = time.monotonic()
    up = d.cli("up", str(d.topology), "--json", "--skip-check")
    assert up.returncode != 0
    err = json.loads(up.stdout)["error"]
    assert "localhost/pdlaunch-absent:0" in err and "localhost" in err, err
    assert time.monotonic() - t < 60
    assert _containers(d.name) == [] and _engine_pids(d) == []
    assert not list((d.tmp / "work").glob("*/logs/*.log")), "something started"


def test_kill_9_of_pdlaunch_mid_start_then_down_removes_everything(make) -> None:
    d = make()
    spec = yaml.safe_load(d.topology.read_text())
    # The engines take a while to listen: pdlaunch is killed while it waits for them.
    spec["defaults"]["env"] = {"FAKE_VLLM_DELAY": "30"}
    d.topology.write_text(yaml.safe_dump(spec))
    proc = subprocess.Popen([*PDLAUNCH, "up", str(d.topology), "--skip-check"], env=d.env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len([c for c in _containers(d.name) if c["State"] == "running"]) < 2:
            assert proc.poll() is None, f"up ended ({proc.returncode}) before both containers ran"
            assert time.monotonic() < deadline, "the containers never ran"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert len(_containers(d.name)) == 2
    down = d.cli("down", str(d.topology))
    assert down.returncode == 0, down.stdout + down.stderr
    assert _containers(d.name) == [] and _engine_pids(d) == []


def test_the_images_entrypoint_does_not_run_before_the_engine(make) -> None:
    # vllm/vllm-openai sets ENTRYPOINT ["vllm", "serve"]: `run IMAGE vllm serve ...` would run
    # `vllm serve vllm serve ...`. The plan's argv replaces the entrypoint (--entrypoint), so an
    # image whose entrypoint fails at once still runs the engine.
    tag = f"localhost/pdlaunch-entrypoint:{uuid.uuid4().hex[:8]}"
    made = _podman("create", "--entrypoint", '["/usr/bin/false"]', IMAGE)
    assert made.returncode == 0, made.stderr
    try:
        assert _podman("commit", "-q", made.stdout.strip(), tag).returncode == 0
    finally:
        _podman("rm", "-f", made.stdout.strip())
    try:
        d = make(image=tag)
        up = d.cli("up", str(d.topology), "--json", "--skip-check")
        assert up.returncode == 0, up.stdout + up.stderr
        assert json.loads(up.stdout)["canary"]["ok"]
        assert d.cli("down", str(d.topology)).returncode == 0
        assert _containers(d.name) == []
    finally:
        _podman("rmi", "-f", tag)
