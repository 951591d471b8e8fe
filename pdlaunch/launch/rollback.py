"""Rolling back a failed or interrupted `up`: stop what this run started (router, decode,
prefill), prove by the pid files that nothing it may have started still runs, and only then
drop the record; a second signal meanwhile says truthfully what is left."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from pdlaunch.hosts import HostError
from pdlaunch.interrupts import Signalled, signal_name, signals_ignored
from pdlaunch.state import StateError, remove_state

from .model import Interrupted, LaunchError, Reporter
from .records import survey
from .stopping import stop_processes

if TYPE_CHECKING:
    from .up import _Run


def roll_back(run: _Run, exc: BaseException, reporter: Reporter) -> BaseException:
    """Stop what the run holds; returns the exception to raise (a LaunchError that says
    truthfully what is left, or ``exc`` itself when it is not ours to describe)."""
    err: LaunchError
    if isinstance(exc, LaunchError):
        err = exc
    elif isinstance(exc, (KeyboardInterrupt, Signalled)):
        err = Interrupted(signal_name(exc))
    else:  # HostError, StateError, or a bug: roll back all the same
        err = LaunchError(str(exc))
    roll_back_into(run, err, reporter)
    if not isinstance(exc, (LaunchError, KeyboardInterrupt, Signalled, HostError, StateError)):
        return exc  # a bug: keep its traceback
    return err


def roll_back_into(run: _Run, err: LaunchError, reporter: Reporter) -> None:
    """Stop what the run holds, then prove (by the pid files) that nothing it may have started
    runs; the record goes only after that proof."""
    dep = run.plan.deployment
    mine = run.started_here()
    had = [p.name for p in run.state.started() if p.name in mine]
    if had:
        reporter.step("rolling back: stopping what this run started")
    try:
        errors: list[str] = []
        if run.uploaded:  # nothing can run (nor any secret file exist) before the upload
            errors = run.rollback()
            if not errors:
                check = survey(run.state, run.pool)
                left = {n for n in check.alive if n in mine}
                if left or check.strangers:
                    errors = stop_processes(
                        run.state,
                        run.pool,
                        Reporter(),
                        grace=run.grace,
                        extra=check.strangers,
                        only=left,
                    )
                errors += [f"{name}: {why}" for name, why in check.unknown.items()]
    except (KeyboardInterrupt, Signalled) as again:
        with signals_ignored():
            left = [p.name for p in run.state.started() if p.name in mine]
            run.state.status = "failed"
            with contextlib.suppress(StateError):
                run.save()
            err.message += (
                f"\ninterrupted again ({signal_name(again)}) while rolling back: "
                + (f"still running: {', '.join(left)}" if left else "nothing is left running")
                + f" (recorded; stop with `pdlaunch down {dep}`)"
            )
            err.rolled_back = not left
        return
    if errors:
        run.state.status = "failed"
        with contextlib.suppress(StateError):
            run.save()
        msg = (
            "rollback could not stop: " + "; ".join(errors) + f" (retry with `pdlaunch down {dep}`)"
        )
        reporter.warn(msg)
        err.message += f"\n{msg}"
        err.rolled_back = False
        return
    kept = [p.name for p in run.state.started()]  # adopted: they ran before this `up`
    if kept:
        run.state.status = "failed"
        run.save()
        err.message += (
            f"\nstill running, as before this `up` (recorded): {', '.join(kept)}; "
            f"`pdlaunch down {dep}` stops them"
        )
    else:
        remove_state(dep)
    if isinstance(err, Interrupted):
        err.message += (
            ": rolled back, everything this run started was stopped"
            if had
            else ": nothing was running yet; nothing is left"
        )
    err.rolled_back = True if had else None
