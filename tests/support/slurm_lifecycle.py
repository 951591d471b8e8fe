"""The one lifecycle on the Slurm runtime, called the way the Slurm tests ask it: `up`
returns what happened (ok or not, the job id, each failed process's log tail) instead of
raising, `down` what is left, `status` the rows by attribute."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm import jobs
from pdlaunch.backends.slurm.runtime import SlurmRuntime
from pdlaunch.plan.build import Plan
from pdlaunch.runtime import lifecycle


@dataclass
class UpOutcome:
    ok: bool
    job_id: str | None
    message: str
    endpoint: str | None = None
    healthy_s: float | None = None
    canary: Any = None
    logs: dict[str, str] = field(default_factory=dict)  # name -> log tail, on failure
    error: lifecycle.LaunchError | None = None


def up(
    plan: Plan,
    opts: slurm.SlurmOptions,
    *,
    timeout: float = 900.0,
    canary: bool | str = True,
    canary_timeout: float = 120.0,
    environ: dict[str, str] | None = None,
) -> UpOutcome:
    uo = lifecycle.UpOptions(
        timeout=timeout, canary=canary, canary_timeout=canary_timeout, slurm=opts,
        environ=environ, poll_interval=0.3,
    )  # fmt: skip
    try:
        res = lifecycle.up(SlurmRuntime(), plan, uo)
    except lifecycle.LaunchError as exc:
        logs = {f.name: f.log_tail for f in exc.failures}
        return UpOutcome(False, exc.handle.get("job_id"), str(exc), logs=logs, error=exc)
    return UpOutcome(True, res.handle.get("job_id"), res.message, res.endpoint, res.healthy_s,
                     res.canary)  # fmt: skip


@dataclass
class DownOutcome:
    ok: bool
    job_id: str | None
    message: str


def down(deployment: str) -> DownOutcome:
    try:
        res = lifecycle.down(SlurmRuntime(), deployment)
    except lifecycle.LaunchError as exc:
        return DownOutcome(False, None, str(exc))
    return DownOutcome(True, res.handle.get("job_id"), res.message)


def status(deployment: str) -> Any:
    report = lifecycle.status(SlurmRuntime(), deployment)
    assert report is not None, f"{deployment}: nothing recorded"
    job = report.observation.handle["job"]
    return SimpleNamespace(
        healthy=report.healthy,
        job=SimpleNamespace(
            state=job["state"], source=job["source"], components=job["components"]
        ),
        processes=[
            SimpleNamespace(name=r["process"], node=r["host"], health=r["health"],
                            url=r["health_url"], role=r["role"])
            for r in report.rows
        ],
    )


def logs(deployment: str, name: str, lines: int | None = None) -> str:
    text = "\n".join(
        lifecycle.logs(SlurmRuntime(), deployment, name, lines=10**9 if lines is None else lines)
    )
    return text


__all__ = ["down", "jobs", "logs", "status", "up"]
