"""SIGTERM and SIGHUP handled like Ctrl-C, for the commands that must clean up after
themselves when stopped (`up` rolls back; a Slurm `up` cancels its job), and a quiet spell
while that clean-up writes its last words.

Only the main thread can install signal handlers; elsewhere (a library caller's thread) both
context managers do nothing."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Signalled(BaseException):
    """SIGTERM/SIGHUP turned into an exception, like SIGINT's KeyboardInterrupt (a
    BaseException too, so `except Exception` does not swallow it)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


INTERRUPTS = (KeyboardInterrupt, Signalled)


def signal_name(exc: BaseException) -> str:
    """The signal that raised ``exc`` (KeyboardInterrupt is SIGINT)."""
    return exc.name if isinstance(exc, Signalled) else "SIGINT"


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP raise Signalled, so the caller's clean-up runs for them as it
    does for Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_(signum: int, frame: object) -> None:
        raise Signalled(signal.Signals(signum).name)

    saved = {s: signal.signal(s, raise_) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """Inside: SIGINT, SIGTERM and SIGHUP are ignored, so a second signal cannot cut short the
    clean-up the first one started."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in sigs}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
