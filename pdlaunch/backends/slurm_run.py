"""Running a deployment as a Slurm job from the control host: submit, wait for health, the PD
canary, status, logs, down.

The job's files go where the plan puts them (each process's work dir): the nodes must see
them at the same paths (a shared file system), as the driver runs them there. The record of
the job is ``<state dir>/<deployment>/slurm.json`` (beside the SSH backend's state.json), so
`status`, `logs` and `down` work from another shell. Slurm is driven only through its own
commands (sbatch, squeue, sacct, scontrol, scancel), with the environment's ``SLURM_CONF``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pdlaunch import health
from pdlaunch.backends import slurm
from pdlaunch.fsutil import atomic_write
from pdlaunch.launch.readiness import Outcome, wait_until
from pdlaunch.plan import Plan, Process
from pdlaunch.render import render_secrets
from pdlaunch.state import (
    SLURM_RECORD_FILE,
    STATE_FILE,
    DeploymentLock,
    StateError,
    deployment_dir,
)

FORMAT = 1
# Job states in which the job still holds (or waits for) its nodes.
ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)
GONE = "GONE"  # neither squeue nor sacct knows the job any more


class SlurmRunError(Exception):
    """A Slurm command failed or the job did not come up; the message is for users."""


# -- Slurm commands -------------------------------------------------------------------------------
def run_slurm(argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """One Slurm client command; a missing command or a hang is a SlurmRunError."""
    try:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError:
        raise SlurmRunError(
            f"{argv[0]} not found: install the Slurm client commands (Debian: slurm-client) "
            "on this host"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmRunError(f"{' '.join(argv)} did not answer within {timeout:g}s") from None


def _out(argv: Sequence[str], timeout: float = 30.0) -> str:
    res = run_slurm(argv, timeout)
    if res.returncode != 0:
        why = res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}"
        raise SlurmRunError(f"{' '.join(argv)} failed: {why}")
    return res.stdout


def expand_hostlist(nodelist: str) -> list[str]:
    """``node[1-3],gpu7`` -> its node names, in Slurm's order (the driver's order too)."""
    if not nodelist or nodelist in ("(null)", "None assigned"):
        return []
    return _out(["scontrol", "show", "hostnames", nodelist]).split()


def node_address(node: str) -> str:
    """The address Slurm reaches ``node`` at (NodeAddr; the name when it has none)."""
    text = _out(["scontrol", "show", "node", "-o", node])
    for word in text.split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1] or node
    return node


def partition_limits(partition: str | None = None) -> tuple[int | None, int | None]:
    """(GPUs, CPUs) per node of the partition's smallest node, from sinfo, for
    `SlurmOptions.gpus_per_node` / ``cpus_per_node``; None where sinfo does not say."""
    argv = ["sinfo", "-h", "-N", "-o", "%c|%G"]
    if partition:
        argv += ["-p", partition]
    gpus: list[int] = []
    cpus: list[int] = []
    for line in _out(argv).splitlines():
        c, _, gres = line.partition("|")
        if c.strip().isdigit():
            cpus.append(int(c))
        gpus.append(gpus_in_gres(gres))
    return (min(gpus) if gpus else None), (min(cpus) if cpus else None)


def gpus_in_gres(gres: str) -> int:
    """``gpu:h100:8(S:0-1),shard:4`` -> 8: the GPU count in sinfo's %G."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


# -- the job --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobComponent:
    job_id: str  # "123+1" for a het component, "123" otherwise
    state: str
    nodes: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # RUNNING, PENDING, ... of every component alike, else the least advanced; GONE
    components: tuple[JobComponent, ...]
    source: str  # squeue | sacct | none
    detail: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def running(self) -> bool:
        return bool(self.components) and all(c.state == "RUNNING" for c in self.components)


def _offset(job_id: str) -> int:
    return int(job_id.split("+", 1)[1]) if "+" in job_id else 0


def _aggregate(states: list[str]) -> str:
    for s in ("PENDING", "CONFIGURING", "COMPLETING", "RUNNING"):
        if s in states:
            return s
    return states[0] if states else GONE


