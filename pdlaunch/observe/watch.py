"""A running proof of disaggregation: per process, what its counters did since the last look.

`/health` answering 200 says an engine is up; it does not say the deployment is still
disaggregated. A decode that stops receiving KV (a router that lost prefill, a connector that
fell back to recompute, failed transfers) keeps answering 200 while computing every prompt
itself. These counters, read twice, tell (vLLM 0.32 names):

- ``vllm:request_success_total`` (v1/metrics/loggers.py:809): requests finished;
- ``vllm:prompt_tokens_by_source_total{source}`` (v1/metrics/stats.py): prompt tokens computed
  here (``local_compute``) or loaded over the KV connector (``external_kv_transfer``);
- ``vllm:nixl_num_failed_transfers`` / ``vllm:nixl_num_failed_notifications`` /
  ``vllm:nixl_num_kv_expired_reqs`` (distributed/kv_transfer/kv_connector/v1/nixl/stats.py
  :244-266): NIXL reads that failed, and requests whose KV lease expired before decode read it.

Pure functions over Prometheus text, so every verdict is tested without an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdlaunch.observe import lease_budget
from pdlaunch.observe import metrics as promhist
from pdlaunch.observe.health import PROMPT_TOKENS_BY_SOURCE
from pdlaunch.plan import lease as kvlease

REQUESTS = "vllm:request_success"
FAILED_TRANSFERS = "vllm:nixl_num_failed_transfers"
FAILED_NOTIFICATIONS = "vllm:nixl_num_failed_notifications"
EXPIRED = "vllm:nixl_num_kv_expired_reqs"
# Decode recomputes the last prompt token of a remotely prefilled request (vLLM); more than
# this many locally computed prompt tokens per request means it recomputed the prompt.
LOCAL_TOKENS_PER_DISAGGREGATED_REQUEST = 2


def _counter(text: str, name: str, **labels: str) -> promhist.Reading:
    # prometheus_client exposes a counter `x` as `x_total`; accept either spelling.
    total = promhist.counter(text, name + "_total", **labels)
    bare = promhist.counter(text, name, **labels)
    return promhist.Reading(total.value + bare.value, total.problems + bare.problems)


@dataclass(frozen=True)
class Counters:
    requests: float = 0.0
    local: float = 0.0
    external: float = 0.0
    failed: float = 0.0
    expired: float = 0.0
    # Why these numbers are no evidence (metrics.counter: NaN, infinite, negative, beyond
    # 2**53, a series twice, a line that does not parse), naming the series and its value.
    # Every verdict fails on a non-empty one before it compares a number.
    problems: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, engine: str | None = None) -> Counters:
        """The counters of every engine on the page, or of the one whose ``engine`` label
        (vLLM's data-parallel rank) is ``engine``."""
        only = {} if engine is None else {"engine": engine}
        readings = {
            "requests": _counter(text, REQUESTS, **only),
            "local": promhist.counter(
                text, PROMPT_TOKENS_BY_SOURCE, source="local_compute", **only
            ),
            "external": promhist.counter(
                text, PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer", **only
            ),
            "failed_transfers": _counter(text, FAILED_TRANSFERS, **only),
            "failed_notifications": _counter(text, FAILED_NOTIFICATIONS, **only),
            "expired": _counter(text, EXPIRED, **only),
        }
        problems = tuple(dict.fromkeys(p for r in readings.values() for p in r.problems))
        return cls(
            requests=readings["requests"].value,
            local=readings["local"].value,
            external=readings["external"].value,
            failed=readings["failed_transfers"].value + readings["failed_notifications"].value,
            expired=readings["expired"].value,
            problems=problems,
        )

    @property
    def evidence(self) -> bool:
        return not self.problems

    def no_evidence(self) -> str:
        """Why these counters prove nothing, for a person (one line)."""
        more = len(self.problems) - 3
        return (
            "its /metrics is no evidence: "
            + "; ".join(self.problems[:3])
            + (f" (and {more} more)" if more > 0 else "")
        )

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.requests - other.requests,
            self.local - other.local,
            self.external - other.external,
            self.failed - other.failed,
            self.expired - other.expired,
            tuple(dict.fromkeys(self.problems + other.problems)),
        )


@dataclass(frozen=True)
class WatchRow:
    process: str
    role: str
    delta: Counters
    total: Counters
    flags: list[str] = field(default_factory=list)
    # Not (yet) wrong, but heading there: a KV lease budget running out (kvlease.py).
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.flags


def lease_warnings(
    process: str, role: str, before: str | None, now: str, lease: kvlease.Lease | None
) -> list[str]:
    """A decode whose p99 gap (prefill done -> KV read, estimated from its own /metrics over
    the window) nears the prefills' lease, before any request expires."""
    if role != "decode" or lease is None:
        return []
    warning = lease_budget.budget_warning(lease_budget.decode_gap(process, before, now), lease)
    return [warning] if warning else []


def judge(process: str, role: str, before: Counters, now: Counters) -> WatchRow:
    """One process's row: what changed since ``before``, and what that says."""
    d = now - before
    flags: list[str] = []
    if d.problems:
        flags.append(d.no_evidence())
        return WatchRow(process, role, d, now, flags)
    if d.requests < 0 or d.local < 0 or d.external < 0:
        flags.append("counters went back: the engine restarted")
        return WatchRow(process, role, d, now, flags)
    if role == "decode" and d.requests > 0:
        if d.external <= 0:
            flags.append(
                f"NOT DISAGGREGATED: {d.requests:g} request(s) finished and no prompt token "
                "arrived over the KV connector"
            )
        elif d.local > LOCAL_TOKENS_PER_DISAGGREGATED_REQUEST * d.requests:
            flags.append(
                f"recomputing: {d.local:g} prompt tokens computed here for {d.requests:g} "
                "request(s) (KV load failures fall back to recompute)"
            )
    if d.failed > 0:
        flags.append(f"{d.failed:g} KV transfer(s) failed")
    if d.expired > 0:
        flags.append(
            f"{d.expired:g} request(s) whose KV lease expired before decode read it "
            "(raise kv_lease_duration, or find what stalls between prefill and decode)"
        )
    return WatchRow(process, role, d, now, flags)
