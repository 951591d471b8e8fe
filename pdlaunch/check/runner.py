"""Run the `pdlaunch check` probes of a plan on its hosts.

Flow (:func:`run_check`)::

    group the plan's processes by host (address + how to reach it)
    plan, per host, the jobs of every probe it needs: the probe families its device kinds'
        entries in devices.py name, the transports its plan uses, and each probe's own
        parameter builder over the plan's typed facts
    phase 1, one thread per host:  connect -> ONE shell round trip that runs, in parallel on
        the host, every planned job plus the reachability probes it is the source of
        (decode -> prefill NIXL side channel / Mooncake port, router -> every instance HTTP
        port, DP node -> master RPC)
    phase 2:                       pair probes that need phase-1 facts (Ascend NPU pings at
        the decode NPU addresses learnt in phase 1; --fast keeps only these fast ones), and
        with --bandwidth ``ib_write_bw`` per prefill -> decode host pair
    cluster:                       each probe's cross-host comparison (versions equal, Ascend
        TLS identical)

A host that cannot be reached gives one FAIL row (``host.connect``) with the HostError
message; the other hosts are checked all the same. What a probe runs and how its output is
judged is its module's job (:mod:`pdlaunch.check.probes`); this module only decides where,
runs it through the hosts layer and attaches the results to hosts and pairs. It names no
probe id and no device kind, and reads only typed plan facts.

Which Python interpreter runs the version/reachability probes on a host, first match wins:

1. ``PDLAUNCH_PYTHON`` in the planned env of a process on that host (topology ``defaults.env``,
   ``hosts.<host>.env``, an instance's or the router's ``env``): check's own setting;
2. the ``python`` next to an instance's ``vllm_bin`` when that is a path
   (``/opt/venv/bin/vllm`` -> ``/opt/venv/bin/python``: the venv vLLM runs in);
3. ``python3`` on the host's PATH.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from pdlaunch.check import probes as registry
from pdlaunch.check.probes import (
    Call,
    CommandOutput,
    HostFacts,
    Probe,
    ProbeContext,
    families_of,
    select_probes,
)
from pdlaunch.check.probes.bandwidth import IB_WRITE_BW, server_command
from pdlaunch.check.probes.ports import (
    REACH,
    hold_command,
    reach_batch_command,
    split_reach_batch,
)
from pdlaunch.check.probes.rdma import planned_hcas
from pdlaunch.check.probes.ucx import uses_rdma
from pdlaunch.check.results import CheckResult, Status, has_failure
from pdlaunch.hosts import ConnectOptions, Host, HostError, HostPool
from pdlaunch.hosts.pool import host_key
from pdlaunch.plan import Plan, Process

PYTHON_ENV = "PDLAUNCH_PYTHON"
TIMEOUT_RC = 124  # coreutils `timeout`


# ------------------------------------------------------------------------------ options/report


@dataclass
class CheckOptions:
    """fast: the quick subset `up` runs (NPU pings included, no bandwidth).
    bandwidth: add ``ib_write_bw`` between every prefill -> decode host pair (RDMA plans).
    connect: how hosts are reached (unused when ``run_check`` is handed a connected pool).
    reach_timeout: seconds a reachability connect may take before it counts as filtered.
    min_bandwidth_gbps: WARN below it (``--bandwidth``)."""

    fast: bool = False
    bandwidth: bool = False
    connect: ConnectOptions = field(default_factory=ConnectOptions)
    reach_timeout: float = 3.0
    min_bandwidth_gbps: float | None = None
    max_workers: int = 64


@dataclass
class HostTarget:
    """One machine of the plan, as the check sees it."""

    label: str  # target name in results
    address: str
    local: bool
    ssh: dict[str, Any]
    processes: list[Process]
    device_kinds: set[str] = field(default_factory=set)  # topology kinds of its engines
    families: set[str] = field(default_factory=set)  # probe families those kinds name
    transports: set[str] = field(default_factory=set)
    reachable: bool | None = None
    error: str = ""

    @property
    def key(self) -> tuple:
        return host_key(self.address, self.local, self.ssh)

    @property
    def engines(self) -> list[Process]:
        return [x for x in self.processes if x.role != "router"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.label,
            "address": self.address,
            "local": self.local,
            "ssh_port": None if self.local else self.ssh.get("port"),
            "processes": [x.name for x in self.processes],
            "devices": sorted(self.device_kinds),
            "probe_families": sorted(self.families),
            "transports": sorted(self.transports),
            "reachable": self.reachable,
            "error": self.error,
        }


@dataclass
class CheckReport:
    results: list[CheckResult]
    hosts: list[HostTarget]
    pairs: list[str]
    elapsed_s: float
    fast: bool = False

    @property
    def failed(self) -> bool:
        return has_failure(self.results)

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Status}
        for r in self.results:
            out[r.status.value] += 1
        return out

    def groups(self) -> list[tuple[str, str, list[CheckResult]]]:
        """``(kind, target, results)`` in report order: hosts, pairs, cluster."""
        by_target: dict[str, list[CheckResult]] = {}
        for r in self.results:
            by_target.setdefault(r.target, []).append(r)
        out = []
        for h in self.hosts:
            if h.label in by_target:
                out.append(("host", h.label, by_target.pop(h.label)))
        for pair in self.pairs:
            if pair in by_target:
                out.append(("pair", pair, by_target.pop(pair)))
        for target, rs in by_target.items():
            out.append(("cluster" if target == "cluster" else "other", target, rs))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.failed,
            "fast": self.fast,
            "elapsed_s": round(self.elapsed_s, 3),
            "counts": self.counts(),
            "hosts": [h.to_dict() for h in self.hosts],
            "pairs": list(self.pairs),
            "results": [_jsonable(r.to_dict()) for r in self.results],
        }


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


# ------------------------------------------------------------------------------ the hosts


def group_hosts(plan: Plan) -> list[HostTarget]:
    """The plan's machines in plan order. Two entries share an address only when they are
    reached differently (e.g. simulated hosts: one sshd port each); their labels then carry
    the SSH port."""
    targets: dict[tuple, HostTarget] = {}
    for proc in plan.processes:
        ssh = proc.ssh.model_dump()
        key = host_key(proc.host, proc.local, ssh)
        t = targets.get(key)
        if t is None:
            t = targets[key] = HostTarget(proc.host, proc.host, proc.local, ssh, [])
        t.processes.append(proc)
    per_address: dict[str, int] = {}
    for t in targets.values():
        per_address[t.address] = per_address.get(t.address, 0) + 1
    for t in targets.values():
        if per_address[t.address] > 1:
            t.label = f"{t.address} (local)" if t.local else f"{t.address}:ssh{t.ssh.get('port')}"
        t.device_kinds = {x.device for x in t.engines if x.device}
        t.families = families_of(t.device_kinds)
        t.transports = _transports(plan, t)
    return list(targets.values())


def _transports(plan: Plan, t: HostTarget) -> set[str]:
    """Transport features the host's engines use: UCX under NIXL, and RDMA where their
    UCX_TLS puts traffic on an RDMA port."""
    if plan.kv_connector != "nixl" or not t.engines:
        return set()
    if any(uses_rdma(x.ucx_tls) for x in t.engines):
        return {"ucx", "rdma"}
    return {"ucx"}


def _python(t: HostTarget) -> str:
    for proc in t.processes:
        if proc.env.get(PYTHON_ENV):
            return _login_path(proc.env[PYTHON_ENV], t.local)
    for proc in t.engines:
        if proc.vllm_bin and "/" in proc.vllm_bin:
            return _login_path(posixpath.join(posixpath.dirname(proc.vllm_bin), "python"), t.local)
    return "python3"


def _login_path(path: str, local: bool) -> str:
    """Probe commands quote their interpreter, so ``~`` would not expand: on a local host
    expand it here, on an SSH host make it relative to the login directory (home)."""
    if path.startswith("~/"):
        return os.path.expanduser(path) if local else path[2:]
    return path


def host_facts(plan: Plan, t: HostTarget) -> HostFacts:
    return HostFacts(t.label, tuple(t.processes), plan.kv_connector, plan.vllm_version, _python(t))


# ------------------------------------------------------------------------------- jobs


@dataclass
class _Job:
    """One command in a host's batch and how to turn its output into results."""

    command: str
    timeout: float
    evaluate: Callable[[CommandOutput], list[CheckResult]]
    name: str  # for timeout messages
    required: bool = True
    target: str = ""
    probe: Probe | None = None


