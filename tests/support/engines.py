"""The processes of the engine tests (tests/system/engines/test_cpu_pd.py,
tests/system/netns/test_netns_pd.py, tests/system/slurm/test_slurm_cpu_pd.py): the tiny model,
one plain vLLM instance for reference outputs, free ports, the pdlaunch CLI as a subprocess,
and what is left in /proc."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdlaunch.kv import progress
from pdlaunch.observe.health import probe
from tests.support.engine_requests import SERVED, complete

REPO = Path(__file__).resolve().parents[2]
LOCAL_CPU = REPO / "topologies" / "local-cpu.yaml"
BIN = Path(sys.executable).parent
PDLAUNCH = [sys.executable, "-m", "pdlaunch"]
PLAIN_HEALTH_TIMEOUT = 600.0
TINY_MODEL_SCRIPT = REPO / "tests" / "support" / "tiny_model.py"
# The line each engine's log gets when the topology's NIXL progress-thread poll delay
# (kv_connector.progress_delay_us, on by default for CPU instances) reached its NIXL agent.
NIXL_PROGRESS_DELAY_MARK = progress.MARK


# -- the model --------------------------------------------------------------------------------
def tiny_model(path: Path) -> Path:
    """The tiny random-weight model (tests/support/tiny_model.py) in ``path``; skips the test when
    this venv has no engine to serve it."""
    for tool in ("vllm", "vllm-router"):
        if not (BIN / tool).exists():
            pytest.skip(f"{tool} not installed in this venv (scripts/install-node-cpu.sh)")
    # A child process, not an import: the builder sets HF_HUB_OFFLINE in its own environment
    # (and huggingface_hub reads it once, at import), which in pytest's process made every later
    # in-process vLLM argv parse (the fidelity judge) look up its model offline and fail.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run(
        [sys.executable, str(TINY_MODEL_SCRIPT), str(path)], env=env, capture_output=True,
        text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if res.returncode != 0:
        pytest.fail(f"building the tiny model failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return path


def write_topology(src: Path, dst: Path, **changes: Any) -> dict[str, Any]:
    """Copy topology ``src`` to ``dst`` with dotted-path changes ("prefill.0.port": 8100)."""
    data = yaml.safe_load(src.read_text())
    data.setdefault("defaults", {}).setdefault("env", {})
    for dotted, value in changes.items():
        node = data
        keys = dotted.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[keys[-1]] = value
    dst.write_text(yaml.safe_dump(data, sort_keys=False))
    return data


# -- ports and environment --------------------------------------------------------------------
def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port_block(n: int, address: str = "127.0.0.1") -> int:
    """A base port such that base..base+n-1 are all free on ``address``, below the kernel's
    ephemeral range: a port in that range can be given to any outgoing connection between
    this check and the deployment's bind (seen: the router's port taken minutes later, its
    start failing with "Address already in use")."""
    rng = random.Random()
    top = min(60000, _ephemeral_low()) - n
    for _ in range(500):
        base = rng.randrange(10000, top)
        try:
            for port in range(base, base + n):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((address, port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no block of {n} free ports on {address}")


def engine_env(state_root: Path) -> dict[str, str]:
    """This environment for pdlaunch and the engines: the venv's tools on PATH, pdlaunch's
    state under ``state_root``, no Hugging Face downloads, no proxy for local addresses."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PDLAUNCH_STATE_DIR"] = str(state_root / "state")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env.pop(var, None)
    return env


# -- the plain reference instance ---------------------------------------------------------------
@dataclass(frozen=True)
class PlainReference:
    outputs: dict[tuple[int, ...], list[int]]
    healthy_s: float
    total_s: float


