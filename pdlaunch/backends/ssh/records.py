"""What a deployment's records say, checked against its hosts.

``survey`` is the one place that decides whether a recorded (or only pid-filed) process runs:
alive (verified: same pid, same start time, its log open as stdout), gone (proven), or unknown
(its host could not be asked). Every command that could forget or duplicate a process (`up`
again, `down`, `status`) starts from a survey, and nothing unknown is ever treated as gone.
"""

from __future__ import annotations

import difflib
import os
import threading
import time
from dataclasses import dataclass, field

from pdlaunch.hosts import Host, HostError, HostPool, parallel
from pdlaunch.hosts.containers import ContainerRef
from pdlaunch.hosts.pool import HostKey, host_key
from pdlaunch.observe import health
from pdlaunch.plan import render
from pdlaunch.plan.build import Plan, Process
from pdlaunch.plan.containers import ENGINE_RUNTIMES, LABEL_DEPLOYMENT
from pdlaunch.plan.render import RenderedFile
from pdlaunch.runtime.state import DeploymentState, ProcessState, file_hashes

LOG_TAIL_LINES = 30


def proc_host(pool: HostPool, p: Process | ProcessState) -> Host:
    ssh = p.ssh if isinstance(p, ProcessState) else p.ssh.model_dump()
    return pool.get(p.host, p.local, ssh)


def proc_key(p: Process | ProcessState) -> HostKey:
    ssh = p.ssh if isinstance(p, ProcessState) else p.ssh.model_dump()
    return host_key(p.host, p.local, ssh)