def _probe_job(probe: Probe, target: str, call: Call) -> _Job:
    ctx = ProbeContext(target, call.required, call.params)
    return _Job(
        probe.render(call.params),
        probe.timeout_s,
        lambda out: probe.judge(out, ctx),
        probe.id,
        call.required,
        target,
        probe,
    )


def host_jobs(plan: Plan, t: HostTarget, opts: CheckOptions) -> list[_Job]:
    """Every job the plan needs on host ``t``: the probes its families and transports
    select, each with the calls its parameter builder makes of the host's plan facts."""
    facts = host_facts(plan, t)
    return [
        _probe_job(probe, t.label, call)
        for probe in select_probes(t.families, t.transports, scope="host", fast_only=opts.fast)
        for call in probe.calls(facts)
    ]


# ------------------------------------------------------------------------------- pairs


@dataclass(frozen=True)
class _Reach:
    source: str  # process name
    dest: str  # process name
    address: str
    port: int
    purpose: str

    @property
    def label(self) -> str:
        return f"{self.source} -> {self.dest}"


def reach_pairs(plan: Plan) -> list[_Reach]:
    """Who must connect to whom: decode -> every prefill NIXL side channel (or Mooncake
    producer port), router -> every instance HTTP API, DP worker node -> its master's RPC."""
    out: list[_Reach] = []
    prefill, decode = plan.by_role("prefill"), plan.by_role("decode")
    for d in decode:
        for pf in prefill:
            # decode dials the side-channel host the plan advertises (nodeenv: the node's
            # hosts.<h>.address, else its host)
            for pp in pf.ports:
                if pp.kind in ("nixl_side_channel", "mooncake_kv"):
                    dest = (pf.kv_host or pf.host) if pp.kind == "nixl_side_channel" else pf.host
                    out.append(_Reach(d.name, pf.name, dest, pp.port, pp.purpose))
    for r in plan.by_role("router"):
        for proc in [*prefill, *decode]:
            for pp in proc.ports:
                if pp.kind == "http":
                    out.append(_Reach(r.name, proc.name, proc.host, pp.port, pp.purpose))
    for proc in [*prefill, *decode]:
        if proc.node_index == 0:
            continue
        for m in plan.processes:
            if m.instance == proc.instance and m.node_index == 0:
                for pp in m.ports:
                    if pp.kind == "dp_rpc":
                        out.append(_Reach(proc.name, m.name, m.host, pp.port, pp.purpose))
    return out


