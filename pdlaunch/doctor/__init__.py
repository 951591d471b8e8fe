"""`pdlaunch doctor`: what went wrong in a running (or failed) PD deployment, and a redacted
debug bundle to share.

A CLI command is a thin wrapper over two calls::

    from pdlaunch import doctor
    with HostPool(options) as pool:
        findings = doctor.diagnose("my-deployment", pool)         # or a DeploymentState
        path = doctor.write_bundle("pd-debug.tar.gz", "my-deployment", pool,
                                   check_json=check_output)      # optional `check --json`

* :func:`diagnose` reads the last ``lines`` lines of every recorded process's log through the
  hosts layer and each engine's ``/metrics``, and returns :class:`Finding` s: known failure
  signatures (the table in ``signatures.yaml``, documented in docs/doctor.md) with the
  process, host, log line and line number, what happened, the cause, the fix and the source
  of the message; plus findings from metrics (a decode that recomputes) and from the plan.
* :func:`write_bundle` writes a tar.gz with the topology, plan, rendered scripts, findings,
  log tails, metrics, per-host versions and the `check` output, secrets redacted.
* :func:`examine` does the gathering once for both (``write_bundle`` accepts its result).

Nothing here raises for a host that does not answer (it becomes a finding); a deployment that
was never recorded raises :class:`DoctorError`, whose message is for the user.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdlaunch.backends.slurm.doctor import slurm_running, slurm_state
from pdlaunch.doctor import bundle as _bundle
from pdlaunch.doctor.collect import TopologyFile, collect, load_topology
from pdlaunch.doctor.diagnose import CHECKS, Finding, diagnose_evidence, match
from pdlaunch.doctor.evidence import Evidence, HostVersions, ProcessEvidence
from pdlaunch.doctor.signatures import Signature, SignatureError, signatures
from pdlaunch.hosts import ConnectOptions, HostPool
from pdlaunch.runtime.record import Record, SshHandle
from pdlaunch.runtime.record_store import find
from pdlaunch.runtime.state import DeploymentState, StateError

__all__ = [
    "CHECKS",
    "DoctorError",
    "Evidence",
    "Examination",
    "Finding",
    "HostVersions",
    "ProcessEvidence",
    "Signature",
    "SignatureError",
    "diagnose",
    "examine",
    "match",
    "signatures",
    "write_bundle",
]


class DoctorError(Exception):
    """No deployment to examine (not recorded, unreadable record); the message is for the
    user."""


@dataclass
class Examination:
    state: DeploymentState
    evidence: Evidence
    topology: TopologyFile
    findings: list[Finding] = field(default_factory=list)
    record: Record | None = None  # the record it was found by (format 2)


def find_record(deployment: str, backend: str | None = None) -> Record:
    """The deployment's record, whichever backend started it (a Slurm job's processes
    placed where Slurm runs them); DoctorError when there is none or it cannot be read."""
    try:
        rec = find(deployment, backend)
    except StateError as exc:
        raise DoctorError(str(exc)) from None
    if rec is None:
        raise DoctorError(
            f"no deployment {deployment!r} is recorded on this control host "
            "(`pdlaunch status` lists them)"
        )
    return rec


def host_pool(rec: Record, connect: ConnectOptions) -> HostPool:
    """A pool to reach the record's hosts: ``connect``'s SSH settings, else those its `up`
    recorded (a Slurm job records none: its logs are read in the job's work dirs)."""
    h = rec.handle
    if isinstance(h, SshHandle):
        connect = connect.or_recorded(h.known_hosts, h.ssh_config)
    return HostPool(connect)


def state_of(rec: Record) -> DeploymentState:
    """The per-process view the gathering reads: an SSH deployment's own state, a Slurm
    job's processes where Slurm placed them (pdlaunch.backends.slurm.doctor)."""
    if rec.backend == "slurm":
        return slurm_state(rec)
    return rec.native


def resolve(deployment_or_state: str | DeploymentState | Record) -> DeploymentState:
    if isinstance(deployment_or_state, DeploymentState):
        return deployment_or_state
    if isinstance(deployment_or_state, Record):
        return state_of(deployment_or_state)
    return state_of(find_record(deployment_or_state))


def examine(
    deployment_or_state: str | DeploymentState | Record,
    pool: HostPool,
    *,
    lines: int = 500,
    timeout: float = 5.0,
    metrics_interval: float = 0.0,
    versions: bool = False,
) -> Examination:
    """Gather evidence from every recorded process and diagnose it.

    ``lines``: log lines read per process. ``timeout``: seconds per HTTP request.
    ``metrics_interval``: when > 0, /metrics is read twice that many seconds apart and
    counters are judged by how they moved (a decode that recomputes *now*), else by their
    totals since start. ``versions``: also probe every host's software versions (over
    SSH; a Slurm job's nodes are not probed).

    A Slurm deployment is read where Slurm placed it: the router and engines at their
    nodes' addresses, the logs in the job's work dirs, each process running by the job's
    state and its health."""
    target = deployment_or_state
    rec = find_record(target) if isinstance(target, str) else None
    rec = target if isinstance(target, Record) else rec
    state = resolve(rec if rec is not None else target)
    slurm = rec is not None and rec.backend == "slurm"
    topology = load_topology(state)
    evidence = collect(
        state,
        pool,
        lines=lines,
        timeout=timeout,
        metrics_interval=metrics_interval,
        versions=versions and not slurm,
        plan=topology.plan,
        running=slurm_running(rec, timeout) if slurm and rec is not None else None,
    )
    findings = diagnose_evidence(evidence, topology.plan)
    return Examination(state, evidence, topology, findings, rec)


def diagnose(
    deployment_or_state: str | DeploymentState | Record,
    pool: HostPool,
    *,
    lines: int = 500,
    timeout: float = 5.0,
    metrics_interval: float = 0.0,
) -> list[Finding]:
    """The findings for a recorded deployment (see :func:`examine` for the parameters):
    errors first, then by process and log line."""
    return examine(
        deployment_or_state, pool, lines=lines, timeout=timeout, metrics_interval=metrics_interval
    ).findings


def write_bundle(
    path: str | os.PathLike[str],
    target: str | DeploymentState | Record | Examination,
    pool: HostPool | None = None,
    *,
    lines: int = 500,
    timeout: float = 5.0,
    metrics_interval: float = 0.0,
    versions: bool = True,
    check_json: str | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Write the redacted debug bundle (tar.gz, mode 0600) at ``path`` and return its path.

    ``target``: a deployment name or record (gathered here through ``pool``), or an
    :class:`Examination` already made. ``check_json``: the output of ``pdlaunch check --json``
    to include. ``env``: where secret values are read for redaction (default os.environ)."""
    if isinstance(target, Examination):
        exam = target
    else:
        if pool is None:
            raise TypeError("write_bundle needs a HostPool to gather from a deployment")
        exam = examine(
            target,
            pool,
            lines=lines,
            timeout=timeout,
            metrics_interval=metrics_interval,
            versions=versions,
        )
    return _bundle.write_bundle(
        path,
        exam.state,
        exam.evidence,
        exam.findings,
        topology=exam.topology,
        check_json=check_json,
        env=env,
        record=exam.record,
    )