def job_info(job_id: str) -> JobInfo:
    """The job as squeue sees it (every het component), else as sacct remembers it."""
    res = run_slurm(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%N|%r"])
    comps = []
    if res.returncode == 0:
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 4:
                continue
            jid, state, nodes, reason = parts
            comps.append(JobComponent(jid, state, tuple(expand_hostlist(nodes)), reason))
    if comps:
        comps.sort(key=lambda c: _offset(c.job_id))
        return JobInfo(job_id, _aggregate([c.state for c in comps]), tuple(comps), "squeue")
    # squeue forgets a finished job after MinJobAge; accounting (if any) remembers it.
    acct = run_slurm(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,NodeList"])
    if acct.returncode == 0:
        for line in acct.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0].split("+")[0] == job_id:
                state = parts[1].split()[0] if parts[1] else "UNKNOWN"
                comps.append(JobComponent(parts[0], state, ()))
    if comps:
        comps.sort(key=lambda c: _offset(c.job_id))
        return JobInfo(job_id, _aggregate([c.state for c in comps]), tuple(comps), "sacct")
    why = (acct.stderr.strip() or "no record").splitlines()[0] if acct.returncode else "no record"
    return JobInfo(job_id, GONE, (), "none", f"unknown to squeue; sacct: {why}")


# -- the record -----------------------------------------------------------------------------------
@dataclass
class ProcessRecord:
    name: str
    role: str
    component: int
    node: int  # index within the component's nodes
    port: int | None
    health_path: str | None
    log_path: str
    work_dir: str
    script_path: str
    secrets_path: str


@dataclass
class SlurmRecord:
    deployment: str
    job_id: str
    script: str
    driver_log: str
    model: str
    served_model_name: str
    components: list[list[str]]  # per component: its topology hosts
    processes: list[ProcessRecord]
    status: str = "submitted"  # submitted | up | failed
    submitted_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    backend: str = "slurm"
    format: int = FORMAT

    def process(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.processes if p.name == name), None)

    def by_role(self, role: str) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role == role]

    @property
    def work_dirs(self) -> list[str]:
        return sorted({p.work_dir for p in self.processes})

    @classmethod
    def from_json(cls, data: Any) -> SlurmRecord:
        if not isinstance(data, dict) or data.get("backend") != "slurm":
            raise ValueError("not a pdlaunch Slurm record")
        data = dict(data)
        procs = [ProcessRecord(**p) for p in data.pop("processes", [])]
        if not str(data.get("job_id", "")).isdigit():
            raise ValueError(f"job_id {data.get('job_id')!r} is not a Slurm job id")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known}, processes=procs)


def record_path(deployment: str) -> Path:
    return deployment_dir(deployment) / SLURM_RECORD_FILE


def load_record(deployment: str) -> SlurmRecord | None:
    path = record_path(deployment)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateError(f"cannot read the Slurm record {path}: {exc}") from None
    try:
        return SlurmRecord.from_json(data)
    except (TypeError, ValueError) as exc:
        raise StateError(f"the Slurm record {path} is damaged: {exc}") from None


def save_record(rec: SlurmRecord) -> Path:
    rec.updated_at = time.time()
    d = deployment_dir(rec.deployment)
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(
            d / SLURM_RECORD_FILE, json.dumps(asdict(rec), indent=2, sort_keys=True) + "\n"
        )
    except OSError as exc:
        raise StateError(f"cannot write the Slurm record in {d}: {exc}") from None
    return d / SLURM_RECORD_FILE


def record_of(plan: Plan, job_id: str) -> SlurmRecord:
    """What the control host must remember of a submitted plan (pure)."""
    comps = slurm.components(plan)
    procs = []
    for c in comps:
        for p in c.processes:
            procs.append(_process_record(p, c.index, c.node_of(p)))
    procs.append(_process_record(plan.router, 0, 0))
    return SlurmRecord(
        deployment=plan.deployment,
        job_id=job_id,
        script=f"{slurm.job_dir(plan)}/{slurm.DRIVER_NAME}",
        driver_log=slurm.driver_log(plan).replace("%j", job_id),
        model=plan.model,
        served_model_name=plan.served_model_name,
        components=[list(c.hosts) for c in comps],
        processes=procs,
    )


def _process_record(p: Process, component: int, node: int) -> ProcessRecord:
    url = urlsplit(p.health_url) if p.health_url else None
    return ProcessRecord(
        name=p.name,
        role=p.role,
        component=component,
        node=node,
        port=url.port if url else None,
        health_path=url.path if url else None,
        log_path=p.log_path,
        work_dir=p.work_dir,
        script_path=p.script_path,
        secrets_path=p.secrets_path,
    )


# -- submit ---------------------------------------------------------------------------------------
def _secrets(plan: Plan, environ: dict[str, str]) -> dict[str, dict[str, str]]:
    """Process name -> {variable: value} read here, on the control host (as `up` does)."""
    missing = sorted(
        {src for p in plan.processes for src in p.secret_env.values() if src not in environ}
    )
    if missing:
        raise SlurmRunError(
            f"secret variable(s) {', '.join(missing)} are not set in this shell: export them "
            "before submitting (their values go to mode-0600 files in the work dir, never "
            "into the job script)"
        )
    return {
        p.name: {var: environ[src] for var, src in p.secret_env.items()}
        for p in plan.processes
        if p.secret_env
    }