def _reach_job(
    reaches: list[_Reach], python: str, timeout: float, held: set[tuple[str, int]] = frozenset()
) -> _Job:
    """Every reachability test of one source host in one interpreter; each target's line
    is judged by the single-target probe's evaluator. ``held``: targets pdlaunch listened on
    during the test (there, "refused" is a firewall's answer, not an empty port)."""
    targets = sorted({(r.address, r.port) for r in reaches})

    def evaluate(out: CommandOutput) -> list[CheckResult]:
        lines = split_reach_batch(out.stdout)
        results = []
        for r in reaches:
            params = {"host": r.address, "port": r.port, "held": (r.address, r.port) in held}
            ctx = ProbeContext(r.label, True, params)
            one = CommandOutput(out.rc, lines.get((r.address, r.port), ""), out.stderr)
            for res in REACH.judge(one, ctx):
                results.append(replace(res, message=f"{r.purpose}: {res.message}"))
        return results

    return _Job(
        reach_batch_command(python, timeout, targets),
        REACH.timeout_s + timeout,
        evaluate,
        REACH.id,
        True,
        "",
        REACH,
    )


# ------------------------------------------------------------------------- batch runner


def batch_script(jobs: list[_Job], boundary: str) -> str:
    """One sh script that runs every job in parallel (each in its own ``sh -c``, under
    ``timeout`` when the host has it) and prints each job's stdout, stderr and exit status
    between ``boundary`` marker lines."""
    b = shlex.quote(boundary)
    lines = [
        'd=$(mktemp -d "${TMPDIR:-/tmp}/pdlaunch-check.XXXXXX") || exit 99',
        "trap 'rm -rf \"$d\"' EXIT",
        "if command -v timeout >/dev/null 2>&1; then T=timeout; else T=; fi",
    ]
    for i, job in enumerate(jobs):
        c = shlex.quote(job.command)
        t = max(1, int(job.timeout + 0.999))
        f = f'"$d/{i}'
        lines.append(
            f"printf '%s %d out\\n' {b} {i} >{f}.a\"; printf '\\n%s %d err\\n' {b} {i} >{f}.c\"; "
            f'{{ if [ -n "$T" ]; then timeout -k 2 {t} sh -c {c}; else sh -c {c}; fi; '
            f'printf \'\\n%s %d rc %d\\n\' {b} {i} $? >{f}.e"; }} </dev/null >{f}.b" 2>{f}.d" &'
        )
    lines.append("wait")
    # every job's framing and output in one `cat` (few processes per host matter when many
    # simulated hosts share one machine); a job that never finished has no .e file
    files = " ".join(f'"$d/{i}.{x}"' for i in range(len(jobs)) for x in "abcde")
    lines.append(f"cat {files} 2>/dev/null")
    return "\n".join(lines) + "\n"


