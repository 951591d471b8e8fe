"""Findings from gathered evidence: pure functions, no I/O.

* :func:`match` runs the signature table (:mod:`.signatures`) over one process's log lines and
  reports each signature once per process, with the first matching line, its number in the
  tail, and how many lines matched (a dead peer can log the same failure thousands of times).
* :func:`metrics_findings` reads an engine's ``/metrics``: the same counters the ``up`` canary
  reads (``vllm:prompt_tokens_by_source_total``, parsed by
  :func:`pdlaunch.observe.health.metric_sum`)
  show a decode that recomputes prompts instead of loading KV, with no log line to say so.
* :func:`plan_findings` joins a finding with the plan: a router whose pooled connections are
  closed under it, and engines that keep vLLM's 5 s keep-alive.

Finding mirrors :class:`pdlaunch.rules.base.Finding` (id, severity, message, fix, source,
where) plus what a log finding needs: process, host, line, line number, count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pdlaunch.doctor import nongen
from pdlaunch.doctor.evidence import Evidence, ProcessEvidence
from pdlaunch.doctor.signatures import Severity, Signature, signatures
from pdlaunch.observe import lease_budget
from pdlaunch.observe.health import PROMPT_TOKENS_BY_SOURCE, metric_sum
from pdlaunch.plan import lease as kvlease
from pdlaunch.plan.build import Plan

Kind = Literal["log", "metrics", "plan", "collect"]

# CSI sequences: vllm-router colours its log even when it goes to a file.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
MAX_LINE = 400

# vLLM's default idle keep-alive (vllm/envs.py:1143) and vllm-router's pool idle timeout
# (src/server.rs: pool_idle_timeout 50 s).
VLLM_KEEP_ALIVE_S = 5
ROUTER_POOL_IDLE_S = 50
KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    process: str
    host: str
    what: str
    cause: str
    fix: str
    source: str
    kind: Kind = "log"
    line: str = ""  # the first matching log line, cleaned and trimmed
    line_no: int | None = None  # 1-based, in the collected tail (the bundle's log file)
    last_line_no: int | None = None
    count: int = 1

    @property
    def where(self) -> str:
        at = f"{self.process}@{self.host}" if self.host else self.process
        return f"{at}:{self.line_no}" if self.line_no else at

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "where": self.where}


@dataclass(frozen=True)
class Check:
    """A finding that needs no log line (metrics, plan, collection): documented like a
    signature so docs/doctor.md lists both."""

    id: str
    severity: Severity
    applies_to: tuple[str, ...]
    kind: Kind
    what: str
    cause: str
    fix: str
    source: str

    def finding(self, process: str, host: str, what: str) -> Finding:
        return Finding(
            self.id, self.severity, process, host, what, self.cause, self.fix, self.source,
            self.kind,
        )  # fmt: skip


_NIXL_STATS = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py"
CHECKS: tuple[Check, ...] = (
    Check(
        "decode-recomputes",
        "error",
        ("decode",),
        "metrics",
        "Decode computes prompts itself instead of loading them over the KV connector.",
        "Its /metrics count prompt tokens by source: `local_compute` grows while "
        "`external_kv_transfer` does not. The router is not in P/D mode, prefill does not "
        "hand out KV (kv_transfer_params), or every transfer fails and is recomputed.",
        "Check the router findings (router-no-kv-transfer-params) and the decode log for "
        "handshake and transfer failures; `pdlaunch up` runs a canary that proves transfer.",
        "vllm/v1/metrics/loggers.py:758 (vllm:prompt_tokens_by_source)",
    ),
    Check(
        "nixl-failed-transfers",
        "error",
        ("prefill", "decode"),
        "metrics",
        "NIXL transfers failed on this engine.",
        "vllm:nixl_num_failed_transfers counts failed KV reads, handshakes and notifications; "
        "the log has the individual failures unless it rotated.",
        "See the NIXL findings of this engine; `pdlaunch check` for the fabric.",
        f"{_NIXL_STATS}:244",
    ),
    Check(
        "kv-expired-requests",
        "warning",
        ("prefill",),
        "metrics",
        "Prefill freed KV that decode had not read when its lease expired.",
        "vllm:nixl_num_kv_expired_reqs counts requests whose KV lease (kv_lease_duration, "
        "default 30 s) ran out on prefill.",
        "Raise `kv_connector.kv_lease_duration`, or add decode capacity.",
        f"{_NIXL_STATS}:266",
    ),
    Check(
        "kv-lease-budget",
        "warning",
        ("decode",),
        "metrics",
        "Decode comes for its KV late enough that leases will start to expire.",
        "The p99 gap between prefill finishing and decode reading the blocks (estimated from "
        "decode's request_queue_time_seconds histogram plus its HTTP frontend mean; the "
        "router's hand-off is not in any engine metric) is at least half the lease prefill "
        "holds them for (kv_lease_duration, default 30 s; decode heartbeats renew it only "
        "after its handshake with that prefill).",
        "Raise `kv_connector.kv_lease_duration` above the measured p99 gap with margin, or "
        "find what delays decode (`pdlaunch bench` breaks the time down per hop).",
        "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:82-88; "
        "base_worker.py:3014-3061,3179-3195",
    ),
    Check(
        "notifications-after-expiry",
        "error",
        ("prefill",),
        "metrics",
        "Decode read KV blocks after prefill had freed them: answers may be wrong.",
        "vllm:nixl_num_notifications_after_expiry counts reads completed for requests whose "
        "lease had expired; their blocks may have been reused.",
        "Raise `kv_connector.kv_lease_duration`; treat answers served then as suspect.",
        f"{_NIXL_STATS}:276",
    ),
    Check(
        "keepalive-mismatch",
        "warning",
        ("prefill", "decode"),
        "plan",
        "Engines close idle HTTP connections before vllm-router stops reusing them.",
        f"vLLM closes an idle connection after {KEEP_ALIVE_ENV} seconds (default "
        f"{VLLM_KEEP_ALIVE_S}); vllm-router keeps idle upstream connections pooled for "
        f"{ROUTER_POOL_IDLE_S} s and fails a request sent on one the engine is closing "
        "(router-upstream-closed).",
        f"Set `{KEEP_ALIVE_ENV}` above {ROUTER_POOL_IDLE_S} on every engine, e.g. "
        f'`defaults: {{env: {{{KEEP_ALIVE_ENV}: "75"}}}}`.',
        "vllm/envs.py:1143; vllm/entrypoints/launchers/api_server/entry.py:153; "
        "vllm-project/router src/server.rs (pool_idle_timeout)",
    ),
    Check(
        "log-unreadable",
        "warning",
        ("any",),
        "collect",
        "The process's log could not be read.",
        "The host is unreachable, or the log file is gone or not readable.",
        "`pdlaunch status`; read the log on the host (`pdlaunch logs`).",
        "pdlaunch hosts layer (Host.read_log)",
    ),
    Check(
        "process-dead",
        "error",
        ("any",),
        "collect",
        "A recorded process is not running.",
        "It exited or was killed after `up` started it (its log's last lines usually say "
        "why); the deployment cannot serve without it.",
        "Read its log (`pdlaunch logs`), then `pdlaunch up` again (it starts what is "
        "missing) or `pdlaunch down`.",
        "pdlaunch survey (launch/records.py)",
    ),
    Check(
        "process-partly-dead",
        "error",
        ("any",),
        "collect",
        "A recorded process's leader is gone while members of its process group still run.",
        "The API server (the recorded pid) died or was killed, and its children (vLLM's "
        "EngineCore and workers: GPU memory, the NIXL side-channel port) were left running.",
        "`pdlaunch down` (or `pdlaunch up`, which stops them first) stops the whole group.",
        "pdlaunch survey (launch/records.py)",
    ),
    Check(
        "process-unverified",
        "warning",
        ("any",),
        "collect",
        "Whether a recorded process runs could not be checked.",
        "Its host could not be asked (unreachable, login refused).",
        "Fix the connection, then `pdlaunch status`.",
        "pdlaunch survey (launch/records.py)",
    ),
    Check(
        "metrics-unreachable",
        "warning",
        ("any",),
        "collect",
        "The process's /metrics did not answer.",
        "The process is down, still starting, or not reachable from the control host.",
        "`pdlaunch status`; check the process's log.",
        "pdlaunch.observe.health",
    ),
)
CHECKS_BY_ID = {c.id: c for c in CHECKS}


# -- log lines ------------------------------------------------------------------------------------
def clean(line: str) -> str:
    """A log line as matched: colour codes and trailing whitespace (and ``\\r``) removed."""
    return _ANSI.sub("", line).rstrip()


def trim(line: str, limit: int = MAX_LINE) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


def match(
    lines: Iterable[str],
    role: str,
    process: str,
    host: str = "",
    table: Sequence[Signature] | None = None,
) -> list[Finding]:
    """One finding per signature that matched a line of ``lines`` (a process's log, oldest
    first), for the signatures that apply to ``role``; ordered by first occurrence. A
    signature whose ``superseded_by`` matched too is left out (the specific one explains it)."""
    table = signatures() if table is None else table
    applicable = [s for s in table if s.applies(role)]
    first: dict[str, tuple[int, str, dict[str, str | None]]] = {}
    last: dict[str, int] = {}
    counts: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        text = clean(raw)
        if not text:
            continue
        for sig in applicable:
            m = sig.regex.search(text)
            if m is None:
                continue
            if sig.id not in first:
                first[sig.id] = (number, text, m.groupdict())
            last[sig.id] = number
            counts[sig.id] = counts.get(sig.id, 0) + 1
    by_id = {s.id: s for s in applicable}
    out = []
    for sid, (number, text, groups) in first.items():
        sig = by_id[sid]
        if any(other in first for other in sig.superseded_by):
            continue
        out.append(
            Finding(
                id=sid,
                severity=sig.severity,
                process=process,
                host=host,
                what=sig.describe(groups),
                cause=sig.cause,
                fix=sig.fix,
                source=sig.source,
                kind="log",
                line=trim(text),
                line_no=number,
                last_line_no=last[sid],
                count=counts[sid],
            )
        )
    return sorted(out, key=lambda f: f.line_no or 0)


# -- metrics --------------------------------------------------------------------------------------
_COUNTERS = (
    ("nixl-failed-transfers", "vllm:nixl_num_failed_transfers_total", "failed NIXL transfer(s)"),
    ("kv-expired-requests", "vllm:nixl_num_kv_expired_reqs_total", "request(s) with expired KV"),
    (
        "notifications-after-expiry",
        "vllm:nixl_num_notifications_after_expiry_total",
        "read(s) of expired KV",
    ),
)


def _has(text: str, name: str) -> bool:
    return any(line.startswith(name) for line in text.splitlines())


def metrics_findings(
    process: str,
    role: str,
    host: str,
    before: str,
    after: str | None = None,
    interval: float = 0.0,
) -> list[Finding]:
    """Findings from one engine's /metrics text; with ``after`` (a second snapshot taken
    ``interval`` seconds later) counters are judged by how they moved in between, otherwise
    by their totals since the engine started."""
    if role not in ("prefill", "decode"):
        return []
    out: list[Finding] = []
    window = f" in {interval:g} s" if after is not None and interval else ""
    if role == "decode" and _has(before, PROMPT_TOKENS_BY_SOURCE):

        def tokens(text: str, source: str) -> float:
            return metric_sum(text, PROMPT_TOKENS_BY_SOURCE, source=source)

        ext, local = tokens(before, "external_kv_transfer"), tokens(before, "local_compute")
        if after is not None:
            ext = tokens(after, "external_kv_transfer") - ext
            local = tokens(after, "local_compute") - local
        # One locally computed token per request is normal (the canary allows it too).
        if local > 1 and ext <= 0:
            span = window or " since it started"
            out.append(
                CHECKS_BY_ID["decode-recomputes"].finding(
                    process,
                    host,
                    f"Decode computed {local:g} prompt tokens itself{span} and loaded none "
                    "over the KV connector (external_kv_transfer did not grow).",
                )
            )
    for check_id, name, noun in _COUNTERS:
        check = CHECKS_BY_ID[check_id]
        if role not in check.applies_to or not _has(before, name):
            continue
        total = metric_sum(after if after is not None else before, name)
        if total <= 0:
            continue
        grew = ""
        if after is not None:
            grew = f" (+{total - metric_sum(before, name):g}{window})"
        out.append(check.finding(process, host, f"{total:g} {noun} since start{grew}."))
    return out


def lease_findings(processes: Sequence[ProcessEvidence], plan: Plan | None) -> list[Finding]:
    """kv-lease-budget: each decode's p99 gap (over the doctor's window, else since start)
    against the shortest lease of the plan's prefills (kvlease.py)."""
    lease = kvlease.plan_lease(plan) if plan is not None else None
    if lease is None:
        return []
    out = []
    for p in processes:
        if p.role != "decode" or p.metrics is None:
            continue
        before, after = (p.metrics, p.metrics_after) if p.metrics_after else (None, p.metrics)
        warning = lease_budget.budget_warning(lease_budget.decode_gap(p.name, before, after), lease)
        if warning:
            out.append(CHECKS_BY_ID["kv-lease-budget"].finding(p.name, p.host, warning))
    return out