def write_job(plan: Plan, opts: slurm.SlurmOptions, environ: dict[str, str] | None = None) -> Path:
    """Write every file the job needs where the plan puts it (each process's work dir, which
    the nodes must share); returns the driver script's path."""
    files = {f.name: f for f in slurm.render_job(plan, opts)}
    secrets = _secrets(plan, dict(os.environ if environ is None else environ))
    try:
        for p in plan.processes:
            for d in p.dirs:
                Path(d).mkdir(mode=0o700, parents=True, exist_ok=True)
            log = Path(p.log_path)
            if log.exists():
                log.replace(log.with_name(log.name + ".prev"))
            atomic_write(p.script_path, files[f"{p.name}.sh"].content, 0o755)
            if p.name in secrets:
                atomic_write(p.secrets_path, render_secrets(secrets[p.name]), 0o600)
        driver = Path(slurm.job_dir(plan)) / slurm.DRIVER_NAME
        Path(slurm.driver_log(plan)).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(driver, files[slurm.DRIVER_NAME].content, 0o755)
    except OSError as exc:
        raise SlurmRunError(f"cannot write the job's files: {exc}") from None
    return driver


def _refuse_if_running(deployment: str) -> None:
    if (deployment_dir(deployment) / STATE_FILE).is_file():
        raise SlurmRunError(
            f"deployment {deployment!r} has a record of processes started over SSH: "
            f"`pdlaunch down {deployment}` first"
        )
    rec = load_record(deployment)
    if rec is not None:
        info = job_info(rec.job_id)
        if info.active:
            raise SlurmRunError(
                f"deployment {deployment!r} is Slurm job {rec.job_id} ({info.state}): "
                f"`pdlaunch down {deployment}` first"
            )


def submit(plan: Plan, opts: slurm.SlurmOptions, environ: dict[str, str] | None = None) -> str:
    """Write the job's files, ``sbatch --parsable`` the driver, record the job; the job id."""
    _refuse_if_running(plan.deployment)
    driver = write_job(plan, opts, environ)
    out = _out(["sbatch", "--parsable", str(driver)], timeout=60).strip()
    job_id = out.split(";", 1)[0]
    if not job_id.isdigit():
        raise SlurmRunError(f"sbatch answered {out!r}, not a job id")
    save_record(record_of(plan, job_id))
    return job_id