def parse_batch(text: str, boundary: str, n: int) -> dict[int, CommandOutput]:
    """Inverse of :func:`batch_script`: ``{job index: CommandOutput}`` for the jobs that
    reported back."""
    marker = re.compile(rf"^{re.escape(boundary)} (\d+) (out|err|rc)(?: (-?\d+))?$", re.M)
    parts: dict[int, dict[str, Any]] = {}
    matches = list(marker.finditer(text))
    for k, m in enumerate(matches):
        i, kind = int(m.group(1)), m.group(2)
        slot = parts.setdefault(i, {})
        if kind == "rc":
            slot["rc"] = int(m.group(3)) if m.group(3) is not None else 255
            continue
        start = m.end() + 1
        end = matches[k + 1].start() if k + 1 < len(matches) else len(text)
        chunk = text[start:end]
        slot[kind] = chunk[:-1] if chunk.endswith("\n") else chunk
    return {
        i: CommandOutput(s["rc"], s.get("out", ""), s.get("err", ""))
        for i, s in parts.items()
        if "rc" in s and i < n
    }


def run_jobs(host: Host, jobs: list[_Job], label: str) -> list[CheckResult]:
    """Run ``jobs`` on ``host`` in one round trip and evaluate them."""
    if not jobs:
        return []
    boundary = f"@@pdlaunch-check-{uuid.uuid4().hex}"
    limit = max(j.timeout for j in jobs) + 15
    try:
        res = host.run(batch_script(jobs, boundary), timeout=limit)
    except HostError as exc:
        return [
            CheckResult(
                j.name,
                j.target or label,
                Status.FAIL,
                f"probe could not run: {exc}",
                "check the host is healthy and reachable, then rerun `pdlaunch check`",
            )
            for j in jobs
        ]
    outputs = parse_batch(res.stdout, boundary, len(jobs))
    results: list[CheckResult] = []
    for i, job in enumerate(jobs):
        out = outputs.get(i)
        if out is None:
            detail = (res.stderr.strip() or res.stdout.strip())[-300:]
            results.append(
                CheckResult(
                    job.name,
                    job.target or label,
                    Status.FAIL,
                    f"probe produced no report (batch rc={res.rc}): {detail}",
                    "the host needs a POSIX sh, mktemp and cat",
                )
            )
        elif out.rc == TIMEOUT_RC:
            results.append(
                CheckResult(
                    job.name,
                    job.target or label,
                    Status.FAIL if job.required else Status.WARN,
                    f"probe timed out after {job.timeout:g}s",
                    f"run it by hand on the host: {job.command[:160]}",
                )
            )
        else:
            results.extend(job.evaluate(out))
    return results


