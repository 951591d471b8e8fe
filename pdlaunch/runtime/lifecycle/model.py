"""What the lifecycle reports on every backend: errors naming processes, the live view,
options and results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pdlaunch.hosts import ConnectOptions
from pdlaunch.observe import health

#: the order a deployment is stopped in (and the reverse of how it starts)
STOP_ORDER = ("router", "decode", "prefill")


class LaunchError(Exception):
    """A failed operation; ``str()`` is the user-facing message. ``failures`` name processes
    (or hosts) with the last lines of their logs."""

    def __init__(self, message: str, failures: list[Failure] | None = None):
        super().__init__(message)
        self.message = message
        self.failures = failures or []
        # None: nothing had been started; True: everything started was stopped again;
        # False: some processes could not be stopped (they stay recorded for `down`).
        self.rolled_back: bool | None = None
        # The runtime's handle of what was started, e.g. {"job_id": ...} under Slurm.
        self.handle: dict[str, Any] = {}

    def __str__(self) -> str:
        return self.message


class Interrupted(LaunchError):
    """`up` was stopped by a signal (SIGINT, SIGTERM, SIGHUP) and rolled back what it could."""

    def __init__(self, signal_name: str, message: str = ""):
        super().__init__(message or f"interrupted by {signal_name}")
        self.signal_name = signal_name


@dataclass
class Failure:
    name: str
    host: str
    reason: str
    log_path: str | None = None
    log_tail: str = ""


@dataclass
class View:
    """One row of the live view."""

    name: str
    role: str
    host: str
    state: str = "pending"  # pending | starting | healthy | running | failed | stopped
    pid: int | None = None
    detail: str = ""


class Reporter:
    """What `up`/`down` tell the user while they run; the CLI renders it (rich). No-op here."""

    def step(self, message: str) -> None:
        pass

    def views(self, views: list[View]) -> None:
        pass

    def update(self) -> None:
        pass

    def warn(self, message: str) -> None:
        pass


@dataclass
class UpOptions:
    timeout: float = 600.0
    # True/"all": every prefill -> decode pair, then the router; "router": the router
    # only; False/"off": none (launch/canary.py).
    canary: bool | str = True
    replace: bool = False
    connect: ConnectOptions = field(default_factory=ConnectOptions)
    stop_grace: float = 10.0
    topology_path: str = ""
    poll_interval: float = 0.2
    canary_timeout: float = 300.0  # a PD request can stall for minutes on a loaded host
    # Run before anything starts, once `up` has proven nothing of the deployment runs (a
    # running one holds its own ports, which a port probe would report as taken). Raises to
    # refuse; skipped when running processes are adopted. It gets `up`'s own connected hosts,
    # so it opens no second SSH connection per host (the argument is the runtime's Launch).
    preflight: Callable[[Any], None] | None = None
    # Findings for failed canary pairs, given the runtime's Launch (the CLI passes doctor's:
    # doctor sits above the backends, so a backend cannot call it itself); None: none.
    explain: Callable[[Any], list[Any]] | None = None
    # Hosts this `up` already connected to (the CLI read CPU hosts' cores before planning):
    # an SSH launch reuses them when it connects with the same options, so one login a host.
    pool: Any = None
    # The Slurm runtime's options (SlurmOptions) and the environment secrets are read from.
    slurm: Any = None
    environ: dict[str, str] | None = None


@dataclass
class UpResult:
    changed: bool
    message: str
    endpoint: str
    endpoints: list[tuple[str, str]] = field(default_factory=list)
    canary: health.CanaryResult | None = None
    elapsed_s: float = 0.0
    healthy_s: float = 0.0  # until every engine and the router were healthy
    adopted: list[str] = field(default_factory=list)  # already running, kept
    backend: str = "ssh"
    handle: dict[str, Any] = field(default_factory=dict)  # e.g. {"job_id": ...} under Slurm


@dataclass
class DownResult:
    stopped: list[str]
    message: str
    handle: dict[str, Any] = field(default_factory=dict)