def plain_reference(
    model: Path,
    wd: Path,
    env: dict[str, str],
    prompts: Sequence[list[int]],
    *,
    port: int,
    host: str = "127.0.0.1",
    wrap: Sequence[str] = (),
    dtype: str = "float32",  # as topologies/local-cpu.yaml (AMX: a bf16 decode dies)
    block_size: int = 32,
) -> PlainReference:
    """Start one plain instance (the topologies' engine settings, no KV connector) with
    ``wrap`` before its argv (e.g. ``ip netns exec NS``), answer every prompt, stop it. Its
    log is ``wd``/plain.log."""
    wd.mkdir(parents=True, exist_ok=True)
    log = wd / "plain.log"
    penv = dict(env)
    penv.update(
        VLLM_CPU_OMP_THREADS_BIND="0",
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    argv = [
        *wrap, str(BIN / "vllm"), "serve", str(model),
        "--host", host, "--port", str(port),
        "--served-model-name", SERVED,
        "--tensor-parallel-size", "1",
        "--dtype", dtype,
        "--max-model-len", "1024",
        "--block-size", str(block_size),
        "--no-enable-prefix-caching",
        "--enforce-eager",
    ]  # fmt: skip
    t0 = time.monotonic()
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            argv, env=penv, cwd=wd, stdout=fh, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        url = f"http://{host}:{port}"
        healthy = _wait_healthy(url + "/health", proc, PLAIN_HEALTH_TIMEOUT, log)
        outputs = {
            tuple(p): complete(url, p, f"plain, prompt {i} ({len(p)} tokens)")
            for i, p in enumerate(prompts)
        }
    finally:
        stop_group(proc)
    return PlainReference(outputs, healthy, time.monotonic() - t0)


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            pytest.fail(f"plain vLLM exited with {proc.returncode} before healthy:\n{tail}")
        if probe(url, timeout=5).ok:
            return time.monotonic() - t0
        time.sleep(1)
    pytest.fail(f"plain vLLM not healthy after {timeout:g}s ({url})")


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process group ``proc`` leads (its own session), SIGKILL after ``grace``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (EngineCore)
    proc.wait(10)


# -- the pdlaunch CLI ---------------------------------------------------------------------------
def run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def canary_timed_out(up_stdout: str) -> bool:
    """`up --json` failed because its canary request timed out (and rolled back)."""
    try:
        data = json.loads(up_stdout)
    except ValueError:
        return False
    error = str(data.get("error", ""))
    return data.get("rolled_back") is True and "canary request" in error and "timed out" in error


def up_with_retry(
    argv: list[str], env: dict[str, str], timeout: float, on_retry: Callable[[], None]
) -> subprocess.CompletedProcess:
    """`pdlaunch up` (``argv``), once more with --skip-check if its canary timed out.

    The known NIXL/router stall on a loaded 2-core box (docs/cpu-pd-recipe.md, gotcha 7) can
    outlast the canary; a timeout is not a wrong answer and `up` rolled everything back. A
    canary that *answered* wrongly (not disaggregated) is never retried."""
    up = run(argv, env, timeout)
    if up.returncode != 0 and canary_timed_out(up.stdout):
        on_retry()
        up = run([*argv, "--skip-check"], env, timeout)
    return up


_DIGEST = ("WARN", "ERROR", "rror", "POST", "xpired", "nvalid", "kv_transfer", "handshake",
           "Traceback")  # fmt: skip


def log_digest(work_dir: Path, lines: int = 25) -> str:
    """Interesting lines of every deployment log under ``work_dir`` (kept in a failure
    message: pytest's tmp dirs are reaped by later runs)."""
    parts = []
    for log in sorted(work_dir.glob("*/logs/*.log")):
        text = log.read_text(errors="replace").splitlines()
        hits = [ln[:300] for ln in text if any(k in ln for k in _DIGEST) and "Route:" not in ln]
        parts.append(f"--- {log.name} ({len(text)} lines) ---\n" + "\n".join(hits[-lines:]))
    return "\n".join(parts)


# -- what is left -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Proc:
    pid: int
    comm: str
    cwd: str
    cmdline: str

    def describe(self) -> str:
        return f"{self.pid} {self.comm} cwd={self.cwd} cmd={self.cmdline[:160]}"

    @property
    def is_engine(self) -> bool:
        """vLLM (API server, EngineCore, workers) or vllm-router."""
        return "vllm" in self.cmdline.lower() or self.comm.startswith("VLLM::")


def busiest_threads(pids: Iterable[int], seconds: float = 3.0) -> list[tuple[float, str]]:
    """(share of one core, "pid/tid name") of every thread of ``pids`` over ``seconds``,
    busiest first (utime + stime from /proc/PID/task/TID/stat)."""
    pids = list(pids)

    def ticks() -> dict[str, tuple[int, str]]:
        out = {}
        for pid in pids:
            with contextlib.suppress(OSError):
                for task in Path(f"/proc/{pid}/task").iterdir():
                    with contextlib.suppress(OSError, ValueError, IndexError):
                        stat = (task / "stat").read_text()
                        name = stat[stat.index("(") + 1 : stat.rindex(")")]
                        fields = stat[stat.rindex(")") + 2 :].split()
                        out[f"{pid}/{task.name}"] = (int(fields[11]) + int(fields[12]), name)
        return out

    before = ticks()
    time.sleep(seconds)
    after = ticks()
    hz = os.sysconf("SC_CLK_TCK")
    shares = [
        ((t - before[key][0]) / hz / seconds, f"{key} {name}")
        for key, (t, name) in after.items()
        if key in before
    ]
    return sorted(shares, reverse=True)


def processes_under(roots: Iterable[str]) -> list[Proc]:
    """Processes but this one (of any namespace: the root one's /proc sees them all) whose
    cwd or command line refers to one of ``roots``."""
    roots = list(roots)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            cwd = ""
        if any(r in cwd or r in cmdline for r in roots):
            found.append(Proc(int(entry.name), comm, cwd, cmdline))
    return found
