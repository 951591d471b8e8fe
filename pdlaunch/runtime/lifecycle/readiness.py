"""Waiting for processes to become ready.

:func:`wait_until` is one process's wait, a pure loop over injected probes and clocks,
modelled on srtctl's ``wait_until_ready(probe, is_alive, clock, sleep)``: it owns only the
timing decisions, so every branch (healthy, exited, deadline, aborted) is tested with a fake
clock and no process. :func:`wait_healthy` runs one such wait per process of a stage, with the
HTTP probe at the URL the runtime placed it at, and turns the outcomes into the live view and
one LaunchError naming every process that did not become ready.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdlaunch.hosts import HostError
from pdlaunch.hosts.parallel import MAX_WORKERS
from pdlaunch.observe import health
from pdlaunch.plan.build import Process

from .model import Failure, LaunchError

if TYPE_CHECKING:
    from .run import Run

READY = "ready"
EXITED = "exited"
DEADLINE = "deadline"
ABORTED = "aborted"

ALIVE_EVERY = 1.0  # s between liveness checks (one command on the host) while not healthy


@dataclass(frozen=True)
class Outcome:
    status: str  # READY | EXITED | DEADLINE | ABORTED
    detail: str = ""  # the probe's last answer

    @property
    def ready(self) -> bool:
        return self.status == READY


def wait_until(
    probe: Callable[[float], tuple[bool, str]] | None,
    is_alive: Callable[[], bool],
    *,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
    interval: float = 0.2,
    alive_every: float = 1.0,
    aborted: Callable[[], bool] = lambda: False,
    on_wait: Callable[[str], None] = lambda detail: None,
) -> Outcome:
    """Poll ``probe(timeout) -> (ok, detail)`` every ``interval`` until it says ok.

    ``is_alive()`` is asked at most every ``alive_every`` s (it costs a command on the host),
    and once more at the deadline, so an engine that exited is reported as exited, not as
    slow. With no probe (a headless process), being alive is being ready. Exceptions from the
    callables propagate: the caller knows what an unreachable host means.
    """
    last_alive = clock()
    detail = "headless"
    while True:
        if aborted():
            return Outcome(ABORTED, detail)
        now = clock()
        if probe is not None:
            ok, detail = probe(min(2.0, max(0.2, deadline - now)))
            if ok:
                return Outcome(READY, detail)
            now = clock()
        if probe is None or now - last_alive >= alive_every or now >= deadline:
            last_alive = now
            if not is_alive():
                return Outcome(EXITED, detail)
            if probe is None:
                return Outcome(READY, "headless (no HTTP server): alive")
        if now >= deadline:
            return Outcome(DEADLINE, detail)
        on_wait(detail)
        sleep(max(0.0, min(interval, deadline - now)))


def wait_healthy(run: Run, procs: list[Process]) -> None:
    """Until every process answers 200 on /health where it really listens (headless ones:
    alive), any exits (fail fast), or the deadline passes (every one not healthy named)."""
    abort = threading.Event()
    failures: list[Failure] = []
    launch = run.launch

    def watch(p: Process) -> None:
        url = launch.health_url(p)

        def probe(timeout: float) -> tuple[bool, str]:
            try:
                pr = health.probe(url, timeout=timeout)  # type: ignore[arg-type]
            except Exception as exc:  # an answer that is not HTTP: unhealthy, said where
                return False, f"{url}: {' '.join(str(exc).split())[:200]}"
            return pr.ok, pr.describe()

        try:
            out = wait_until(
                probe if url else None,
                lambda: launch.is_alive(p),
                deadline=run.deadline,
                interval=run.opts.poll_interval,
                alive_every=ALIVE_EVERY,
                sleep=abort.wait,
                aborted=abort.is_set,
                on_wait=lambda detail: run.set(p.name, "starting", detail),
            )
        except (HostError, LaunchError) as exc:
            failures.append(Failure(p.name, launch.where(p), f"cannot check process: {exc}"))
            run.set(p.name, "failed", str(exc))
            abort.set()
            return
        if out.status == READY:
            run.set(p.name, "healthy" if url else "running", url or out.detail)
            return
        if out.status == ABORTED:
            return
        if out.status == EXITED:
            reason = "exited during start"
            run.set(p.name, "failed", reason)
            abort.set()  # fail fast: the others need not be waited for
        else:
            # No abort: the others reach the same deadline now, and each that is not
            # healthy is named with its own last answer.
            reason = f"not healthy before the deadline ({out.detail} at {url})"
            run.set(p.name, "failed", "health deadline passed")
        failures.append(run.failure(p, reason))

    # Own executor: on Ctrl-C the watchers must stop at once, not at the deadline, so
    # `abort` is set before waiting for them.
    executor = ThreadPoolExecutor(max_workers=min(MAX_WORKERS, max(1, len(procs))))
    try:
        for f in [executor.submit(watch, p) for p in procs]:
            f.result()
    finally:
        abort.set()
        executor.shutdown(wait=True)
    if failures:
        order = {p.name: i for i, p in enumerate(procs)}
        failures.sort(key=lambda f: order.get(f.name, len(order)))  # plan order, not racy
        first = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise LaunchError(
            f"{first.name} on {first.host}: {first.reason}{more}",
            failures + run.launch.context(),
        )