# -- plan -----------------------------------------------------------------------------------------
def plan_findings(findings: Sequence[Finding], plan: Plan | None) -> list[Finding]:
    """Findings that join a log finding with the plan: a router whose pooled connections an
    engine closed (router-upstream-closed) names the engines that keep a keep-alive shorter
    than the router's pool idle time."""
    if plan is None or not any(f.id == "router-upstream-closed" for f in findings):
        return []
    short = []
    for p in plan.processes:
        if p.role not in ("prefill", "decode"):
            continue
        raw = p.env.get(KEEP_ALIVE_ENV)
        try:
            value = int(raw) if raw is not None else VLLM_KEEP_ALIVE_S
        except ValueError:
            continue  # not a number: vLLM itself refuses to start, another finding says so
        if value <= ROUTER_POOL_IDLE_S:
            short.append(f"{p.name} ({value} s)")
    if not short:
        return []
    router = plan.router
    return [
        CHECKS_BY_ID["keepalive-mismatch"].finding(
            router.name,
            router.host,
            f"Engines close idle connections after {', '.join(short)}; vllm-router keeps "
            f"them {ROUTER_POOL_IDLE_S} s.",
        )
    ]


# -- a whole deployment ---------------------------------------------------------------------------
_RUNNING_CHECKS = {
    "dead": "process-dead",
    "partly dead": "process-partly-dead",
    "unknown": "process-unverified",
}


