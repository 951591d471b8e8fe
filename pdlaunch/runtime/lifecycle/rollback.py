"""Rolling back a failed or interrupted `up`, on any runtime: stop what this run started
(router, decode, prefill), have the runtime prove that nothing it may have started still
runs, and only then drop the record; a second signal meanwhile says truthfully what is left."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from pdlaunch.hosts import HostError
from pdlaunch.runtime.interrupts import Signalled, signal_name, signals_ignored
from pdlaunch.runtime.state import StateError

from .model import Interrupted, LaunchError

if TYPE_CHECKING:
    from .run import Run


def roll_back(run: Run, exc: BaseException) -> BaseException:
    """Stop what the run holds; returns the exception to raise (a LaunchError that says
    truthfully what is left, or ``exc`` itself when it is not ours to describe)."""
    err: LaunchError
    if isinstance(exc, LaunchError):
        err = exc
    elif isinstance(exc, (KeyboardInterrupt, Signalled)):
        err = Interrupted(signal_name(exc))
    else:  # HostError, StateError, a Slurm error, or a bug: roll back all the same
        err = LaunchError(str(exc))
    roll_back_into(run, err)
    err.handle = dict(getattr(run.launch, "handle", {}))
    if not isinstance(exc, (LaunchError, KeyboardInterrupt, Signalled, HostError, StateError)):
        if type(exc).__module__.startswith("pdlaunch."):
            return err  # one of ours (SlurmRunError...): its message is for users
        return exc  # a bug: keep its traceback
    return err


def roll_back_into(run: Run, err: LaunchError) -> None:
    """Stop what the run holds, then (the runtime proves it) forget the record."""
    launch, reporter = run.launch, run.reporter
    dep = run.plan.deployment
    had = launch.started()
    if had:
        reporter.step("rolling back: stopping what this run started")
    try:
        errors: list[str] = []
        if run.provisioned:  # nothing can run (nor any secret file exist) before that
            errors = launch.stop_started(reporter, run.views, run.opts.stop_grace)
    except (KeyboardInterrupt, Signalled) as again:
        with signals_ignored():
            left = launch.started()
            with contextlib.suppress(StateError):
                launch.keep_failed()
            err.message += (
                f"\ninterrupted again ({signal_name(again)}) while rolling back: "
                + (f"still running: {', '.join(left)}" if left else "nothing is left running")
                + f" (recorded; stop with `pdlaunch down {dep}`)"
            )
            err.rolled_back = not left
        return
    if errors:
        with contextlib.suppress(StateError):
            launch.keep_failed()
        msg = (
            "rollback could not stop: " + "; ".join(errors) + f" (retry with `pdlaunch down {dep}`)"
        )
        reporter.warn(msg)
        err.message += f"\n{msg}"
        err.rolled_back = False
        return
    kept = sorted(launch.adopted)  # they ran before this `up`
    if kept:
        launch.keep_failed()
        err.message += (
            f"\nstill running, as before this `up` (recorded): {', '.join(kept)}; "
            f"`pdlaunch down {dep}` stops them"
        )
    else:
        launch.forget()
    if isinstance(err, Interrupted):
        err.message += (
            ": rolled back, everything this run started was stopped"
            if had
            else ": nothing was running yet; nothing is left"
        )
    err.rolled_back = True if had else None
