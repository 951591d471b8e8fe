"""Commands that start and supervise deployments: `up`, `down`, `status`, `logs`, on every
runtime. Exit codes: 0 done, 1 failed operation (or, for `status`, not every process alive
and healthy), 2 unreadable input, 130 `up` interrupted. Each picks the runtime (`--backend` on
`up`, the record on the others: :func:`runtime_for`) and calls the one lifecycle
(:mod:`pdlaunch.runtime.lifecycle`); only the options and the printing are here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pdlaunch.backends.slurm.runtime import SlurmRuntime
from pdlaunch.backends.ssh.runtime import SshRuntime
from pdlaunch.check.runner import CheckOptions, run_check
from pdlaunch.cli import slurm as slurm_cli
from pdlaunch.cli import summary
from pdlaunch.cli import watch_cmd as watch_cli
from pdlaunch.cli.backend_options import SSH_TRIO, check_chosen, check_recorded, refuse_unused
from pdlaunch.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    app,
    bad_input,
    err,
    failed,
    out,
    plan_on_hosts,
    plan_or_exit,
    print_error,
    print_json,
)
from pdlaunch.cli.options import (
    AcceptKeysOpt,
    HealthTimeoutOpt,
    JsonOpt,
    KnownHostsOpt,
    SshConfigOpt,
    TargetArg,
    TopologyArg,
    connect_options,
)
from pdlaunch.cli.progress import RichReporter
from pdlaunch.cli.reports import print_report
from pdlaunch.cli.slurm import (
    AccountOpt,
    BackendConfigOpt,
    BackendOpt,
    CpusPerNodeOpt,
    ExclusiveOpt,
    GpusPerNodeOpt,
    MemOpt,
    NodelistOpt,
    PartitionOpt,
    QosOpt,
    RecordedBackendOpt,
    SbatchOpt,
    SlurmFlags,
    StartTimeoutOpt,
    TimeOpt,
)
from pdlaunch.cli.targets import resolve_deployment
from pdlaunch.hosts import HostError, HostPool
from pdlaunch.hosts.options import ConnectOptions
from pdlaunch.plan.build import Plan
from pdlaunch.runtime import lifecycle as launch
from pdlaunch.runtime.base import Runtime
from pdlaunch.runtime.record_store import RecordFormatError, load_state
from pdlaunch.runtime.state import StateError

ERRORS = (launch.LaunchError, StateError, HostError)

# `--grace` on `up` (stopping on rollback or --replace) and on `down`.
UpGraceOpt = Annotated[
    float, typer.Option("--grace", min=0, help="Seconds between SIGTERM and SIGKILL on stop")
]
DownGraceOpt = Annotated[
    float, typer.Option("--grace", min=0, help="Seconds between SIGTERM and SIGKILL")
]


def _print_failure(exc: launch.LaunchError) -> None:
    print_error(exc.message)
    for f in exc.failures:
        where = f"{f.name} on {f.host}" if f.name != "(host)" else f.host
        err.print(f"[red]✗ {where}[/]: {f.reason}")
        if f.log_tail.strip():
            err.print(f"[dim]--- last lines of {f.log_path} ---[/]")
            err.print(Text(f.log_tail.rstrip("\n")))
            err.print("[dim]---[/]")


def _failure_json(exc: Exception) -> dict[str, Any]:
    data: dict[str, Any] = {"ok": False, "error": str(exc)}
    if isinstance(exc, launch.LaunchError):
        data.update(exc.handle)
        data["rolled_back"] = exc.rolled_back
        data["failures"] = [
            {
                "process": f.name,
                "host": f.host,
                "reason": f.reason,
                "log": f.log_path,
                "log_tail": f.log_tail,
            }
            for f in exc.failures
        ]
    return data


def runtime_for(backend: str, connect: ConnectOptions | None = None) -> Runtime:
    """The runtime of a backend name (`--backend`, or the one a record names)."""
    return SlurmRuntime() if backend == "slurm" else SshRuntime(connect)


def _doctor_findings(launch_: Any) -> list[Any]:
    """What doctor finds in the logs and metrics of a launch whose canary failed."""
    from pdlaunch import doctor  # only on failure: it reads every log

    return doctor.diagnose(launch_.state, launch_.pool, lines=300)


def _preflight(plan: Plan, connect: ConnectOptions, launch_: Any, as_json: bool) -> None:
    # on `up`'s own connected hosts: no second SSH connection (and handshake) per host
    report = run_check(plan, CheckOptions(fast=True, connect=connect), pool=launch_.pool)
    if report.failed:
        if as_json:
            print_json({"ok": False, "check": [r.to_dict() for r in report.results]})
        else:
            print_report(report)
            err.print(
                "[bold red]preflight check failed; nothing was started[/] "
                "(fix the FAIL rows, or pass --skip-check)"
            )
        raise typer.Exit(EXIT_FAILED)


@app.command("up", short_help=summary("up"))
def up_cmd(
    ctx: typer.Context,
    topology: TopologyArg,
    timeout: HealthTimeoutOpt = 600.0,
    canary: Annotated[
        bool,
        typer.Option(
            "--canary/--no-canary",
            help="Prove P/D serving: every prefill→decode pair directly, then the router",
        ),
    ] = True,
    canary_scope: Annotated[
        str,
        typer.Option(
            "--canary-scope",
            help="all: every prefill→decode pair, then the router; router: one request "
            "through the router only",
        ),
    ] = "all",
    replace: Annotated[
        bool, typer.Option("--replace", help="Stop a running, different deployment first")
    ] = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
    grace: UpGraceOpt = 10.0,
    skip_check: Annotated[
        bool, typer.Option("--skip-check", help="Do not run the fast preflight check first")
    ] = False,
    as_json: JsonOpt = False,
    backend: BackendOpt = None,
    partition: PartitionOpt = None,
    nodelist: NodelistOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    time_limit: TimeOpt = None,
    exclusive: ExclusiveOpt = None,
    mem: MemOpt = None,
    sbatch_opt: SbatchOpt = None,
    start_timeout: StartTimeoutOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    cpus_per_node: CpusPerNodeOpt = None,
    backend_config: BackendConfigOpt = None,
) -> None:
    """Start the deployment on every host, wait for health, check one request, record it.

    With --backend slurm: run the Slurm placement rules too, submit one batch job, wait for
    its processes' health, check one request, record the job."""
    flags = SlurmFlags.of(locals())
    chosen = check_chosen(ctx, backend.value if backend else None)
    if canary_scope not in ("all", "router"):
        bad_input(f"--canary-scope {canary_scope!r}: expected all or router")
    opts = launch.UpOptions(
        timeout=timeout,
        canary=canary_scope if canary else "off",
        replace=replace,
        stop_grace=grace,
        topology_path=str(topology.resolve()),
        explain=_doctor_findings,
    )
    if chosen == "slurm":
        plan, _, _, opts.slurm = slurm_cli.validated(topology, flags, as_json)
        runtime = runtime_for("slurm")
    else:
        # A running Slurm job of this deployment is the first thing to say (before rules the
        # SSH backend adds, e.g. side-channel-host for Slurm node names).
        slurm_cli.refuse_ssh_up(resolve_deployment(str(topology), as_json))
        connect = connect_options(accept_new_host_keys, known_hosts, ssh_config)
        # The hosts connected to read CPU hosts' cores are the ones the launch then uses.
        opts.pool = HostPool(connect)
        plan = plan_on_hosts(topology, connect, as_json, pool=opts.pool)
        opts.connect = connect
        # `up` runs it once it has proven nothing of the deployment runs (a running one
        # holds its own ports, which the port probe would report as taken).
        if not skip_check:
            opts.preflight = lambda launch_: _preflight(plan, connect, launch_, as_json)
        runtime = runtime_for("ssh", connect)
    reporter = RichReporter(err.resolved(), enabled=not as_json)  # type: ignore[attr-defined]
    try:
        with reporter:
            result = launch.up(runtime, plan, opts, reporter)
    except ERRORS as exc:
        if as_json:
            print_json({"backend": runtime.name, **_failure_json(exc)})
        elif isinstance(exc, launch.Interrupted):
            _print_failure(exc)  # its message says what was rolled back and what is left
        elif isinstance(exc, launch.LaunchError):
            _print_failure(exc)
            if exc.rolled_back:
                err.print("rolled back: everything this run started was stopped")
            elif exc.rolled_back is None:
                err.print("nothing was started")
        else:
            print_error(str(exc))
        code = EXIT_INTERRUPTED if isinstance(exc, launch.Interrupted) else EXIT_FAILED
        raise typer.Exit(code) from None
    if as_json:
        print_json(
            {
                "ok": True,
                "backend": result.backend,
                **result.handle,
                "changed": result.changed,
                "message": result.message,
                "endpoint": result.endpoint,
                "endpoints": dict(result.endpoints),
                "elapsed_s": round(result.elapsed_s, 3),
                "healthy_s": round(result.healthy_s, 3),
                "canary": None
                if result.canary is None
                else {
                    "ok": result.canary.ok,
                    "message": result.canary.message,
                    **result.canary.details,
                },
            }
        )
        return
    style = "green" if result.changed else "cyan"
    out.print(f"[{style}]{result.message}[/]")
    if result.canary is not None:
        out.print(f"canary: {result.canary.message}")
    if result.changed:
        out.print(f"up in {result.elapsed_s:.1f}s (all healthy after {result.healthy_s:.1f}s)")
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column()
    table.add_column()
    for name, url in result.endpoints:
        table.add_row(name, url)
    for key, value in result.handle.items():  # e.g. the Slurm job id
        table.add_row(key.replace("_", " "), str(value))
    out.print(table)


