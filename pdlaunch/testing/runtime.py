"""`FakeRuntime`: the :class:`pdlaunch.runtime.base.Runtime` interface in memory, for testing
automation built on pdlaunch against the real lifecycle (`up`, `down`, `status`, `logs` of
:mod:`pdlaunch.runtime.lifecycle`): readiness, canary, rollback, signals and the error
contract are the real ones; only the processes are stand-ins.

Each started process is a :class:`FakeProcess`: an HTTP server on 127.0.0.1 (its own port;
see :mod:`pdlaunch.testing.servers`) that answers as the engine or router would, and a log in
memory. How it behaves is a :class:`Behaviour` per process name, set before or during a run
(``runtime.behave("decode-0", exits_after=2)``): healthy after N polls, exits, hangs, cannot
be started, survives being stopped, sits on a host that does not answer, does not move KV.

The runtime decides from its record as the SSH runtime does: the same plan already up is left
alone (``changed: False``); running processes of the same plan under a record an earlier `up`
left (killed with kill -9: :meth:`FakeRuntime.leave_running`) are adopted; a different plan is
refused unless ``replace``. "Never lose a process" holds here too: :meth:`FakeRuntime.running`
lists every process still running, whatever happened to the records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from pdlaunch.hosts import HostError
from pdlaunch.observe import health
from pdlaunch.plan.build import Plan, Process
from pdlaunch.runtime.base import Held, Launch, Observation, Observed, Runtime
from pdlaunch.runtime.lifecycle.model import (
    STOP_ORDER,
    Failure,
    LaunchError,
    Reporter,
    UpOptions,
    UpResult,
    View,
)
from pdlaunch.runtime.state import deployment_dir

from .servers import Engine, Server, router

NAME = "fake"


@dataclass
class Behaviour:
    """How one process behaves. A *poll* is one request to its /health (for a headless
    process, one liveness check): the readiness wait makes one every ``poll_interval``."""

    #: polls answered 503 ("starting") before it answers 200
    healthy_after: int = 1
    #: it exits at this poll (0: at once, as an engine with a bad flag does); None: never
    exits_after: int | None = None
    exit_code: int = 1
    #: never becomes healthy (answers nothing, stays alive): the health deadline decides
    hang: bool = False
    #: start is refused with this reason (a missing binary, a full disk)
    refuse_start: str | None = None
    #: stopping it fails (SIGKILL has no effect: a process stuck in the kernel)
    survives_stop: bool = False
    #: its host does not answer: whether it is alive cannot be known
    unreachable: bool = False
    #: False: a decode recomputes the prompt instead of loading prefill's KV (canary fails)
    serves_kv: bool = True
    #: lines its log starts with
    log: tuple[str, ...] = ()


class FakeProcess:
    """One started process: alive until stopped or its behaviour makes it exit."""

    def __init__(self, runtime: FakeRuntime, plan: Plan, p: Process, pid: int):
        deployment = plan.deployment
        self.runtime, self.deployment, self.name, self.role = runtime, deployment, p.name, p.role
        self.host, self.pid, self.headless = p.host, pid, p.health_url is None
        self.health_path = (p.health_url or "/health").split("/", 3)[-1] if p.health_url else ""
        self.started_at = time.time()
        self.returncode: int | None = None  # None while running
        self.polls = 0
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.engine: Engine | None = None
        self.server: Server | None = None
        self.log(f"{p.name}: started on {p.host} (pid {pid}): {' '.join(p.argv)}")
        for line in self.behaviour.log:
            self.log(line)
        if self.behaviour.exits_after == 0:
            self._exit()
            return
        if self.headless:
            return
        if p.role == "router":
            route = router(lambda: runtime.engines(deployment, "prefill"),
                           lambda: runtime.engines(deployment, "decode"))  # fmt: skip
            self.server = Server(self._poll, self._answers, self.log, route=route)
        else:
            self.engine = Engine(plan.served_model_name, serves_kv=lambda: self.behaviour.serves_kv)
            self.server = Server(self._poll, self._answers, self.log, engine=self.engine)

    @property
    def behaviour(self) -> Behaviour:
        return self.runtime.behaviour(self.name)

    @property
    def running(self) -> bool:
        return self.returncode is None

    @property
    def health_url(self) -> str | None:
        if self.server is None:
            return None
        return f"{self.server.base_url}/{self.health_path or 'health'}"

    def log(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)

    def _poll(self) -> int | None:
        """One poll: its /health answer (None: no answer), exiting first if it is time."""
        b = self.behaviour
        with self._lock:
            self.polls += 1
            polls = self.polls
        if b.exits_after is not None and polls >= b.exits_after and self.running:
            self._exit()
        if not self.running or b.hang:
            return None
        return 200 if polls > b.healthy_after else 503

    def _answers(self) -> bool:
        return self.running and not self.behaviour.hang

    def _exit(self) -> None:
        code = self.behaviour.exit_code
        self.log(f"{self.name}: simulated engine failure: exited with code {code}")
        self._end(code)

    def _end(self, code: int) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            self.returncode = code
        if self.server is not None:
            self.server.close()

    def is_alive(self) -> bool:
        b = self.behaviour
        if b.unreachable:
            raise HostError(f"{self.host}: ssh connect timed out (fake host does not answer)")
        if self.headless and self.running:
            self._poll()
        return self.running

    def stop(self) -> str | None:
        """SIGTERM, then SIGKILL: None when it is proven gone, else why not."""
        self.runtime.events.append(("stop", self.deployment, self.name))
        if self.behaviour.unreachable:
            return f"{self.name} on {self.host}: host does not answer (fake)"
        if self.behaviour.survives_stop:
            return f"{self.name} on {self.host}: pid {self.pid} still running after SIGKILL"
        self.log(f"{self.name}: terminated")
        self._end(-15)
        return None

    def tail(self, lines: int) -> list[str]:
        with self._lock:
            return list(self.lines[-lines:]) if lines else []


@dataclass
class FakeRecord:
    """What the runtime remembers of a deployment (a real runtime keeps it in `record.json`)."""

    deployment: str
    digest: str
    status: str = "starting"  # starting | up | failed
    processes: dict[str, FakeProcess] = field(default_factory=dict)


def digest(plan: Plan) -> str:
    return hashlib.sha256(plan.model_dump_json().encode()).hexdigest()


class FakeRuntime(Runtime):
    """The Runtime interface in memory (see the module docstring). One instance is one
    world: its records and processes outlive each `up`/`down` call made on it."""

    name = NAME

    def __init__(self, behaviours: dict[str, Behaviour] | None = None):
        self.behaviours: dict[str, Behaviour] = dict(behaviours or {})
        self.records: dict[str, FakeRecord] = {}
        self.processes: list[FakeProcess] = []  # every process ever started
        #: ("start" | "stop", deployment, process) in the order they happened
        self.events: list[tuple[str, str, str]] = []
        self._pids = itertools.count(40001)
        self._lock = threading.Lock()

    # -- the world, for tests ----------------------------------------------------------------
    def behaviour(self, name: str) -> Behaviour:
        return self.behaviours.get(name) or Behaviour()

    def behave(self, name: str, **changes: object) -> Behaviour:
        """Set (part of) how ``name`` behaves, from now on (running processes included)."""
        b = dataclasses.replace(self.behaviour(name), **changes)  # type: ignore[arg-type]
        self.behaviours[name] = b
        return b

    def running(self, deployment: str | None = None) -> list[str]:
        """Every process still running (of ``deployment``), recorded or not."""
        return [p.name for p in self.processes
                if p.running and deployment in (None, p.deployment)]  # fmt: skip

    def process(self, deployment: str, name: str) -> FakeProcess | None:
        """The latest process ``name`` of ``deployment`` that was started."""
        found = [p for p in self.processes if (p.deployment, p.name) == (deployment, name)]
        return found[-1] if found else None

    def engines(self, deployment: str, role: str) -> list[Engine]:
        rec = self.records.get(deployment)
        procs = rec.processes.values() if rec else []
        return [p.engine for p in procs if p.role == role and p.running and p.engine]

    def spawn(self, plan: Plan, p: Process) -> FakeProcess:
        self.events.append(("start", plan.deployment, p.name))
        proc = FakeProcess(self, plan, p, next(self._pids))
        with self._lock:
            self.processes.append(proc)
        return proc

    def leave_running(
        self, plan: Plan, names: list[str] | None = None, status: str = "starting"
    ) -> FakeRecord:
        """The world an `up` leaves when it is killed (kill -9) after starting ``names``
        (default: the engines): they run, and the record says ``status``."""
        names = names if names is not None else [p.name for p in plan.processes
                                                 if p.role != "router"]  # fmt: skip
        rec = FakeRecord(plan.deployment, digest(plan), status)
        for p in plan.processes:
            if p.name in names:
                rec.processes[p.name] = self.spawn(plan, p)
        self.records[plan.deployment] = rec
        # the killed `up` held the deployment's lock there: `down` looks for the directory
        deployment_dir(plan.deployment).mkdir(parents=True, exist_ok=True)
        return rec

    def close(self) -> None:
        """Stop every server (the end of a test); records are kept."""
        for p in self.processes:
            if p.server is not None:
                p.server.close()
                p.server = None

    # -- the Runtime interface ---------------------------------------------------------------
    def launch(self, plan: Plan, opts: UpOptions) -> Launch:
        return FakeLaunch(self, plan, opts)

    def held(self, deployment: str, plan: Plan | None) -> Held | None:
        rec = self.records.get(deployment)
        if rec is None and plan is not None:  # nothing recorded: what runs of the plan
            orphans = {p.name: p for p in self.processes
                       if p.deployment == deployment and p.running}  # fmt: skip
            if orphans:
                rec = FakeRecord(deployment, digest(plan), "failed", orphans)
        return FakeHeld(self, rec) if rec is not None else None

    def observe(self, deployment: str) -> Observation | None:
        rec = self.records.get(deployment)
        if rec is None:
            return None
        rows = []
        for proc in rec.processes.values():
            row = Observed(proc.name, proc.role, proc.host, proc.pid,
                           log=f"fake://{deployment}/{proc.name}.log")  # fmt: skip
            try:
                row.alive = proc.is_alive()
            except HostError as exc:
                row.error = str(exc)
            row.url = proc.health_url  # probed by `status`: an exited one answers nothing
            if row.alive:
                row.uptime_s = time.time() - proc.started_at
            if proc.headless:
                row.health = "headless" if proc.running else f"exited ({proc.returncode})"
            rows.append(row)
        return Observation(deployment, NAME, rec.status, rows,
                           title=f"{deployment}: {rec.status} (fake runtime)")  # fmt: skip

    def process_names(self, deployment: str) -> list[str]:
        rec = self.records.get(deployment)
        if rec is None:
            raise LaunchError(f"{deployment}: nothing recorded (was it started with `up`?)")
        return list(rec.processes)

    def read_log(self, deployment: str, name: str, lines: int) -> str:
        return "\n".join(self.records[deployment].processes[name].tail(lines))

    def follow_log(
        self, deployment: str, name: str, lines: int, stop: threading.Event | None
    ) -> Iterator[str]:
        proc = self.records[deployment].processes[name]
        seen = len(proc.lines)
        yield from proc.tail(lines)
        stop = stop or threading.Event()
        while not stop.is_set():
            new = proc.lines[seen:]
            seen += len(new)
            yield from new
            if not new and not proc.running:
                return
            stop.wait(0.05)


class FakeLaunch(Launch):
    def __init__(self, runtime: FakeRuntime, plan: Plan, opts: UpOptions):
        self.runtime, self.plan, self.opts = runtime, plan, opts
        self.adopted = frozenset()
        self.record = FakeRecord(plan.deployment, digest(plan))

    def survey(self, reporter: Reporter) -> UpResult | None:
        reporter.step("checking what already runs")
        dep, rt = self.plan.deployment, self.runtime
        old = rt.records.get(dep)
        if old is None:
            return None
        unknown = []
        alive = []
        for name, proc in old.processes.items():
            try:
                if proc.is_alive():
                    alive.append(name)
            except HostError as exc:
                unknown.append(f"{name}: {exc}")
        if unknown:
            raise LaunchError(
                f"cannot tell whether {dep} still runs: {'; '.join(unknown)} (its record is "
                f"kept; retry, or `pdlaunch down {dep}`)"
            )
        if not alive:
            del rt.records[dep]  # every recorded process is proven gone
            return None
        same = old.digest == self.record.digest
        if same and not self.opts.replace:
            planned = {p.name for p in self.plan.processes}
            if set(alive) >= planned and old.status == "up":
                self.record = old
                url = self.health_url(self.plan.router)
                return UpResult(
                    changed=False,
                    message=f"{dep} is already up and unchanged ({len(alive)} process(es) "
                    "running); nothing to do",
                    endpoint=health.base_url(url) if url else self.plan.endpoint(),
                )
            reporter.step(f"adopting {len(alive)} running process(es) of the same plan: "
                          + ", ".join(alive))  # fmt: skip
            self.adopted = frozenset(alive)
            self.record.processes = {n: old.processes[n] for n in alive}
            rt.records[dep] = self.record
            return None
        if not self.opts.replace:
            raise LaunchError(
                f"{dep} is already running ({len(alive)} process(es) alive) and differs from "
                "this topology. Re-run with --replace to stop it and start this topology."
            )
        reporter.step("replacing: " + ("--replace given" if same else "the plan changed"))
        errors = FakeHeld(rt, old).stop_all(reporter, self.opts.stop_grace)
        if errors:
            old.status = "failed"
            raise LaunchError(
                f"cannot stop the running deployment: {'; '.join(errors)} (its record is "
                f"kept: run `pdlaunch down {dep}`)"
            )
        del rt.records[dep]
        return None

    def provision(self, reporter: Reporter) -> None:
        reporter.step(f"provisioning {len(self.plan.processes)} process(es) (fake: in memory)")
        self.runtime.records[self.plan.deployment] = self.record

    def start(self, stage: str, procs: list[Process]) -> dict[str, int | None]:
        pids: dict[str, int | None] = {}
        for p in procs:
            why = self.runtime.behaviour(p.name).refuse_start
            if why:
                raise LaunchError(
                    f"{p.name} on {p.host}: could not start: {why}",
                    [Failure(p.name, p.host, f"could not start: {why}", p.log_path)],
                )
            proc = self.runtime.spawn(self.plan, p)
            self.record.processes[p.name] = proc  # recorded before the next one starts
            pids[p.name] = proc.pid
        return pids

    def _proc(self, p: Process) -> FakeProcess | None:
        return self.record.processes.get(p.name)

    def health_url(self, p: Process) -> str | None:
        proc = self._proc(p)
        if proc is None or p.health_url is None:
            return p.health_url  # not placed yet: where the plan says
        return proc.health_url or p.health_url

    def is_alive(self, p: Process) -> bool:
        proc = self._proc(p)
        return proc is not None and proc.is_alive()

    def where(self, p: Process) -> str:
        return p.host

    def log_tail(self, p: Process) -> str:
        proc = self._proc(p)
        return "\n".join(proc.tail(20)) + "\n" if proc else ""

    def record_up(self) -> None:
        self.record.status = "up"

    def started(self) -> list[str]:
        # as the SSH record does: started by this `up`, whether or not it has exited since
        return [n for n in self.record.processes if n not in self.adopted]

    def stop_started(self, reporter: Reporter, views: dict[str, View], grace: float) -> list[str]:
        errors = []
        mine = [p for p in self.record.processes.values() if p.name not in self.adopted]
        for proc in sorted(mine, key=lambda p: STOP_ORDER.index(p.role)):
            if not proc.running:
                continue
            why = proc.stop()
            if why:
                errors.append(why)
            elif proc.name in views:
                views[proc.name].state = "stopped"
                reporter.update()
        return errors

    def keep_failed(self) -> None:
        self.record.status = "failed"

    def forget(self) -> None:
        self.runtime.records.pop(self.plan.deployment, None)

    def close(self) -> None:
        pass


class FakeHeld(Held):
    def __init__(self, runtime: FakeRuntime, record: FakeRecord):
        self.runtime, self.record = runtime, record
        self.deployment = record.deployment
        self.handle: dict = {}
        self.names = [p.name for p in self._order()]

    def _order(self) -> list[FakeProcess]:
        return sorted(self.record.processes.values(), key=lambda p: STOP_ORDER.index(p.role))

    def stop_all(self, reporter: Reporter, grace: float) -> list[str]:
        errors = []
        for proc in self._order():
            if proc.running and (why := proc.stop()):
                errors.append(why)
        return errors

    def keep_failed(self) -> None:
        self.record.status = "failed"
        self.runtime.records[self.deployment] = self.record

    def forget(self) -> str:
        self.runtime.records.pop(self.deployment, None)
        return ""
