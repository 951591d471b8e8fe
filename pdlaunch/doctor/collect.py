"""Gathering: every recorded process's log tail and /metrics, every host's software versions.

Logs are read through the hosts layer (:meth:`Host.read_log` on the pool's connection, local or
SSH), metrics over HTTP from the control host (:mod:`pdlaunch.observe.health`, proxies off, with a
timeout). Nothing here raises for a host or a process that does not answer: the failure is
recorded in the evidence and becomes a finding, so one dead node never hides the others.
"""

from __future__ import annotations

import copy
import json
import posixpath
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdlaunch.check.probes.versions import SNIPPET as CHECK_VERSIONS_SNIPPET
from pdlaunch.doctor.evidence import Evidence, HostVersions, ProcessEvidence
from pdlaunch.hosts import HostError, HostPool, parallel, sh_quote_path
from pdlaunch.observe.health import HttpError, get_text
from pdlaunch.plan.build import Plan, Process, build_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.runtime.record import metrics_url_of
from pdlaunch.runtime.state import DeploymentState, ProcessState
from pdlaunch.spec.load import LoadError, load_text, read_text

PYTHON_ENV = "PDLAUNCH_PYTHON"  # the same override `pdlaunch check` honours

#: More than `pdlaunch check` asks (router, plugins, UCX builds), and the version of the UCX
#: that NIXL's wheel bundles (read from the library itself: no UCX tool ships with it), and
#: of a system UCX when ``ucx_info`` is on the PATH. One JSON line, format owned by pdlaunch.
UCX_SNIPPET = r"""import ctypes,glob,json,os,shutil,site,subprocess,sys
from importlib import metadata as md
def v(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return None
names=("vllm-router","pdlaunch","vllm-hpu-extension","habana-torch-plugin","torch-npu",
"mooncake-transfer-engine","ucx-py-cu12","libucx-cu12","libucx-cu13")
out={"pdlaunch_doctor":1,"packages":{n:v(n) for n in names},"ucx_bundled":{}}
dirs=set(site.getsitepackages()+[site.getusersitepackages()])
dirs.update(p for p in sys.path if p.endswith("site-packages"))
for d in sorted(dirs):
    for libs in sorted(glob.glob(os.path.join(d,"nixl*.libs"))):
        ucp=glob.glob(os.path.join(libs,"libucp*.so*"))
        if not ucp:
            continue
        try:
            for n in ("libucs","libucm","libuct"):
                for f in glob.glob(os.path.join(libs,n+"*.so*")):
                    ctypes.CDLL(f,mode=ctypes.RTLD_GLOBAL)
            lib=ctypes.CDLL(ucp[0])
            lib.ucp_get_version_string.restype=ctypes.c_char_p
            out["ucx_bundled"][libs]=lib.ucp_get_version_string().decode()
        except Exception as e:
            out["ucx_bundled"][libs]="unreadable: %s"%e
tool=shutil.which("ucx_info")
if tool:
    try:
        r=subprocess.run([tool,"-v"],capture_output=True,text=True,timeout=10)
        out["ucx_info"]=(r.stdout or r.stderr).strip().splitlines()[:3]
    except Exception as e:
        out["ucx_info"]=["failed: %s"%e]
print(json.dumps(out,sort_keys=True))"""


@dataclass
class TopologyFile:
    """The topology file a deployment was started from, as the control host has it now."""

    path: str
    text: str | None = None
    plan: Plan | None = None
    note: str | None = None  # why text or plan is missing


def load_topology(state: DeploymentState) -> TopologyFile:
    """Read the recorded topology file and plan it again; a file that is gone, changed into
    something invalid or unreadable leaves a note instead (the record still has the scripts
    as uploaded)."""
    t = TopologyFile(state.topology)
    if not state.topology:
        t.note = "no topology file is recorded for this deployment"
        return t
    try:
        t.text = read_text(Path(state.topology))
        topo, source = load_text(t.text, state.topology)
    except LoadError as exc:
        t.note = f"cannot load the topology: {exc}"
        return t
    findings = validate(topo, source)
    if has_errors(findings):
        n = sum(f.severity == "error" for f in findings)
        t.note = f"{state.topology} no longer validates ({n} error(s)); no plan rendered"
        return t
    t.plan = build_plan(topo)
    if t.plan.deployment != state.deployment:
        t.note = (
            f"{state.topology} now describes deployment {t.plan.deployment!r}, not "
            f"{state.deployment!r}; its plan is left out"
        )
        t.plan = None
    return t


def metrics_url(p: ProcessState) -> str | None:
    """Where a process serves Prometheus text: an engine on its HTTP port, vllm-router on its
    own metrics port (the second port recorded for it)."""
    return metrics_url_of(p.role, p.health_url, p.ports[1] if len(p.ports) > 1 else None)


def _fetch(url: str, timeout: float) -> tuple[str | None, str | None]:
    try:
        return get_text(url, timeout), None
    except HttpError as exc:  # names the endpoint: HTTP status, no answer, too large
        return None, str(exc)


