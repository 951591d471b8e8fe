"""`canary`: prove a running deployment serves disaggregated on every prefill -> decode pair,
then through its router (pdlaunch/observe/canary.py), on whichever runtime started it (a Slurm job's
engines where Slurm placed them). Exit 0 when everything passed, 1 when a pair (or the router
path) failed, 2 on a wrong argument or a deployment that is not recorded."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from pdlaunch import doctor
from pdlaunch.cli import summary
from pdlaunch.cli.backend_options import check_recorded
from pdlaunch.cli.common import EXIT_FAILED, app, bad_input, err, failed, out, print_json
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
from pdlaunch.hosts import ConnectOptions
from pdlaunch.observe import canary as pairs_canary
from pdlaunch.observe import health
from pdlaunch.runtime.record import Record, SlurmHandle
from pdlaunch.runtime.record_store import find
from pdlaunch.runtime.state import DeploymentState, StateError


@app.command("canary", short_help=summary("canary"))
def canary_cmd(
    ctx: typer.Context,
    target: TargetArg = None,
    router: Annotated[
        bool,
        typer.Option(
            "--router/--no-router",
            help="After the pairs, also send one request through the router",
        ),
    ] = True,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1, help="Seconds one request may take")
    ] = 300.0,
    sequential: Annotated[
        bool,
        typer.Option(
            "--sequential",
            help="One pair at a time (default: the decodes in parallel, each decode's pairs "
            "in turn)",
        ),
    ] = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
    as_json: JsonOpt = False,
    backend: RecordedBackendOpt = None,
) -> None:
    """Send every prefill -> decode pair of a running deployment one request directly (as the
    router would), check from the decode's own counters that the KV moved and that the
    answer equals prefill alone; then one request through the router. A failing pair is
    named with the doctor findings that explain it. Exit 1 when anything failed."""
    deployment = resolve_deployment(target, as_json)
    which = recorded_backend(deployment, backend)
    check_recorded(ctx, which.value, backend is not None, deployment)
    rec = _record(deployment, which.value)
    state = doctor.state_of(rec)
    prefills = pairs_canary.engines(state.processes, "prefill")
    decodes = pairs_canary.engines(state.processes, "decode")
    h = rec.handle
    if isinstance(h, SlurmHandle) and h.job_state != "RUNNING":
        failed(f"{deployment}: Slurm {h.job_said}: no engine to ask")
    if not prefills or not decodes:
        bad_input(
            f"{deployment}: no prefill and decode engines with an HTTP endpoint are recorded; "
            "nothing to pair"
        )
    t0 = time.monotonic()

    min_tokens = _min_prompt_tokens(state)
    results = []
    for r in pairs_canary.iter_pairs(
        prefills,
        decodes,
        state.served_model_name,
        timeout=timeout,
        min_prompt_tokens=min_tokens,
        parallel=not sequential,
    ):
        if not as_json:
            mark = "[green]ok[/]" if r.ok else "[bold red]FAILED[/]"
            err.print(f"canary {escape(r.pair)}: {mark} ({r.latency_s or 0:.2f}s)")
        results.append(r)
    results = pairs_canary.in_pair_order(results, prefills, decodes)
    bad = [r for r in results if not r.ok]
    note = None
    if bad:
        note = _explain(bad, rec, connect_options(accept_new_host_keys, known_hosts, ssh_config))
    through_router = None
    if router and not bad:
        through_router = health.canary(
            state.endpoint,
            state.served_model_name,
            [p.url + "/health" for p in prefills],
            [d.url + "/health" for d in decodes],
            timeout=timeout,
            reference_health=[p.url + "/health" for p in prefills],
            min_prompt_tokens=min_tokens,
        )
    summary = pairs_canary.summarize(results, through_router)
    if as_json:
        print_json(
            {
                "deployment": deployment,
                "ok": summary.ok,
                "message": summary.message,
                "pairs": [r.to_dict() for r in results],
                "router": None
                if through_router is None
                else {
                    "ok": through_router.ok,
                    "message": through_router.message,
                    **through_router.details,
                },
                "doctor_note": note,
                "elapsed_s": round(time.monotonic() - t0, 3),
            }
        )
    else:
        _print(deployment, results, through_router, note, router and bool(bad))
    if not summary.ok:
        raise typer.Exit(EXIT_FAILED)


def _record(deployment: str, backend: str) -> Record:
    """The deployment's record, its processes where they run (a Slurm job's: where Slurm
    placed them)."""
    try:
        rec = find(deployment, backend)
    except StateError as exc:
        failed(str(exc))
    if rec is None:
        bad_input(
            f"no deployment {deployment!r} is recorded on this control host (`pdlaunch status` "
            "lists them)"
        )
    return rec


def _min_prompt_tokens(state: DeploymentState) -> int:
    """As `up` sends: more than two of the largest prefill block (the plan of the recorded
    topology; 0 when it cannot be planned again, and the prompt stays its default size)."""
    from pdlaunch.doctor.collect import load_topology
    from pdlaunch.runtime.lifecycle.canary import max_prefill_block

    plan = load_topology(state).plan
    return 2 * max_prefill_block(plan) + 1 if plan is not None else 0


def _explain(
    bad: list[pairs_canary.PairResult], rec: Record, connect: ConnectOptions
) -> str | None:
    """The doctor findings of the failed pairs' engines (logs over SSH or in a Slurm job's
    work dirs, /metrics); a note saying why there are none when the doctor could not look."""
    try:
        with doctor.host_pool(rec, connect) as pool:
            findings = doctor.diagnose(rec, pool, lines=300)
    except Exception as exc:  # the failed pairs are reported either way
        return f"doctor could not examine the deployment: {exc}"
    pairs_canary.attach_findings(bad, findings)
    return None


def _print(
    deployment: str,
    results: list[pairs_canary.PairResult],
    through_router: health.CanaryResult | None,
    note: str | None,
    router_skipped: bool,
) -> None:
    table = Table(title=f"{deployment}: prefill → decode pairs", show_lines=True)
    for col in ("pair", "result", "time", "detail"):
        table.add_column(col, overflow="fold")
    for r in results:
        result = "[green]ok[/]" if r.ok else "[bold red]FAILED[/]"
        detail = escape(r.message)
        if r.findings:
            detail += "\n[dim]doctor: " + escape("; ".join(r.findings)) + "[/]"
        when = f"{r.latency_s:.2f}s" if r.latency_s is not None else "-"
        table.add_row(escape(r.pair), result, when, detail)
    out.print(table)
    if note:
        out.print(f"[yellow]{escape(note)}[/]")
    if through_router is not None:
        color = "green" if through_router.ok else "bold red"
        out.print(f"router: [{color}]{escape(through_router.message)}[/]")
    elif router_skipped:
        out.print("router: not tried (a pair failed; the router may route through it)")
    bad = sum(not r.ok for r in results)
    if bad:
        out.print(f"[bold red]{bad} of {len(results)} pair(s) failed[/]")
