"""Waiting for one process to become ready: a pure loop over injected probes and clocks.

Modelled on srtctl's ``wait_until_ready(probe, is_alive, clock, sleep)``: the loop owns only
the timing decisions, so every branch (healthy, exited, deadline, aborted) is tested with a
fake clock and no process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

READY = "ready"
EXITED = "exited"
DEADLINE = "deadline"
ABORTED = "aborted"


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