def collect_process(
    p: ProcessState,
    pool: HostPool,
    *,
    lines: int = 500,
    timeout: float = 5.0,
    metrics_interval: float = 0.0,
) -> ProcessEvidence:
    """One process's log tail and metrics; failures are recorded, never raised."""
    ev = ProcessEvidence(p.name, p.role, p.host, log_path=p.log_path, metrics_url=metrics_url(p))
    try:
        host = pool.get(p.host, p.local, p.ssh)
        text = host.read_log(p.log_path, lines)
        ev.log = text.splitlines()
        if not text:
            # read_log answers "" for a missing file too: say which it was.
            res = host.run(f"[ -e {sh_quote_path(p.log_path)} ]", timeout=timeout + 10)
            if not res.ok:
                ev.log, ev.log_error = None, f"{p.host}: {p.log_path} does not exist"
    except HostError as exc:
        ev.log_error = str(exc)
    if ev.metrics_url:
        ev.metrics, ev.metrics_error = _fetch(ev.metrics_url, timeout)
        if ev.metrics is not None and metrics_interval > 0:
            time.sleep(metrics_interval)
            ev.metrics_after, err = _fetch(ev.metrics_url, timeout)
            if ev.metrics_after is not None:
                ev.metrics_interval = metrics_interval
            else:
                ev.metrics_error = err
    return ev


def python_for(processes: Sequence[Process]) -> str:
    """The interpreter that runs vLLM on a host, by the rule `pdlaunch check` follows:
    ``PDLAUNCH_PYTHON`` in a process's env, else the ``python`` beside an engine's vllm binary
    when that is a path, else ``python3``."""
    for proc in processes:
        if proc.env.get(PYTHON_ENV):
            return proc.env[PYTHON_ENV]
    for proc in processes:
        if proc.role in ("prefill", "decode") and proc.argv and "/" in proc.argv[0]:
            return posixpath.join(posixpath.dirname(proc.argv[0]), "python")
    return "python3"


def versions_command(python: str) -> str:
    py = sh_quote_path(python)
    return (
        f"command -v {py} >/dev/null 2>&1 || {{ echo {shlex.quote(python)}: not found >&2; "
        f"exit 127; }}; {py} -c {shlex.quote(CHECK_VERSIONS_SNIPPET)}; "
        f"{py} -c {shlex.quote(UCX_SNIPPET)}"
    )


def parse_versions(stdout: str) -> dict[str, Any]:
    """Merge the JSON lines the two snippets print (anything else is ignored: a warning a
    library printed on stdout must not hide the versions)."""
    data: dict[str, Any] = {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            packages = {**data.get("packages", {}), **obj.get("packages", {})}
            data.update(obj)
            data["packages"] = packages
    return data


def collect_versions(
    state: DeploymentState, pool: HostPool, plan: Plan | None = None, timeout: float = 60.0
) -> list[HostVersions]:
    """Versions of vLLM, NIXL, UCX, torch and the plugins on every host of the deployment."""
    hosts: dict[str, ProcessState] = {}
    for p in state.processes:
        hosts.setdefault(p.host, p)

    def one(p: ProcessState) -> HostVersions:
        procs = [x for x in plan.processes if x.host == p.host] if plan is not None else []
        python = python_for(procs)
        hv = HostVersions(p.host, python)
        try:
            res = pool.get(p.host, p.local, p.ssh).run(versions_command(python), timeout=timeout)
        except HostError as exc:
            hv.error = str(exc)
            return hv
        hv.raw = res.stdout
        hv.data = parse_versions(res.stdout)
        if not res.ok or not hv.data:
            hv.error = (res.stderr.strip() or f"rc={res.rc}")[-500:]
        return hv

    return parallel(one, list(hosts.values()))


def collect_running(state: DeploymentState, pool: HostPool) -> dict[str, tuple[str, str]]:
    """{process: (running, detail)} by the survey `status` and `down` make (the leader and
    every process holding its log), on a copy: the record is not changed."""
    from pdlaunch.backends.ssh.records import survey  # the runtime depends on far more

    seen = copy.deepcopy(state)
    found = survey(seen, pool)
    out: dict[str, tuple[str, str]] = {}
    for rec in state.processes:
        name = rec.name
        if name in found.unknown:
            out[name] = ("unknown", found.unknown[name])
        elif name in found.partial:
            pids = " ".join(map(str, found.partial[name]))
            out[name] = ("partly dead", f"leader pid {rec.pid} is gone; still running: {pids}")
        elif name in found.alive:
            out[name] = ("alive", "")
        elif rec.pid is None and rec.started_at is None:
            out[name] = ("not started", "")
        else:
            out[name] = ("dead", f"pid {rec.pid} is gone" if rec.pid else "not running")
    return out


def collect(
    state: DeploymentState,
    pool: HostPool,
    *,
    lines: int = 500,
    timeout: float = 5.0,
    metrics_interval: float = 0.0,
    versions: bool = False,
    plan: Plan | None = None,
    running: dict[str, tuple[str, str]] | None = None,
) -> Evidence:
    """Everything the doctor reads from a recorded deployment, gathered in parallel.
    ``running``: whether each process runs, as its backend knows it (a Slurm job's state);
    by default the survey over the hosts that `status` and `down` make."""

    def one(p: ProcessState) -> ProcessEvidence:
        return collect_process(
            p, pool, lines=lines, timeout=timeout, metrics_interval=metrics_interval
        )

    ev = Evidence(state.deployment, collected_at=time.time(), lines=lines)
    ev.processes = parallel(one, state.processes)
    if running is None:
        running = collect_running(state, pool)
    for p in ev.processes:
        p.running, p.running_detail = running.get(p.name, (None, ""))
    if versions:
        ev.versions = collect_versions(state, pool, plan)
    return ev
