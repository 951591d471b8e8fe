"""What a backend must answer for the lifecycle (:mod:`pdlaunch.runtime.lifecycle`) to run a
deployment on it: the `Runtime` interface, and the two objects it hands out.

The lifecycle owns everything that is the same on every backend: the deployment lock,
signal handling, the order of stages, waiting for health (deadline + liveness), the canary,
rolling back, progress (one `Reporter`), the error contract (`LaunchError`) and so the exit
codes. A runtime owns only what differs: how it finds what already runs, puts the files in
place, starts a stage, where a process really listens once placed, whether it is alive,
how it is stopped and proven gone, and its record.

Stages. A deployment starts in :data:`STAGES` order: the engines (prefill and decode), then
the router once they are healthy (the router's worker list must answer). ``Launch.start`` is
called once per stage and then the lifecycle waits for that stage's health. Over SSH each
call starts that stage's processes; under Slurm the first call submits the one
heterogeneous job (its driver script starts the router itself once the engines answer, as a
batch job cannot be extended from outside) and waits for the allocation, so the router's
call has nothing left to start. Both then wait the same way: the stage's processes probed at
the URLs ``health_url`` gives (Slurm's nodes are only known once placed) while ``is_alive``
says they still run. So the interface expresses stages, and a backend that starts
everything at once simply does so at the first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pdlaunch.plan.build import Plan, Process

if TYPE_CHECKING:
    import threading

    from pdlaunch.runtime.lifecycle.model import Reporter, UpOptions, UpResult, View

#: the order a deployment starts in; stopping goes the other way (model.STOP_ORDER)
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("prefill/decode", ("prefill", "decode")),
    ("router", ("router",)),
)


def stage_processes(plan: Plan, roles: tuple[str, ...]) -> list[Process]:
    return [p for p in plan.processes if p.role in roles]


class Launch(ABC):
    """One `up` of one plan on one runtime, from the survey of what runs to the record.

    The lifecycle calls, in order: ``survey`` -> (preflight) -> ``provision`` -> per stage
    ``start`` and a wait on ``health_url``/``is_alive`` -> ``record_up``; on any failure or
    signal after ``survey``: ``stop_started`` then ``forget`` (all proven gone) or
    ``keep_failed`` (something is left, or adopted processes keep running)."""

    plan: Plan
    #: processes found running that this `up` keeps (the same scripts, alive)
    adopted: frozenset[str] = frozenset()

    @abstractmethod
    def survey(self, reporter: Reporter) -> UpResult | None:
        """Decide from what already runs: an UpResult when nothing is to be done (already
        up and unchanged), None to go on (with ``adopted`` set); LaunchError to refuse."""

    @abstractmethod
    def provision(self, reporter: Reporter) -> None:
        """Put the scripts, secret env files and work dirs where the processes will run."""

    @abstractmethod
    def start(self, stage: str, procs: list[Process]) -> dict[str, int | None]:
        """Start ``procs`` (the processes of ``stage`` not adopted), recording each before the
        next starts; the pids it knows (for the live view). LaunchError naming the process
        that could not be started. Returns, not calls back: the lifecycle updates its view."""

    @abstractmethod
    def health_url(self, p: Process) -> str | None:
        """Where ``p`` answers /health once placed (None: headless)."""

    @abstractmethod
    def is_alive(self, p: Process) -> bool:
        """Whether ``p`` still runs (HostError/LaunchError when that cannot be known)."""

    @abstractmethod
    def where(self, p: Process) -> str:
        """The host (or node) ``p`` runs on, for messages."""

    @abstractmethod
    def log_tail(self, p: Process) -> str:
        """The last lines of ``p``'s log ("" when unreadable)."""

    def context(self) -> list[Any]:
        """Failures to show beside a process's own (e.g. a Slurm job's driver log)."""
        return []

    def explain(self, names: list[str]) -> list[Any]:
        """Doctor findings for failed canary pairs (optional; [] when the runtime has none)."""
        return []

    @abstractmethod
    def record_up(self) -> None:
        """Everything is healthy and the canary passed: the record says so."""

    @abstractmethod
    def started(self) -> list[str]:
        """Names of the processes the record holds as started by this `up` (not adopted)."""

    @abstractmethod
    def stop_started(self, reporter: Reporter, views: dict[str, View], grace: float) -> list[str]:
        """Stop what this `up` started and prove it gone; the errors ([] when all gone)."""

    @abstractmethod
    def keep_failed(self) -> None:
        """Keep the record, marked failed (something is left or adopted processes run)."""

    @abstractmethod
    def forget(self) -> None:
        """Delete the record: nothing this deployment started runs (proven by the caller)."""

    @abstractmethod
    def close(self) -> None:
        """Release connections (called once, whatever happened)."""


class Held(ABC):
    """A recorded (or found) deployment that `down` stops."""

    deployment: str
    #: the names of the processes found, in stop order's reverse (for the result)
    names: list[str]
    #: backend-specific fields of the result (JSON), e.g. the Slurm job id
    handle: dict[str, Any]

    @abstractmethod
    def stop_all(self, reporter: Reporter, grace: float) -> list[str]:
        """Stop every process and prove it gone; the errors (the record is kept then)."""

    @abstractmethod
    def keep_failed(self) -> None: ...

    @abstractmethod
    def forget(self) -> str:
        """Delete the record (everything is proven gone); a note for the message."""

    def message(self, note: str) -> str:
        return f"{self.deployment} is down ({len(self.names)} process(es) stopped){note}"


@dataclass
class Observed:
    """One process as `status` sees it (before the health probe the lifecycle makes)."""

    name: str
    role: str
    host: str | None
    pid: int | None = None
    alive: bool | None = None  # None: cannot be known (error says why)
    url: str | None = None  # health URL where it really listens
    uptime_s: float | None = None
    log: str | None = None
    error: str | None = None
    left_running: list[int] = field(default_factory=list)
    health: str | None = None  # set by the runtime when no probe can say more
    container: str | None = None  # the engine's container state (docker/podman), if any


@dataclass
class Observation:
    """A recorded deployment as `status` sees it."""

    deployment: str
    backend: str
    status: str  # the record's: starting | up | failed | ...
    processes: list[Observed]
    title: str = ""  # the backend's own headline (a Slurm job's state)
    running: bool = True  # the backend's own verdict (a Slurm job RUNNING)
    handle: dict[str, Any] = field(default_factory=dict)  # extra JSON (the Slurm job)


class Runtime(ABC):
    """A backend: SSH (`pdlaunch.backends.ssh.runtime`), Slurm
    (`pdlaunch.backends.slurm.runtime`)."""

    name: str

    @abstractmethod
    def launch(self, plan: Plan, opts: UpOptions) -> Launch:
        """The `up` of ``plan`` (nothing is done before ``Launch.survey``)."""

    @abstractmethod
    def held(self, deployment: str, plan: Plan | None) -> Held | None:
        """What `down` stops: the recorded deployment, or (``plan`` given, nothing usable
        recorded) what runs of the plan; None when there is nothing."""

    @abstractmethod
    def observe(self, deployment: str) -> Observation | None:
        """What `status` shows; None when nothing is recorded."""

    @abstractmethod
    def process_names(self, deployment: str) -> list[str]:
        """The processes whose logs `logs` can show (LaunchError when nothing recorded)."""

    @abstractmethod
    def read_log(self, deployment: str, name: str, lines: int) -> str: ...

    @abstractmethod
    def follow_log(
        self, deployment: str, name: str, lines: int, stop: threading.Event | None
    ) -> Iterator[str]: ...