@app.command("down", short_help=summary("down"))
def down_cmd(
    ctx: typer.Context,
    target: TargetArg = None,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
    grace: DownGraceOpt = 10.0,
    as_json: JsonOpt = False,
    backend: RecordedBackendOpt = None,
) -> None:
    """Stop a deployment: router first, then decode, then prefill. Safe to repeat.

    Given the topology file and nothing recorded here, finds the processes on their hosts by
    their pid files (each confirmed by the log it writes) and stops those. A Slurm job is
    cancelled, and found gone with every process of it."""
    deployment = resolve_deployment(target, as_json)
    which = slurm_cli.recorded_backend(deployment, backend)
    check_recorded(ctx, which.value, backend is not None, deployment)
    connect = connect_options(accept_new_host_keys, known_hosts, ssh_config)
    plan = None
    if which is slurm_cli.Backend.ssh:
        try:
            readable = load_state(deployment) is not None
        except RecordFormatError as exc:
            bad_input(str(exc))  # not damaged: never taken for lost (recorded_backend says so)
        except StateError:
            # A damaged record: with the topology file, the SSH runtime finds the processes
            # by their pid files instead; without it, it says so.
            readable = False
        if not readable and target is not None and Path(target).is_file():
            plan = plan_or_exit(Path(target), as_json)
    runtime = runtime_for(which.value, connect)
    try:
        result = launch.down(runtime, deployment, plan=plan, grace=grace)
    except ERRORS as exc:
        if as_json:
            print_json({"backend": runtime.name, **_failure_json(exc)})
        else:
            print_error(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    if as_json:
        print_json(
            {
                "ok": True,
                "backend": runtime.name,
                "deployment": deployment,
                "stopped": result.stopped,
                "message": result.message,
                # Slurm: the job cancelled (None when nothing was recorded) and what is left
                **({"job_id": None, "left": []} if runtime.name == "slurm" else {}),
                **result.handle,
            }
        )
    else:
        out.print(result.message)


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


@app.command("status", short_help=summary("status"))
def status_cmd(
    ctx: typer.Context,
    target: TargetArg = None,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
    as_json: JsonOpt = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Keep watching that the deployment serves disaggregated: per process, "
            "requests, prompt tokens computed here vs loaded over the KV connector, failed "
            "transfers, expired leases; flags a decode that stops receiving KV",
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between --watch refreshes")
    ] = 5.0,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Stop --watch after N refreshes")
    ] = None,
    backend: RecordedBackendOpt = None,
) -> None:
    """Show every recorded process: host, pid, alive, health, uptime (a Slurm job: its state
    from squeue/sacct, each process's node and health). Exit 1 unless all are alive and
    healthy (with --watch: unless every refresh found the deployment disaggregated)."""
    deployment = resolve_deployment(target, as_json)
    which = slurm_cli.recorded_backend(deployment, backend)
    check_recorded(ctx, which.value, backend is not None, deployment)
    if watch:  # it reads /metrics over HTTP, on any backend: no SSH connection
        refuse_unused(ctx, SSH_TRIO, "by status --watch (it reads /metrics over HTTP)")
    else:
        refuse_unused(ctx, ["--interval", "--count"], "without --watch")
    if watch:
        watch_cli.watch(deployment, which.value, interval, count, as_json)
        return
    connect = connect_options(accept_new_host_keys, known_hosts, ssh_config)
    runtime = runtime_for(which.value, connect)
    try:
        report = launch.status(runtime, deployment)
    except ERRORS as exc:
        failed(str(exc))
    if report is None:
        if as_json:
            print_json({"deployment": deployment, "recorded": False, "processes": []})
        else:
            what = "no Slurm job recorded" if runtime.name == "slurm" else "not running"
            out.print(f"{deployment}: {what} (nothing recorded)")
        raise typer.Exit(EXIT_FAILED)
    seen = report.observation
    if as_json:
        print_json(
            {
                "deployment": deployment,
                "recorded": True,
                "backend": runtime.name,
                "status": seen.status,
                "endpoint": report.endpoint,
                "healthy": report.healthy,
                **seen.handle,
                "processes": report.rows,
            }
        )
    else:
        _print_status(report)
    raise typer.Exit(EXIT_OK if report.healthy else EXIT_FAILED)


