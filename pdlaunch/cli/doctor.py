"""`doctor`: what went wrong in a running (or failed) deployment, and a debug bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from pdlaunch import doctor
from pdlaunch.cli import summary
from pdlaunch.cli.backend_options import check_recorded
from pdlaunch.cli.common import EXIT_FAILED, app, failed, out, print_json
from pdlaunch.cli.options import (
    AcceptKeysOpt,
    JsonOpt,
    KnownHostsOpt,
    SshConfigOpt,
    TargetArg,
    connect_options,
)
from pdlaunch.cli.slurm import RecordedBackendOpt, recorded_backend
from pdlaunch.cli.targets import resolve_deployment


@app.command("doctor", short_help=summary("doctor"))
def doctor_cmd(
    ctx: typer.Context,
    target: TargetArg = None,
    bundle: Annotated[
        Path | None,
        typer.Option(
            "--bundle",
            help="Also write a debug bundle (tar.gz; secrets and token-like strings redacted)",
        ),
    ] = None,
    lines: Annotated[
        int, typer.Option("-n", "--lines", min=1, help="Log lines read per process")
    ] = 500,
    interval: Annotated[
        float,
        typer.Option(
            "--interval",
            min=0.0,
            help="Read /metrics twice this many seconds apart, to judge what happens now "
            "(0: judge the totals since start)",
        ),
    ] = 0.0,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
    as_json: JsonOpt = False,
    backend: RecordedBackendOpt = None,
) -> None:
    """Read every process's log and metrics, match known failure signatures, and say what
    happened, where, why, and how to fix it (a Slurm job: where Slurm placed it, its logs in
    the job's work dirs). Exit 1 when any error is found."""
    deployment = resolve_deployment(target, as_json)
    which = recorded_backend(deployment, backend)
    check_recorded(ctx, which.value, backend is not None, deployment)
    connect = connect_options(accept_new_host_keys, known_hosts, ssh_config)
    try:
        rec = doctor.find_record(deployment, backend.value if backend else None)
        with doctor.host_pool(rec, connect) as pool:
            exam = doctor.examine(
                rec, pool, lines=lines, metrics_interval=interval, versions=bundle is not None
            )
            if bundle is not None:
                doctor.write_bundle(bundle, exam)
    except doctor.DoctorError as exc:
        failed(str(exc))
    except OSError as exc:
        failed(f"cannot write the bundle {bundle}: {exc}")
    findings = exam.findings
    if as_json:
        print_json(
            {
                "deployment": deployment,
                "findings": [f.to_dict() for f in findings],
                "bundle": str(bundle) if bundle else None,
            }
        )
    elif not findings:
        out.print(f"[green]{deployment}: no known failure signature in logs or metrics[/]")
    else:
        table = Table(title=f"{deployment}: {len(findings)} finding(s)", show_lines=True)
        for col in ("finding", "where", "what happened", "fix"):
            table.add_column(col, overflow="fold")
        for f in findings:
            color = "red" if f.severity == "error" else "yellow"
            seen = f" (x{f.count})" if f.count > 1 else ""
            what = f"{f.what}{seen}\n[dim]{escape(f.line)}[/]" if f.line else f.what
            table.add_row(
                f"[{color}]{f.id}[/]", f.where, what, f"{f.fix}\n[dim]source: {f.source}[/]"
            )
        out.print(table)
    if bundle is not None and not as_json:
        out.print(f"debug bundle: {bundle} (secrets redacted)")
    if any(f.severity == "error" for f in findings):
        raise typer.Exit(EXIT_FAILED)