def sbatch_test_only(plan: Plan, opts: slurm.SlurmOptions, directory: Path) -> str:
    """``sbatch --test-only`` of the driver written to ``directory``: Slurm's own verdict on
    the request (nothing runs); sbatch's message, or SlurmRunError with it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / slurm.DRIVER_NAME
    atomic_write(path, slurm.sbatch_script(plan, opts), 0o755)
    res = run_slurm(["sbatch", "--test-only", str(path)], timeout=60)
    text = (res.stderr + res.stdout).strip()
    if res.returncode != 0:
        raise SlurmRunError(f"sbatch --test-only refused the job: {text}")
    return text


# -- health ---------------------------------------------------------------------------------------
def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def endpoints(rec: SlurmRecord, info: JobInfo) -> dict[str, str]:
    """Process name -> its base URL on the node Slurm gave it (for the ones with HTTP)."""
    if len(info.components) < len(rec.components):
        raise SlurmRunError(
            f"job {rec.job_id} has {len(info.components)} component(s) in {info.source}, "
            f"the record {len(rec.components)}"
        )
    addr: dict[str, str] = {}
    out = {}
    for p in rec.processes:
        if p.port is None:
            continue
        nodes = info.components[p.component].nodes
        if p.node >= len(nodes):
            raise SlurmRunError(f"{p.name}: component {p.component} has no node {p.node} yet")
        node = nodes[p.node]
        if node not in addr:
            addr[node] = node_address(node)
        out[p.name] = f"http://{_url_host(addr[node])}:{p.port}"
    return out


def health_url(rec: SlurmRecord, urls: dict[str, str], name: str) -> str | None:
    p = rec.process(name)
    if p is None or name not in urls:
        return None
    return urls[name] + (p.health_path or "/health")


def wait_running(
    job_id: str,
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> JobInfo:
    """Until every component runs; SlurmRunError when the job ends or the time is up."""
    deadline = clock() + timeout
    while True:
        info = job_info(job_id)
        if info.running:
            return info
        if not info.active:
            raise SlurmRunError(f"job {job_id} ended before it ran: {info.state} {info.detail}")
        if clock() >= deadline:
            reasons = ", ".join(f"{c.job_id} {c.state} ({c.reason})" for c in info.components)
            raise SlurmRunError(f"job {job_id} still not running after {timeout:g}s: {reasons}")
        sleep(0.5)


def wait_healthy(
    rec: SlurmRecord,
    timeout: float,
    *,
    interval: float = 0.5,
    on_wait: Callable[[str, str], None] = lambda name, detail: None,
) -> tuple[dict[str, str], dict[str, Outcome]]:
    """Wait for the job to run, then for each engine's health and the router's (the driver
    starts the router last); the endpoints and each process's outcome. Stops at the first
    process that is not ready."""
    deadline = time.monotonic() + timeout
    info = wait_running(rec.job_id, timeout)
    urls = endpoints(rec, info)
    outcomes: dict[str, Outcome] = {}

    def alive() -> bool:
        return job_info(rec.job_id).running

    order = [p for p in rec.processes if p.role != "router"] + rec.by_role("router")
    for p in order:
        url = health_url(rec, urls, p.name)

        def probe(t: float, url: str | None = url) -> tuple[bool, str]:
            r = health.probe(url, timeout=t) if url else health.Probe(True)
            return r.ok, r.describe()

        outcome = wait_until(
            probe if url else None,
            alive,
            deadline=deadline,
            interval=interval,
            on_wait=lambda detail, name=p.name: on_wait(name, detail),
        )
        outcomes[p.name] = outcome
        if not outcome.ready:
            break
    return urls, outcomes


def run_canary(rec: SlurmRecord, urls: dict[str, str], timeout: float = 120.0):
    """The same PD canary as `up`: one completion through the router, proven disaggregated
    by the engines' counters and equal to a prefill's own answer."""
    prefill = [u for p in rec.by_role("prefill") if (u := health_url(rec, urls, p.name))]
    decode = [u for p in rec.by_role("decode") if (u := health_url(rec, urls, p.name))]
    return health.canary(
        urls["router"],
        rec.served_model_name,
        prefill,
        decode,
        timeout=timeout,
        reference_health=prefill,
    )


def tail(path: str, lines: int = 30) -> str:
    if lines <= 0:
        return ""  # [-0:] would be the whole file
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"
    return "\n".join(data.splitlines()[-lines:])


@dataclass
class UpResult:
    ok: bool
    job_id: str
    message: str
    endpoint: str | None = None
    healthy_s: float | None = None
    canary: health.CanaryResult | None = None
    outcomes: dict[str, str] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)  # tails, on failure


def up(
    plan: Plan,
    opts: slurm.SlurmOptions,
    *,
    timeout: float = 900.0,
    canary: bool = True,
    canary_timeout: float = 120.0,
    environ: dict[str, str] | None = None,
    on_step: Callable[[str], None] = lambda msg: None,
) -> UpResult:
    """Submit, wait for every process's health, send the PD canary; on any failure cancel
    the job (and wait until Slurm says it is gone) and say why, with the logs' tails."""
    t0 = time.monotonic()
    with DeploymentLock(plan.deployment, "slurm up"):
        on_step("submitting the job")
        job_id = submit(plan, opts, environ)
        rec = load_record(plan.deployment)
        assert rec is not None  # submit() has just written it
        on_step(f"job {job_id}: waiting for the allocation and for health")
        failure = None
        result = UpResult(False, job_id, "")
        try:
            urls, outcomes = wait_healthy(rec, timeout)
            result.outcomes = {k: f"{v.status}: {v.detail}" for k, v in outcomes.items()}
            bad = [(k, v) for k, v in outcomes.items() if not v.ready]
            if bad or "router" not in outcomes:
                name, o = bad[0] if bad else ("router", Outcome("not started"))
                failure = f"{name} is not healthy ({o.status}: {o.detail})"
            else:
                result.healthy_s = round(time.monotonic() - t0, 2)
                result.endpoint = urls["router"]
                if canary:
                    on_step("canary request through the router")
                    result.canary = run_canary(rec, urls, canary_timeout)
                    if not result.canary.ok:
                        failure = f"canary failed: {result.canary.message}"
        except SlurmRunError as exc:
            failure = str(exc)
        if failure is None:
            rec.status = "up"
            save_record(rec)
            result.ok = True
            result.message = f"{plan.deployment} is up as Slurm job {job_id}"
            return result
        result.logs = {p.name: tail(p.log_path) for p in rec.processes}
        result.logs["driver"] = tail(rec.driver_log)
        on_step(f"failed: {failure}; cancelling job {job_id}")
        stopped = _cancel(rec, timeout=120.0)
        rec.status = "failed"
        save_record(rec)
        result.message = f"{failure} (job {job_id} {stopped})"
        return result