# ------------------------------------------------------------------------------- phases


class _Pool:
    """The hosts of one check: the caller's connected HostPool (`up` hands its own, so its
    preflight opens no second connection per host), else one opened here and closed after."""

    def __init__(self, opts: CheckOptions, pool: HostPool | None = None):
        self._own = pool is None
        self.pool = HostPool(opts.connect) if pool is None else pool

    def get(self, t: HostTarget) -> Host:
        return self.pool.get(t.address, t.local, t.ssh)

    def close(self) -> None:
        if self._own:
            self.pool.close()


def _parallel(fn: Callable[[Any], Any], items: Iterable[Any], workers: int) -> list[Any]:
    items = list(items)
    if not items:
        return []
    if len(items) == 1:
        return [fn(items[0])]
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as ex:
        return list(ex.map(fn, items))


def _connect_fail(t: HostTarget) -> CheckResult:
    port = t.ssh.get("port")
    user = t.ssh.get("user")
    login = f"{user + '@' if user else ''}{t.address}"
    return CheckResult(
        "host.connect",
        t.label,
        Status.FAIL,
        t.error,
        "check the address and SSH settings in the topology, then try "
        f"`ssh {f'-p {port} ' if port else ''}{login} true`",
    )


def _hold_ports(
    reaches: list[_Reach],
    by_proc: Mapping[str, HostTarget],
    opened: Mapping[tuple, Host],
    opts: CheckOptions,
) -> tuple[set[tuple[str, int]], list[tuple[Host, int | None, Any]]]:
    """Start a listener on every reach target's host (one process per host) on the planned
    ports that are free; returns the (address, port) pairs held and (host, pid) to stop."""
    by_dest: dict[tuple, list[tuple[str, int]]] = {}
    for r in reaches:
        t = by_proc[r.dest]
        if t.key in opened:
            by_dest.setdefault(t.key, []).append((r.address, r.port))
    targets = {t.key: t for t in by_proc.values()}
    held: set[tuple[str, int]] = set()
    holders: list[tuple[Host, int | None, Any]] = []
    lock = threading.Lock()

    def one(key: tuple) -> None:
        host, ports = opened[key], sorted(set(by_dest[key]))
        cmd = hold_command(_python(targets[key]), ports, opts.reach_timeout + 60)
        try:
            stream = host.open_stream(cmd)
        except HostError:
            return  # judged as before: "refused" then means nothing listens
        buf, deadline, pid = b"", time.monotonic() + 30, None
        while b"ready\n" not in buf and time.monotonic() < deadline:
            chunk = stream.read(0.5)
            if chunk is None:
                break
            buf += chunk
        lines = buf.decode(errors="replace").splitlines()
        if lines and lines[0].strip().isdigit():
            pid = int(lines[0])
        with lock:
            # The stream stays open until release: closing it kills a local holder at once.
            holders.append((host, pid, stream))
            for line in lines:
                parts = line.split()
                if len(parts) == 3 and parts[0] == "held" and "ready" in lines:
                    held.add((parts[1], int(parts[2])))

    _parallel(one, list(by_dest), opts.max_workers)
    return held, holders


def _release(holders: list[tuple[Host, int | None, Any]]) -> None:
    """Stop every port holder, all hosts at once (one after another cost 5 s at 32 hosts)."""

    def release_one(holder: tuple[Host, int | None, Any]) -> None:
        host, pid, stream = holder
        if pid is not None:
            with contextlib.suppress(HostError):
                host.run(f"kill {int(pid)} 2>/dev/null; true", timeout=30)
        stream.close()

    _parallel(release_one, holders, max(1, len(holders)))