def log_tail(host: Host, path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return host.read_log(path, lines)
    except HostError as exc:
        return f"(cannot read {path}: {exc})"


# -- secrets --------------------------------------------------------------------------------------
def missing_secrets(plan: Plan, environ: dict[str, str] | None = None) -> dict[str, list[str]]:
    """{control-host variable: [processes needing it]} for every secret not set here."""
    env = os.environ if environ is None else environ
    missing: dict[str, list[str]] = {}
    for p in plan.processes:
        for src in p.secret_env.values():
            if src not in env:
                missing.setdefault(src, []).append(p.name)
    return missing


def secrets_file(p: Process, environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return render.render_secrets({var: env[src] for var, src in p.secret_env.items()})


# -- records --------------------------------------------------------------------------------------
def process_state(p: Process, script: RenderedFile | None) -> ProcessState:
    """``script``: the rendered script whose hash is recorded (None: not known, as for a
    process found by its pid file only)."""
    return ProcessState(
        name=p.name,
        role=p.role,
        host=p.host,
        local=p.local,
        ssh=p.ssh.model_dump(mode="json"),
        work_dir=p.work_dir,
        script_path=p.script_path,
        log_path=p.log_path,
        pid_path=p.pid_path,
        secrets_path=p.secrets_path,
        health_url=p.health_url,
        ports=[x.port for x in p.ports],
        script_hash=file_hashes([script])[script.name] if script is not None else "",
        container=container_ref(p),
        dp_ranks=list(p.dp_ranks),
    )


def container_ref(p: Process) -> dict[str, str] | None:
    """What `down` and `status` need to find the process's container (docker/podman)."""
    c = p.container
    if c is None or c.runtime not in ENGINE_RUNTIMES:
        return None
    return ContainerRef(c.runtime, c.name, c.cid_path, c.labels[LABEL_DEPLOYMENT], p.name).to_json()


def unrecorded_state(plan: Plan, status: str = "stopping") -> DeploymentState:
    """A record of the plan's processes with no pid yet: what a pid-file search fills in."""
    return DeploymentState(
        deployment=plan.deployment,
        topology="",
        scripts_hash="",
        endpoint=plan.endpoint(),
        served_model_name=plan.served_model_name,
        status=status,
        processes=[process_state(p, None) for p in plan.processes],
    )


def describe_changes(
    old: DeploymentState, files: list[RenderedFile], max_lines: int = 6
) -> list[str]:
    """Per rendered script: added, removed, or the changed lines (a short diff)."""
    new = {f.name: f.content for f in files}
    new_hashes = file_hashes(files)
    changes = []
    for name in sorted(set(old.file_hashes) | set(new)):
        if not name.endswith(".sh"):
            continue  # index.md and plan.json only restate the scripts
        if name not in old.file_hashes:
            changes.append(f"new process {name[:-3]}")
        elif name not in new:
            changes.append(f"process {name[:-3]} removed")
        elif old.file_hashes[name] != new_hashes[name]:
            before = old.scripts.get(name)
            if before is None:
                changes.append(f"{name[:-3]}: script changed")
                continue
            diff = [
                line
                for line in difflib.unified_diff(
                    before.splitlines(), new[name].splitlines(), lineterm="", n=0
                )
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            ]
            shown = [" ".join(d.split()) for d in diff[:max_lines]]
            more = f" (+{len(diff) - max_lines} more)" if len(diff) > max_lines else ""
            changes.append(f"{name[:-3]}: " + ", ".join(shown) + more)
    return changes or ["rendered files differ"]


def endpoints(plan: Plan) -> list[tuple[str, str]]:
    out = [("router (OpenAI API)", plan.endpoint() + "/v1")]
    for p in plan.processes:
        if p.role != "router" and p.health_url:
            out.append((p.name, health.base_url(p.health_url)))
    return out


# -- the survey -----------------------------------------------------------------------------------
@dataclass
class Survey:
    alive: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)  # name -> why it could not be asked
    found: list[str] = field(default_factory=list)  # alive by their pid file, not by a record
    # Processes of this deployment running beside the recorded one (a second copy left by a
    # crashed run, the children of a leader that died): ours to stop, never to keep.
    strangers: list[ProcessState] = field(default_factory=list)
    # name -> pids still running of a process whose leader is gone (an engine's EngineCore
    # and workers after its API server died): neither alive nor gone; stopped as strangers.
    partial: dict[str, list[int]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.unknown


def survey(state: DeploymentState, pool: HostPool) -> Survey:
    """Ask every host, one command each, which of ``state``'s processes run; update ``state``:
    verified pids (and their start times) filled in, proven-gone ones cleared, unknown ones
    left exactly as recorded.

    A process is its whole process group: its leader (the recorded pid) and every process
    that holds its log open (children inherit it). A process counts as gone only when none
    of them runs; members left by a dead leader, or holders outside the leader's group, are
    returned as strangers (and the first as ``partial``)."""
    result = Survey()
    lock = threading.Lock()
    groups: dict[HostKey, list[ProcessState]] = {}
    for ps in state.processes:
        groups.setdefault(proc_key(ps), []).append(ps)

    def one(procs: list[ProcessState]) -> None:
        try:
            host = proc_host(pool, procs[0])
            entries: list[tuple[str, str, int | None]] = []
            for ps in procs:
                entries.append((ps.pid_path, ps.log_path, ps.pid))  # the record
                entries.append((ps.pid_path, ps.log_path, None))  # the pid file
            found, holders = host.find_tracked(entries, [ps.log_path for ps in procs])
        except HostError as exc:
            with lock:
                for ps in procs:
                    result.unknown[ps.name] = str(exc)
            return
        with lock:
            for i, ps in enumerate(procs):
                rec = found.get(2 * i) if ps.pid is not None else None
                if rec is not None and ps.start_time is not None and rec[1] != ps.start_time:
                    rec = None  # the pid was reused by a process with the same log open?
                pidf = found.get(2 * i + 1)
                recorded_pid, recorded_start = ps.pid, ps.start_time
                groups: set[int] = set()  # the process groups already accounted for
                if rec is not None:
                    ps.pid, ps.start_time = rec
                    result.alive.append(ps.name)
                    groups.add(rec[0])
                    if pidf is not None and pidf[0] != rec[0]:
                        extra = ProcessState(**{**vars(ps), "pid": pidf[0], "start_time": pidf[1]})
                        result.strangers.append(extra)
                        groups.add(pidf[0])
                elif pidf is not None:
                    ps.pid, ps.start_time = pidf
                    ps.started_at = ps.started_at or time.time()
                    result.alive.append(ps.name)
                    result.found.append(ps.name)
                    groups.add(pidf[0])
                else:
                    ps.pid, ps.start_time = None, None
                left = [h for h in holders.get(i, []) if h[1] not in groups]
                for pgid in sorted({pg for _, pg in left}):
                    # Members of a group whose leader is gone (or that left the group) still
                    # hold the log: the process is not gone until they are stopped too.
                    start = recorded_start if pgid == recorded_pid else None
                    extra = ProcessState(**{**vars(ps), "pid": pgid, "start_time": start})
                    result.strangers.append(extra)
                if left and ps.pid is None:
                    result.partial[ps.name] = sorted(pid for pid, _ in left)
                elif ps.pid is None:
                    result.gone.append(ps.name)

    parallel(one, groups.values())
    order = {ps.name: i for i, ps in enumerate(state.processes)}
    for names in (result.alive, result.gone, result.found):
        names.sort(key=order.__getitem__)
    return result


def unknown_message(s: Survey, deployment: str) -> str:
    hosts: dict[str, list[str]] = {}
    for name, why in s.unknown.items():
        hosts.setdefault(why, []).append(name)
    parts = [f"{', '.join(names)}: {why}" for why, names in hosts.items()]
    return (
        f"cannot verify {len(s.unknown)} process(es) of {deployment}: "
        + "; ".join(parts)
        + f". Their record is kept. Fix the connection, then run `pdlaunch status {deployment}`"
        f" or `pdlaunch down {deployment}`"
    )