def _print_status(report: launch.StatusReport) -> None:
    seen = report.observation
    title = escape(seen.title)
    if seen.backend == "slurm":  # the job's state, coloured, and where the router listens
        style = "green" if seen.running else "red"
        job = seen.handle["job"]
        title = title.replace(f" {job['state']}", f" [{style}]{job['state']}[/]", 1)
        if report.endpoint:
            title += f" {report.endpoint}"
    out.print(title)  # not a table title: that wraps at the table's width
    table = Table()
    for col in ("process", "host", "pid", "alive", "health", "uptime"):
        table.add_column(col, overflow="fold")
    for r in report.rows:
        alive = (
            "[green]yes[/]"
            if r["alive"]
            else "[red]partly[/]"
            if r.get("left_running")
            else "[red]no[/]"
            if r["alive"] is False
            else f"[yellow]?[/] {r['error'] or ''}"
        )
        hl = r["health"] or ""
        hstyle = "green" if hl in ("healthy", "headless") else "red"
        table.add_row(
            r["process"],
            r["host"] or "",
            str(r["pid"] or ""),
            alive,
            f"[{hstyle}]{escape(hl)}[/]",
            _uptime(r["uptime_s"]),
        )
    out.print(table)


@app.command("logs", short_help=summary("logs"))
def logs_cmd(
    ctx: typer.Context,
    args: Annotated[
        list[str],
        typer.Argument(
            help="[TOPOLOGY|DEPLOYMENT] PROCESS (deployment defaults to the only recorded one)",
            show_default=False,
        ),
    ],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines")] = False,
    lines: Annotated[int, typer.Option("-n", "--lines", min=0, help="Lines to show")] = 50,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
    backend: RecordedBackendOpt = None,
) -> None:
    """Print (or follow) the log of one process (of a Slurm job also `driver`, the batch
    script's own)."""
    if len(args) == 1:
        deployment, name = resolve_deployment(None), args[0]
    elif len(args) == 2:
        deployment, name = resolve_deployment(args[0]), args[1]
    else:
        bad_input("usage: pdlaunch logs [TOPOLOGY|DEPLOYMENT] PROCESS")
    which = slurm_cli.recorded_backend(deployment, backend)
    check_recorded(ctx, which.value, backend is not None, deployment)
    connect = connect_options(accept_new_host_keys, known_hosts, ssh_config)
    runtime = runtime_for(which.value, connect)
    try:
        for line in launch.logs(runtime, deployment, name, lines=lines, follow=follow):
            out.out(line, highlight=False)
    except ERRORS as exc:
        failed(str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_OK) from None
