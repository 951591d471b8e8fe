"""What the doctor gathered from a deployment: per process its log tail and /metrics, per host
its software versions. Plain records, filled by :mod:`.collect` and read by :mod:`.diagnose`
and :mod:`.bundle` (tests build them by hand)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProcessEvidence:
    name: str
    role: str  # prefill | decode | router
    host: str
    log_path: str = ""
    metrics_url: str | None = None
    # The last lines of the log, without their newlines; None when it could not be read.
    log: list[str] | None = None
    log_error: str | None = None
    # /metrics text; `metrics_after` is a second snapshot when an interval was asked for,
    # so counters can be compared over it.
    metrics: str | None = None
    metrics_after: str | None = None
    metrics_interval: float = 0.0
    metrics_error: str | None = None
    # Whether the recorded process runs, by the same survey `status` and `down` make:
    # "alive", "dead", "partly dead" (its leader is gone, members still run), "not started"
    # or "unknown" (its host could not be asked; `running_detail` says why); None: not asked.
    running: str | None = None
    running_detail: str = ""


@dataclass
class HostVersions:
    host: str
    python: str
    # Parsed JSON lines the probes printed (pdlaunch check's version probe, the UCX probe).
    data: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    error: str | None = None


@dataclass
class Evidence:
    deployment: str
    processes: list[ProcessEvidence] = field(default_factory=list)
    versions: list[HostVersions] = field(default_factory=list)
    collected_at: float = 0.0
    lines: int = 0  # how many log lines were asked for per process