# -- status, logs, down ---------------------------------------------------------------------------
@dataclass
class ProcessStatus:
    name: str
    role: str
    node: str | None
    url: str | None
    health: str


@dataclass
class Status:
    deployment: str
    job: JobInfo
    processes: list[ProcessStatus]

    @property
    def healthy(self) -> bool:
        # A headless DP rank serves no HTTP: running is all it can show (as for `up` over SSH).
        return self.job.running and all(p.health in ("healthy", "headless") for p in self.processes)


def _need_record(deployment: str) -> SlurmRecord:
    rec = load_record(deployment)
    if rec is None:
        raise SlurmRunError(f"no Slurm job is recorded for deployment {deployment!r}")
    return rec


def status(deployment: str) -> Status:
    """The job as Slurm sees it, and every process's health on its node."""
    rec = _need_record(deployment)
    info = job_info(rec.job_id)
    urls: dict[str, str] = {}
    if info.running:
        urls = endpoints(rec, info)
    procs = []
    for p in rec.processes:
        nodes = info.components[p.component].nodes if p.component < len(info.components) else ()
        node = nodes[p.node] if p.node < len(nodes) else None
        url = health_url(rec, urls, p.name)
        if url:
            state = health.probe(url).describe()
        else:
            state = "headless" if info.running and p.port is None else info.state.lower()
        procs.append(ProcessStatus(p.name, p.role, node, url, state))
    return Status(deployment, info, procs)


def logs(deployment: str, name: str, lines: int | None = None) -> str:
    """A process's log (``driver``: the batch script's own), whole or its last ``lines``."""
    rec = _need_record(deployment)
    paths = {p.name: p.log_path for p in rec.processes} | {"driver": rec.driver_log}
    if name not in paths:
        raise SlurmRunError(f"no process {name!r} in {deployment}; known: {', '.join(paths)}")
    if lines is not None:
        return tail(paths[name], lines)
    try:
        return Path(paths[name]).read_text(errors="replace")
    except OSError as exc:
        raise SlurmRunError(f"cannot read {paths[name]}: {exc.strerror}") from None


def processes_under(roots: Sequence[str]) -> list[tuple[int, str]]:
    """Live processes on this host whose working directory is under one of ``roots`` (every
    step runs in its process's work dir): (pid, command line)."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2 :].split()[:1] in ([b"Z"], [b"X"]):
            continue
        if any(cwd == r or cwd.startswith(r.rstrip("/") + "/") for r in roots):
            found.append((int(entry), cmd[:200]))
    return found


def _cancel(rec: SlurmRecord, timeout: float) -> str:
    """scancel, then poll until Slurm no longer holds the job; what happened, in words."""
    res = run_slurm(["scancel", rec.job_id])
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(rec.job_id)
        if not info.active:
            return f"cancelled ({info.state} in {info.source})"
        if time.monotonic() >= deadline:
            why = res.stderr.strip()
            raise SlurmRunError(
                f"job {rec.job_id} is still {info.state} {timeout:g}s after scancel"
                + (f" ({why})" if why else "")
            )
        time.sleep(0.5)


@dataclass
class DownResult:
    deployment: str
    job_id: str | None
    message: str
    left: list[tuple[int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.left


def down(deployment: str, *, timeout: float = 120.0, settle: float = 15.0) -> DownResult:
    """Cancel the job, wait until squeue/sacct no longer hold it, then prove that no process
    is left in the deployment's work dirs on this host (Slurm's process tracking kills the
    steps; this is the check, not the mechanism). Idempotent: nothing recorded, nothing
    done. The record is forgotten only once nothing is left."""
    with DeploymentLock(deployment, "slurm down"):
        rec = load_record(deployment)
        if rec is None:
            return DownResult(deployment, None, f"no Slurm job recorded for {deployment}")
        what = _cancel(rec, timeout)
        end = time.monotonic() + settle
        while (left := processes_under(rec.work_dirs)) and time.monotonic() < end:
            time.sleep(0.2)
        if left:
            return DownResult(
                deployment,
                rec.job_id,
                f"job {rec.job_id} {what}, but {len(left)} process(es) still run in "
                f"{', '.join(rec.work_dirs)}",
                left,
            )
        for p in rec.processes:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p.secrets_path)
        with contextlib.suppress(FileNotFoundError):
            record_path(deployment).unlink()
        return DownResult(deployment, rec.job_id, f"job {rec.job_id} {what}; nothing left")