def _skip_pair(label: str, probe: str, why: str) -> CheckResult:
    return CheckResult(probe, label, Status.SKIP, f"not run: {why}")


def run_check(
    plan: Plan, opts: CheckOptions | None = None, *, pool: HostPool | None = None
) -> CheckReport:
    """Check every host and pair of ``plan``; never raises for host problems. ``pool``:
    hosts already connected (left open); without it the check opens and closes its own."""
    opts = opts or CheckOptions()
    t0 = time.monotonic()
    hosts = group_hosts(plan)
    jobs = {t.key: host_jobs(plan, t, opts) for t in hosts}
    by_proc = {proc.name: t for t in hosts for proc in t.processes}
    reaches = reach_pairs(plan)
    pairs: list[str] = []
    for r in reaches:
        if r.label not in pairs:
            pairs.append(r.label)
    pools = _Pool(opts, pool)
    opened: dict[tuple, Host] = {}
    lock = threading.Lock()
    try:
        # -- phase 1: connect + host probes + reachability, one thread per host
        def phase1(t: HostTarget) -> list[CheckResult]:
            mine = [r for r in reaches if by_proc[r.source] is t]
            try:
                host = pools.get(t)
            except HostError as exc:
                t.reachable, t.error = False, str(exc)
                return [_connect_fail(t)] + [
                    _skip_pair(r.label, REACH.id, f"{t.label} unreachable") for r in mine
                ]
            t.reachable = True
            with lock:
                opened[t.key] = host
            return run_jobs(host, list(jobs[t.key]), t.label)

        per_host = _parallel(phase1, hosts, opts.max_workers)
        results = [r for rs in per_host for r in rs]

        # -- phase 1b: reachability, after the free-port probes: every target port that is
        # free is held by a listener while its peers connect, then released
        held, holders = _hold_ports(reaches, by_proc, opened, opts)
        try:

            def reach(t: HostTarget) -> list[CheckResult]:
                mine = [r for r in reaches if by_proc[r.source] is t]
                if not mine or t.key not in opened:  # phase 1 said why for unreachable ones
                    return []
                job = _reach_job(mine, _python(t), opts.reach_timeout, held)
                return run_jobs(opened[t.key], [job], t.label)

            results += [r for rs in _parallel(reach, hosts, opts.max_workers) for r in rs]
        finally:
            _release(holders)

        # -- phase 2: pairs that need phase-1 facts or a peer process (with --fast, only
        # the pair probes marked fast: the Ascend NPU ping the guide runs before PD)
        results += _pair_probes(plan, by_proc, opened, results, opts, pairs)
        if opts.bandwidth and not opts.fast:
            results += _bandwidth(plan, by_proc, opened, opts, pairs)

        # -- cluster-wide
        results += _cluster(hosts, jobs, results)
    finally:
        pools.close()
    return CheckReport(results, hosts, pairs, time.monotonic() - t0, opts.fast)


def _cluster(
    hosts: list[HostTarget], jobs: Mapping[tuple, list[_Job]], results: list[CheckResult]
) -> list[CheckResult]:
    """Each probe's cross-host comparison, over the hosts it was planned on (reachable or
    not: a host that never reported is part of what the comparison says)."""
    out: list[CheckResult] = []
    for probe in registry.PROBES:
        if probe.cluster is None:
            continue
        planned = [t.label for t in hosts if any(j.probe is probe for j in jobs[t.key])]
        if planned:
            out += probe.cluster(planned, [r for r in results if r.probe == probe.id])
    return out


def _pair_applies(probe: Probe, src: HostTarget, dst: HostTarget, a: Process, b: Process) -> bool:
    families = families_of([a.device] if a.device else []) & families_of(
        [b.device] if b.device else []
    )
    return probe.needs.matches(probe.family, families, src.transports & dst.transports)