def process_findings(p: ProcessEvidence) -> list[Finding]:
    out: list[Finding] = []
    check = _RUNNING_CHECKS.get(p.running or "")
    if check is not None:
        detail = f": {p.running_detail}" if p.running_detail else ""
        out.append(CHECKS_BY_ID[check].finding(p.name, p.host, f"{p.name} is {p.running}{detail}"))
    if p.log_error is not None:
        out.append(CHECKS_BY_ID["log-unreadable"].finding(p.name, p.host, p.log_error))
    if p.log is not None:
        out += match(p.log, p.role, p.name, p.host)
    if p.metrics_error is not None:
        out.append(CHECKS_BY_ID["metrics-unreachable"].finding(p.name, p.host, p.metrics_error))
    if p.metrics is not None:
        out += metrics_findings(
            p.name, p.role, p.host, p.metrics, p.metrics_after, p.metrics_interval
        )
    return out


def diagnose_evidence(evidence: Evidence, plan: Plan | None = None) -> list[Finding]:
    """Every finding for a deployment: errors first, then by process (in recorded order),
    log findings by line before the others."""
    out: list[Finding] = []
    for p in evidence.processes:
        out += process_findings(p)
    # A router warning that a /tokenize call explains is not a finding (nongen.py).
    out = nongen.explain(out, evidence.processes)
    out += plan_findings(out, plan)
    out += lease_findings(evidence.processes, plan)
    order = {p.name: i for i, p in enumerate(evidence.processes)}
    return sorted(
        out,
        key=lambda f: (
            f.severity != "error",
            order.get(f.process, len(order)),
            f.line_no is None,  # what a log line shows before what metrics or the plan show
            f.line_no or 0,
        ),
    )
