"""The Slurm backend on the command line (`--backend slurm`): its flags, declared once, the
options they make, and what `render` and `validate` do with them (pdlaunch.backends.slurm.job*).
`up`, `down`, `status` and `logs` run the one lifecycle (pdlaunch.runtime.lifecycle) on the
Slurm runtime (cli/launch.py); this module knows no command module (layer 1, like targets).

Which backend a recorded deployment uses is read from its record (`recorded_backend`), so
`down`, `status` and `logs` need no flag; `--backend` overrides it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from pdlaunch.cli.common import (
    EXIT_FINDINGS,
    bad_input,
    err,
    failed,
    finding_dict,
    input_errors,
    load_or_exit,
    out,
    print_error,
    print_findings,
    print_json,
    refuse,
)
from pdlaunch.spec.backend_settings import SlurmSettings, merged
from pdlaunch.spec.slurm_options import SlurmError, SlurmOptions

if TYPE_CHECKING:
    from pdlaunch.plan.build import Plan
    from pdlaunch.plan.render import RenderedFile
    from pdlaunch.rules import Finding

# The Slurm backend, the record store and the plan are imported by the functions that use
# them: `pdlaunch validate` without --backend slurm loads none of them.


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
    bool | None,
    typer.Option(
        "--exclusive/--no-exclusive",
        help="Share no node with other jobs (default: the slurm: block's, else no)",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]
BackendConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--backend-config",
        help="YAML with a slurm: block (the keys of these flags, e.g. partition, time, "
        "sbatch_opt); over the topology's slurm: block, under the flags typed",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
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
    exclusive: bool | None = None
    mem: str | None = None
    sbatch_opt: tuple[str, ...] = ()
    start_timeout: int | None = None
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    backend_config: Path | None = None

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> SlurmFlags:
        """The flags among a command's parameters (its ``locals()``): every command that takes
        them declares the same typer parameters, ``time_limit`` for ``--time`` (``time`` would
        shadow the module)."""
        values = {f.name: params[f.name] for f in dataclasses.fields(cls) if f.name in params}
        values["time"] = params["time_limit"]
        values["sbatch_opt"] = tuple(params["sbatch_opt"] or ())
        return cls(**values)

    def given(self) -> dict[str, Any]:
        """The flags typed, as backend_settings keys (an absent flag leaves the block's)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["backend_config"]
        out["sbatch_opt"] = list(self.sbatch_opt)
        return {k: v for k, v in out.items() if v is not None}



def recorded_backend(deployment: str, backend: Backend | None) -> Backend:
    """The backend `--backend` names, else the one whose record the deployment has (SSH when
    it has none: its commands say "nothing recorded" themselves). A record this pdlaunch
    cannot read (a newer format), or two format-1 records and no `--backend`: exit 2."""
    from pdlaunch.runtime import record_store

    try:
        which = record_store.backend_of(deployment, backend.value if backend else None)
    except record_store.RecordError as exc:
        bad_input(str(exc))
    return Backend.slurm if which == "slurm" else Backend.ssh


def refuse_ssh_up(deployment: str) -> None:
    """`up` over SSH of a deployment that has a Slurm record would run a second copy beside
    the job (or hide its record): its record must go first (`down` cancels and forgets). A
    record too new to read: exit 2, nothing is done."""
    from pdlaunch.runtime import record_store
    from pdlaunch.runtime.state import StateError

    try:
        rec = record_store.read(deployment, "slurm")
    except record_store.OtherBackendError:
        return  # an SSH record: `up` adopts, replaces or refuses it itself
    except record_store.RecordFormatError as exc:
        bad_input(str(exc))
    except StateError:
        path = record_store.locate(deployment, "slurm")
        if path is not None and record_store.backend_named(path) == "slurm":
            failed(f"deployment {deployment!r} has a damaged Slurm record ({path}): "
                   f"`pdlaunch down {deployment}` first")  # fmt: skip
        return  # a damaged SSH record: `up` says so itself
    if rec is not None:
        job = rec.native.job_id
        failed(f"deployment {deployment!r} has Slurm job {job}: `pdlaunch down {deployment}` first")


# -- options --------------------------------------------------------------------------------------
# Commas between hostlist brackets belong to the range (node[1-3,5]), not to the list.
_TOP_LEVEL_COMMA = re.compile(r",(?![^\[]*\])")


def _nodes(text: str) -> tuple[str, ...]:
    from pdlaunch.backends.slurm.client import expand_hostlist
    from pdlaunch.backends.slurm.record import SlurmRunError

    names: list[str] = []
    for item in (s.strip() for s in _TOP_LEVEL_COMMA.split(text)):
        if not item:
            bad_input(f"--nodelist {text!r}: an empty node name (give node,node,...)")
        if "[" in item:
            try:
                names += expand_hostlist(item)
            except SlurmRunError as exc:
                bad_input(f"--nodelist: cannot expand {item!r}: {exc}")
        else:
            names.append(item)
    return tuple(names)


def settings(flags: SlurmFlags, block: SlurmSettings | None, as_json: bool) -> dict[str, Any]:
    """The Slurm settings of this run: the topology's ``slurm:`` block, then the
    ``--backend-config`` file's, then the flags typed (pdlaunch/spec/backend_settings.py). Exit 2
    with the file, line and key of a bad value in the file."""
    from pdlaunch.spec.load import LoadError, load_backend_config

    layers = [block.given() if block is not None else {}]
    if flags.backend_config is not None:
        try:
            config = load_backend_config(flags.backend_config)
        except LoadError as exc:
            input_errors(exc, as_json)
        layers.append(config.slurm.given() if config.slurm is not None else {})
    layers.append(flags.given())
    return merged(*layers)


def options(
    flags: SlurmFlags, block: SlurmSettings | None = None, *, as_json: bool = False
) -> SlurmOptions:
    """`SlurmOptions` from the settings (:func:`settings`; exit 2 on a bad value), with the
    partition's GPUs and CPUs per node from sinfo when they do not give them and sinfo
    answers."""
    from pdlaunch.backends.slurm.client import partition_limits
    from pdlaunch.backends.slurm.record import SlurmRunError

    given = settings(flags, block, as_json)
    extra: dict[str, Any] = {}
    if given.get("start_timeout") is not None:
        extra["start_timeout"] = given["start_timeout"]
    nodelist = given.get("nodelist")
    if isinstance(nodelist, list):
        nodelist = ",".join(nodelist)
    try:
        opts = SlurmOptions(
            partition=given.get("partition"),
            nodelist=None if nodelist is None else _nodes(nodelist),
            account=given.get("account"),
            qos=given.get("qos"),
            time=given.get("time"),
            exclusive=bool(given.get("exclusive")),
            mem=given.get("mem"),
            extra_sbatch=tuple(given.get("sbatch_opt", ())),
            gpus_per_node=given.get("gpus_per_node"),
            cpus_per_node=given.get("cpus_per_node"),
            container_support=given.get("container_support", "pyxis"),
            oci_bundles=dict(given.get("oci_bundles") or {}),
            **extra,
        )
    except SlurmError as exc:
        bad_input(str(exc))
    if opts.container_support == "auto":
        opts = _container_support(opts)
    if opts.gpus_per_node is not None and opts.cpus_per_node is not None:
        return opts
    try:
        gpus, cpus = partition_limits(opts.partition)
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


def _container_support(opts: SlurmOptions) -> SlurmOptions:
    """``auto`` made pyxis or oci by what this machine's srun offers (exit 2 without srun)."""
    from pdlaunch.backends.slurm.client import pyxis_loaded
    from pdlaunch.backends.slurm.record import SlurmRunError

    try:
        found = "pyxis" if pyxis_loaded() else "oci"
    except SlurmRunError as exc:
        bad_input(f"slurm container_support auto: cannot ask srun ({exc}); set pyxis or oci")
    return dataclasses.replace(opts, container_support=found)


# -- validate, render -----------------------------------------------------------------------------
def validated(
    path: Path, flags: SlurmFlags, as_json: bool
) -> tuple[Plan, list[Finding], list[RenderedFile], SlurmOptions]:
    """Every rule, then the Slurm placement rules (with the options of the topology's
    ``slurm:`` block, the --backend-config file and the flags), then the job's files rendered
    (a value no sbatch line can hold is found there). Exit 2 on unreadable input, 1 on any
    error."""
    from pdlaunch.backends.slurm import job as slurm
    from pdlaunch.backends.slurm import rules as slurm_rules
    from pdlaunch.backends.slurm.oci import bundle_findings
    from pdlaunch.plan.build import build_plan
    from pdlaunch.rules import SLURM_SKIP, has_errors, validate

    topo, source = load_or_exit(path, as_json)
    opts = options(flags, topo.slurm, as_json=as_json)
    # The job exports each node's own address as the side-channel host (PDLAUNCH_NODE_ADDR).
    findings = validate(topo, source, SLURM_SKIP)
    if has_errors(findings):
        refuse(path, findings, as_json, "Slurm")
    plan = build_plan(topo)
    findings += slurm_rules.validate(topo, plan, opts, source)
    # Slurm's own containers: what each bundle's config.json lacks, read on this machine
    findings += [dataclasses.replace(f, file=source.file, line=source.line(f.field))
                 for f in bundle_findings(plan, opts)]  # fmt: skip
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
    return plan, findings, files, opts


def validate_cmd(path: Path, flags: SlurmFlags, as_json: bool) -> None:
    from pdlaunch.backends.slurm import job as slurm

    plan, findings, _, _ = validated(path, flags, as_json)
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
    from pdlaunch.backends.slurm import job as slurm
    from pdlaunch.plan.render import RenderedFile, plan_json, write_files

    plan, _, files, _ = validated(path, flags, as_json)
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