def _pair_probes(
    plan: Plan,
    by_proc: dict[str, HostTarget],
    opened: dict[tuple, Host],
    results: list[CheckResult],
    opts: CheckOptions,
    pairs: list[str],
) -> list[CheckResult]:
    """Pair probes with a ``pair_call``, per prefill -> decode process pair both of whose
    device kinds (and hosts' transports) the probe needs; run on the prefill host."""
    jobs: dict[tuple, list[_Job]] = {}
    out: list[CheckResult] = []
    for probe in registry.PROBES:
        if probe.scope != "pair" or probe.pair_call is None:
            continue
        if (probe.optional and not opts.bandwidth) or (opts.fast and not probe.fast):
            continue
        for pf in plan.by_role("prefill"):
            for d in plan.by_role("decode"):
                src, dst = by_proc[pf.name], by_proc[d.name]
                if not _pair_applies(probe, src, dst, pf, d):
                    continue
                label = f"{pf.name} -> {d.name}"
                if label not in pairs:
                    pairs.append(label)
                if not src.reachable:
                    out.append(_skip_pair(label, probe.id, f"{src.label} unreachable"))
                    continue
                on_dst = [r for r in results if r.target == dst.label]
                call = probe.pair_call(pf, d, dst.label, on_dst)
                if isinstance(call, str):
                    out.append(_skip_pair(label, probe.id, call))
                    continue
                jobs.setdefault(src.key, []).append(_probe_job(probe, label, call))

    def one(key: tuple) -> list[CheckResult]:
        return run_jobs(opened[key], jobs[key], "")

    for rs in _parallel(one, list(jobs), opts.max_workers):
        out += rs
    return out


def _bandwidth(
    plan: Plan,
    by_proc: dict[str, HostTarget],
    opened: dict[tuple, Host],
    opts: CheckOptions,
    pairs: list[str],
) -> list[CheckResult]:
    """``ib_write_bw`` per prefill host -> decode host (server on decode), one at a time:
    the server listens on perftest's default port and measurements must not overlap."""
    probe = IB_WRITE_BW
    out: list[CheckResult] = []
    done: set[tuple] = set()
    for pf in plan.by_role("prefill"):
        for d in plan.by_role("decode"):
            src, dst = by_proc[pf.name], by_proc[d.name]
            if not _pair_applies(probe, src, dst, pf, d):
                continue
            if (src.key, dst.key) in done:
                continue
            done.add((src.key, dst.key))
            label = f"{pf.name} -> {d.name}"
            if label not in pairs:
                pairs.append(label)
            if not (src.reachable and dst.reachable):
                out.append(_skip_pair(label, probe.id, "a host of the pair is unreachable"))
                continue
            out += _one_bandwidth(label, opened[src.key], opened[dst.key], src, dst, d.host, opts)
    return out


def _first_hca(t: HostTarget) -> dict[str, Any]:
    hcas = planned_hcas(t.engines)
    return {"device": hcas[0].split(":")[0]} if hcas else {}


def _one_bandwidth(
    label: str,
    client: Host,
    server: Host,
    src: HostTarget,
    dst: HostTarget,
    server_address: str,
    opts: CheckOptions,
) -> list[CheckResult]:
    probe = IB_WRITE_BW
    server_cmd = server_command(_first_hca(dst))
    box: dict[str, Any] = {}

    def serve() -> None:
        try:
            box["res"] = server.run(server_cmd, timeout=60)
        except HostError as exc:
            box["err"] = str(exc)

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    time.sleep(1.0)
    params: dict[str, Any] = {"server": server_address, **_first_hca(src)}
    if opts.min_bandwidth_gbps is not None:
        params["min_gbps"] = opts.min_bandwidth_gbps
    if "res" in box and box["res"].rc == 127:
        th.join()
        return [
            CheckResult(
                probe.id, label, Status.SKIP, f"ib_write_bw not found on {dst.label} (server)"
            )
        ]
    job = _probe_job(probe, label, Call(params, required=False))
    res = run_jobs(client, [job], label)
    th.join(timeout=70)
    return res
