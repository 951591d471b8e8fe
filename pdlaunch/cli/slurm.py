"""The Slurm backend on the command line (`--backend slurm`): its flags, declared once, and
what `up`, `down`, `status`, `logs`, `render` and `validate` do with it
(pdlaunch.backends.slurm*). The command modules keep their SSH paths and hand over here when
the backend is Slurm; this module knows no command module (layer 1, like targets).

Which backend a recorded deployment uses is read from its record (`recorded_backend`), so
`down`, `status` and `logs` need no flag; `--backend` overrides it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pdlaunch import health, record
from pdlaunch.backends import slurm, slurm_rules, slurm_run
from pdlaunch.backends.slurm import SlurmError, SlurmOptions
from pdlaunch.backends.slurm_run import SlurmRunError
from pdlaunch.cli.app import (
    EXIT_FAILED,
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    bad_input,
    err,
    failed,
    finding_dict,
    load_or_exit,
    out,
    print_error,
    print_findings,
    print_json,
    refuse,
)
from pdlaunch.hosts import HostError
from pdlaunch.interrupts import INTERRUPTS, signals_ignored, signals_interrupt
from pdlaunch.plan import Plan, build_plan
from pdlaunch.render import RenderedFile, plan_json, write_files
from pdlaunch.rules import RUNTIME_ADDRESSED, Finding, has_errors, validate
from pdlaunch.state import StateError


class Backend(str, Enum):
    ssh = "ssh"
    slurm = "slurm"


BackendOpt = Annotated[
    Backend | None,
    typer.Option(
        "--backend",
        case_sensitive=False,
        help="ssh (default): processes started over SSH; slurm: one Slurm batch job",
        show_default=False,
    ),
]
RecordedBackendOpt = Annotated[
    Backend | None,
    typer.Option(
        "--backend",
        case_sensitive=False,
        help="ssh or slurm (default: the one whose record the deployment has)",
        show_default=False,
    ),
]

_PANEL = "Slurm (with --backend slurm)"
PartitionOpt = Annotated[
    str | None, typer.Option("--partition", help="Partition to submit to", rich_help_panel=_PANEL)
]
NodelistOpt = Annotated[
    str | None,
    typer.Option(
        "--nodelist",
        help="Nodes the job may use, comma separated (node[1-4] ranges too); the topology's "
        "hosts name them",
        rich_help_panel=_PANEL,
    ),
]
AccountOpt = Annotated[
    str | None, typer.Option("--account", help="Account to charge", rich_help_panel=_PANEL)
]
QosOpt = Annotated[
    str | None, typer.Option("--qos", help="Quality of service", rich_help_panel=_PANEL)
]
TimeOpt = Annotated[
    str | None,
    typer.Option(
        "--time",
        help="Time limit: minutes, HH:MM:SS, D-HH:MM:SS or UNLIMITED",
        rich_help_panel=_PANEL,
    ),
]
ExclusiveOpt = Annotated[
    bool,
    typer.Option("--exclusive", help="Share no node with other jobs", rich_help_panel=_PANEL),
]
MemOpt = Annotated[
    str | None,
    typer.Option("--mem", help="Memory per node, e.g. 64G (0: all of it)", rich_help_panel=_PANEL),
]
SbatchOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--sbatch-opt",
        help="Another sbatch option, --name=value, for every component (repeatable)",
        rich_help_panel=_PANEL,
    ),
]
StartTimeoutOpt = Annotated[
    int | None,
    typer.Option(
        "--start-timeout",
        min=1,
        help="Seconds the job waits for each process's health before it ends itself (default 1800)",
        rich_help_panel=_PANEL,
    ),
]
GpusPerNodeOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node",
        min=1,
        help="GPUs per node the partition offers, for the rules (default: from sinfo)",
        rich_help_panel=_PANEL,
    ),
]
CpusPerNodeOpt = Annotated[
    int | None,
    typer.Option(
        "--cpus-per-node",
        min=1,
        help="CPU cores per node the partition offers, for the rules (default: from sinfo)",
        rich_help_panel=_PANEL,
    ),
]


@dataclass(frozen=True)
class SlurmFlags:
    """The Slurm flags of one command line, as typed (`options` turns them into
    `SlurmOptions`)."""

    partition: str | None = None
    nodelist: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    exclusive: bool = False
    mem: str | None = None
    sbatch_opt: tuple[str, ...] = ()
    start_timeout: int | None = None
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> SlurmFlags:
        """The flags among a command's parameters (its ``locals()``): every command that takes
        them declares the same typer parameters, ``time_limit`` for ``--time`` (``time`` would
        shadow the module)."""
        values = {f.name: params[f.name] for f in dataclasses.fields(cls) if f.name in params}
        values["time"] = params["time_limit"]
        values["sbatch_opt"] = tuple(params["sbatch_opt"] or ())
        return cls(**values)



def recorded_backend(deployment: str, backend: Backend | None) -> Backend:
    """The backend `--backend` names, else the one whose record the deployment has (SSH when
    it has none: its commands say "nothing recorded" themselves)."""
    if backend is not None:
        return backend
    try:
        which = record.backend_of(deployment)
    except record.RecordError as exc:
        bad_input(str(exc))
    return Backend.slurm if which == "slurm" else Backend.ssh


def refuse_ssh_up(deployment: str) -> None:
    """`up` over SSH of a deployment that has a Slurm record would run a second copy beside
    the job (or hide its record): its record must go first (`down` cancels and forgets)."""
    path = slurm_run.record_path(deployment)
    if not path.is_file():
        return
    try:
        rec = slurm_run.load_record(deployment)
        what = f"Slurm job {rec.job_id}" if rec else "a Slurm record"
    except StateError:
        what = f"a damaged Slurm record ({path})"
    failed(f"deployment {deployment!r} has {what}: `pdlaunch down {deployment}` first")


# -- options --------------------------------------------------------------------------------------
# Commas between hostlist brackets belong to the range (node[1-3,5]), not to the list.
_TOP_LEVEL_COMMA = re.compile(r",(?![^\[]*\])")


def _nodes(text: str) -> tuple[str, ...]:
    names: list[str] = []
    for item in (s.strip() for s in _TOP_LEVEL_COMMA.split(text)):
        if not item:
            bad_input(f"--nodelist {text!r}: an empty node name (give node,node,...)")
        if "[" in item:
            try:
                names += slurm_run.expand_hostlist(item)
            except SlurmRunError as exc:
                bad_input(f"--nodelist: cannot expand {item!r}: {exc}")
        else:
            names.append(item)
    return tuple(names)


def options(flags: SlurmFlags, *, as_json: bool = False) -> SlurmOptions:
    """`SlurmOptions` from the flags (exit 2 on a bad value), with the partition's GPUs and
    CPUs per node from sinfo when the flags do not give them and sinfo answers."""
    extra: dict[str, Any] = {}
    if flags.start_timeout is not None:
        extra["start_timeout"] = flags.start_timeout
    try:
        opts = SlurmOptions(
            partition=flags.partition,
            nodelist=None if flags.nodelist is None else _nodes(flags.nodelist),
            account=flags.account,
            qos=flags.qos,
            time=flags.time,
            exclusive=flags.exclusive,
            mem=flags.mem,
            extra_sbatch=tuple(flags.sbatch_opt),
            gpus_per_node=flags.gpus_per_node,
            cpus_per_node=flags.cpus_per_node,
            **extra,
        )
    except SlurmError as exc:
        bad_input(str(exc))
    if opts.gpus_per_node is not None and opts.cpus_per_node is not None:
        return opts
    try:
        gpus, cpus = slurm_run.partition_limits(opts.partition)
    except SlurmRunError as exc:
        if not as_json:
            # sinfo's last line says why (its first ones are often DNS SRV lookups).
            why = str(exc).strip().splitlines()[-1]
            err.print(
                f"[dim]partition limits not checked ({escape(why)}); "
                "--gpus-per-node and --cpus-per-node give them[/]"
            )
        return opts
    # sinfo's 0 GPUs is "none", which gpus_per_node (at least 1) cannot say: no GPU limit.
    return dataclasses.replace(
        opts,
        gpus_per_node=opts.gpus_per_node or gpus or None,
        cpus_per_node=opts.cpus_per_node or cpus or None,
    )


# -- validate, render -----------------------------------------------------------------------------
def validated(
    path: Path, opts: SlurmOptions, as_json: bool
) -> tuple[Plan, list[Finding], list[RenderedFile]]:
    """Every rule, then the Slurm placement rules, then the job's files rendered (a value no
    sbatch line can hold is found there). Exit 2 on unreadable input, 1 on any error."""
    topo, source = load_or_exit(path, as_json)
    # The job exports each node's own address as the side-channel host (PDLAUNCH_NODE_ADDR).
    findings = validate(topo, source, RUNTIME_ADDRESSED)
    if has_errors(findings):
        refuse(path, findings, as_json, "Slurm")
    plan = build_plan(topo)
    findings += slurm_rules.validate(topo, plan, opts, source)
    findings.sort(key=lambda f: f.severity != "error")  # errors first, each in rule order
    if has_errors(findings):
        refuse(path, findings, as_json, "Slurm")
    try:
        files = slurm.render_job(plan, opts)
    except SlurmError as exc:
        if as_json:
            print_json({"valid": False, "error": str(exc)})
        else:
            print_error(f"{path}: cannot be run as a Slurm job: {exc}")
        raise typer.Exit(EXIT_FINDINGS) from None
    if findings and not as_json:
        print_findings(findings)
    return plan, findings, files


def validate_cmd(path: Path, flags: SlurmFlags, as_json: bool) -> None:
    plan, findings, _ = validated(path, options(flags, as_json=as_json), as_json)
    if as_json:
        print_json(
            {"valid": True, "backend": "slurm", "findings": [finding_dict(f) for f in findings]}
        )
        return
    n = len(slurm.components(plan))
    out.print(
        f"[green]{escape(str(path))}: valid for Slurm[/] ({n} job component(s), "
        f"{len(findings)} warning(s))"
    )


def render_cmd(path: Path, output: Path, flags: SlurmFlags, as_json: bool) -> None:
    plan, _, files = validated(path, options(flags, as_json=as_json), as_json)
    if output.exists() and not output.is_dir():
        bad_input(f"{output}: exists and is not a directory")
    files += [slurm.job_index(plan), RenderedFile("plan.json", plan_json(plan), False)]
    try:
        written = write_files(files, output)
    except OSError as exc:
        bad_input(f"cannot write to {output}: {exc.strerror}")
    if as_json:
        print_json({"files": [str(p) for p in written]})
    else:
        for p in written:
            out.print(f"wrote {escape(str(p))}")


# -- up -------------------------------------------------------------------------------------------
def _interrupted(deployment: str, as_json: bool) -> NoReturn:
    """Cancel what the interrupted `up` submitted, with the same proof as `down`."""
    with signals_ignored():
        try:
            res = slurm_run.down(deployment)
            ok = res.ok
            if res.job_id is None:
                # sbatch may have accepted the job just before the interrupt.
                message = (
                    "interrupted before a job was recorded; `squeue --name "
                    f"pdlaunch-{deployment}` shows one if sbatch had accepted it"
                )
            else:
                message = f"interrupted: {res.message}"
        except (SlurmRunError, StateError) as exc:
            ok = False
            message = f"interrupted, and the job could not be cancelled: {exc}"
    if not ok:
        message += f"; run `pdlaunch down {deployment}`"
    if as_json:
        print_json({"ok": False, "interrupted": True, "error": message})
    else:
        print_error(message)
    raise typer.Exit(EXIT_INTERRUPTED)


def _print_up_failure(result: slurm_run.UpResult) -> None:
    print_error(result.message)
    # The processes that were waited for and never became ready, and the driver, say why;
    # the others were healthy or never started (no log to show).
    show = {name for name, o in result.outcomes.items() if not o.startswith("ready")}
    for name, text in result.logs.items():
        if (name in show or name == "driver") and text.strip():
            err.print(f"[dim]--- last lines of {escape(name)}'s log ---[/]")
            err.print(Text(text.rstrip("\n")))
    err.print("[dim]---[/]")


def up(path: Path, flags: SlurmFlags, *, timeout: float, canary: bool, as_json: bool) -> None:
    """Validate for Slurm, submit, wait for health and the canary; exit 1 on failure (the
    job cancelled), 130 interrupted (the job cancelled too)."""
    opts = options(flags, as_json=as_json)
    plan, _, _ = validated(path, opts, as_json)
    step: Callable[[str], None] = (
        (lambda msg: None) if as_json else (lambda msg: err.print(f"[dim]{escape(msg)}[/]"))
    )
    try:
        with signals_interrupt():
            result = slurm_run.up(plan, opts, timeout=timeout, canary=canary, on_step=step)
    except INTERRUPTS:
        _interrupted(plan.deployment, as_json)
    except (SlurmRunError, StateError, SlurmError) as exc:
        if as_json:
            print_json({"ok": False, "backend": "slurm", "error": str(exc)})
        else:
            print_error(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    data: dict[str, Any] = {
        "ok": result.ok,
        "backend": "slurm",
        "job_id": result.job_id,
        "message": result.message,
        "endpoint": result.endpoint,
        "healthy_s": result.healthy_s,
        "outcomes": result.outcomes,
        "canary": None
        if result.canary is None
        else {"ok": result.canary.ok, "message": result.canary.message, **result.canary.details},
    }
    if not result.ok:
        if as_json:
            print_json({**data, "error": result.message, "logs": result.logs})
        else:
            _print_up_failure(result)
        raise typer.Exit(EXIT_FAILED)
    if as_json:
        print_json(data)
        return
    out.print(f"[green]{escape(result.message)}[/]")
    if result.canary is not None:
        out.print(f"canary: {escape(result.canary.message)}")
    out.print(f"all healthy after {result.healthy_s:.1f}s")
    out.print(f"router  {result.endpoint}")


# -- down, status, logs ---------------------------------------------------------------------------
def down(deployment: str, as_json: bool) -> None:
    """Cancel the job and prove nothing is left; exit 1 when something is."""
    try:
        res = slurm_run.down(deployment)
    except (SlurmRunError, StateError) as exc:
        if as_json:
            print_json({"ok": False, "backend": "slurm", "error": str(exc)})
        else:
            print_error(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    if as_json:
        print_json(
            {
                "ok": res.ok,
                "backend": "slurm",
                "deployment": deployment,
                "job_id": res.job_id,
                "message": res.message,
                "left": [{"pid": pid, "command": cmd} for pid, cmd in res.left],
            }
        )
    elif res.ok:
        out.print(res.message)
    else:
        print_error(res.message + " (the record is kept; `pdlaunch down` again once they end)")
        for pid, cmd in res.left:
            err.print(f"  {pid} {escape(cmd)}")
    raise typer.Exit(EXIT_OK if res.ok else EXIT_FAILED)


def status(deployment: str, as_json: bool) -> NoReturn:
    """The job as squeue/sacct see it and each process's health; exit 0 only when the job
    runs and every process is healthy."""
    try:
        rec = slurm_run.load_record(deployment)
        st = slurm_run.status(deployment) if rec is not None else None
    except (SlurmRunError, StateError) as exc:
        failed(str(exc))
    if rec is None or st is None:
        if as_json:
            print_json({"deployment": deployment, "recorded": False, "processes": []})
        else:
            out.print(f"{deployment}: no Slurm job recorded")
        raise typer.Exit(EXIT_FAILED)
    router = next((p.url for p in st.processes if p.role == "router" and p.url), None)
    endpoint = health.base_url(router) if router else None
    job = st.job
    if as_json:
        print_json(
            {
                "deployment": deployment,
                "recorded": True,
                "backend": "slurm",
                "status": rec.status,
                "endpoint": endpoint,
                "healthy": st.healthy,
                "job": {
                    "id": job.job_id,
                    "state": job.state,
                    "source": job.source,
                    "detail": job.detail,
                    "components": [
                        {"id": c.job_id, "state": c.state, "nodes": list(c.nodes)}
                        | ({"reason": c.reason} if c.reason else {})
                        for c in job.components
                    ],
                },
                "processes": [
                    {
                        "process": p.name,
                        "role": p.role,
                        "node": p.node,
                        "url": p.url,
                        "health": p.health,
                    }
                    for p in st.processes
                ],
            }
        )
    else:
        style = "green" if job.running else "red"
        title = f"{deployment}: Slurm job {job.job_id} [{style}]{job.state}[/]"
        if job.source != "squeue":
            title += f" ({job.source}{': ' + escape(job.detail) if job.detail else ''})"
        if endpoint:
            title += f" {endpoint}"
        out.print(title)  # not a table title: that wraps at the table's width
        table = Table()
        for col in ("process", "role", "node", "health"):
            table.add_column(col, overflow="fold")
        for p in st.processes:
            hstyle = "green" if p.health in ("healthy", "headless") else "red"
            table.add_row(p.name, p.role, p.node or "", f"[{hstyle}]{escape(p.health)}[/]")
        out.print(table)
    raise typer.Exit(EXIT_OK if st.healthy else EXIT_FAILED)


def logs(deployment: str, name: str, lines: int, follow: bool) -> None:
    """A process's log (``driver``: the batch script's own), its last ``lines``."""
    try:
        if follow:  # the job's logs are in its work dirs, which this host shares
            for line in record.follow_recorded_log(deployment, name, lines, "slurm"):
                out.out(line, highlight=False)
            return
        text = slurm_run.logs(deployment, name, lines)
    except (SlurmRunError, StateError, HostError) as exc:
        failed(str(exc))
    except KeyboardInterrupt:
        return
    if text:
        out.out(text.rstrip("\n"), highlight=False)
