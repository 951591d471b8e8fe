"""`pdlaunch bench TOPOLOGY`: run `vllm bench serve` from the control host through the
deployment's router and show TTFT, ITL, TPOT and throughput. Exit 0 when every request
succeeded and the run was served disaggregated, 1 when the benchmark failed, 2 on
unreadable input, 3 when it ran but the engines' counters show requests recomputed on
decode instead of loaded over the KV connector (benchdisagg.py): not a PD result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NoReturn

import typer
from rich.table import Table
from rich.text import Text

from pdlaunch import bench, benchdisagg, record
from pdlaunch.cli.app import (
    EXIT_FAILED,
    app,
    bad_input,
    err,
    load_or_exit,
    out,
    plan_or_exit,
    print_error,
    print_json,
)
from pdlaunch.cli.options import BenchTimeoutOpt, JsonOpt, TopologyArg
from pdlaunch.health import base_url, get_text, probe
from pdlaunch.hosts import HostError, LocalHost
from pdlaunch.plan import Plan
from pdlaunch.rules import RUNTIME_ADDRESSED
from pdlaunch.state import StateError

# The run completed but was not (entirely) disaggregated: its numbers are not a PD result.
EXIT_NOT_DISAGGREGATED = 3

_ROWS = (
    ("TTFT (ms)", "ttft"),
    ("ITL (ms)", "itl"),
    ("TPOT (ms)", "tpot"),
    ("E2E latency (ms)", "e2el"),
)


def _table(result: bench.BenchResult, title: str) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    for s in bench.STATS:
        table.add_column(s, justify="right")
    m = result.metrics
    for label, key in _ROWS:
        table.add_row(
            label,
            *(f"{m[f'{s}_{key}_ms']:.1f}" if f"{s}_{key}_ms" in m else "" for s in bench.STATS),
        )
    return table


def _summary(result: bench.BenchResult) -> Table:
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column()
    table.add_column(justify="right")
    m = result.metrics
    table.add_row("requests ok / failed", f"{result.completed} / {result.failed}")
    table.add_row("duration (s)", f"{result.duration_s:.2f}")
    table.add_row("request throughput (req/s)", f"{m['request_throughput']:.2f}")
    table.add_row("output throughput (tok/s)", f"{m['output_throughput']:.1f}")
    table.add_row("total token throughput (tok/s)", f"{m['total_token_throughput']:.1f}")
    return table


@app.command("bench")
def bench_cmd(
    topology: TopologyArg,
    num_prompts: Annotated[
        int,
        typer.Option("--num-prompts", min=1, max=bench.MAX_NUM_PROMPTS, help="Requests to send"),
    ] = bench.DEFAULT_NUM_PROMPTS,
    input_len: Annotated[
        int, typer.Option("--input-len", min=1, help="Prompt tokens per request (random)")
    ] = 128,
    output_len: Annotated[
        int, typer.Option("--output-len", min=1, help="Generated tokens per request")
    ] = 16,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Requests in flight at most")
    ] = 2,
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", help="Tokenizer path on this host (default: the model)"),
    ] = None,
    timeout: BenchTimeoutOpt = 1800.0,
    as_json: JsonOpt = False,
) -> None:
    """Benchmark a running deployment through its router (vllm bench serve, random dataset)."""
    topo, _ = load_or_exit(topology, as_json)
    rec = _record(topo.deployment, as_json)
    # A Slurm job gives each node its own address at run time: the rules it was started
    # under (`up --backend slurm`) judge its topology here too.
    on_slurm = rec is not None and rec.backend == "slurm"
    plan = plan_or_exit(topology, as_json, RUNTIME_ADDRESSED if on_slurm else frozenset())
    opts = bench.BenchOptions(
        num_prompts=num_prompts,
        input_len=input_len,
        output_len=output_len,
        concurrency=concurrency,
        tokenizer=tokenizer,
    )
    try:
        opts.check()
    except bench.BenchError as exc:
        bad_input(str(exc))
    try:
        vllm = bench.find_vllm()
        bench.check_tokenizer(opts.tokenizer or plan.model)
    except bench.BenchError as exc:
        _fail(str(exc), as_json)
    target = _target(plan, rec, as_json)
    health_url = target.health_url
    if health_url and not probe(health_url, timeout=5).ok:
        _fail(f"the router is not healthy at {health_url} (is the deployment up?)", as_json)

    def announce(argv: list[str]) -> None:
        if not as_json:
            err.print(Text(" ".join(argv), style="dim"))

    engines = {name: role for name, (role, _) in target.engines.items()}
    before = _metrics(target)
    # The client runs on the control host (the tokenizer and `vllm` were found here), through
    # the hosts layer like every other command pdlaunch runs.
    host = LocalHost()
    try:
        result = bench.run_bench(
            host, plan, opts, vllm=vllm, timeout=timeout, announce=announce, base_url=target.base
        )
    except bench.BenchError as exc:
        _fail(str(exc), as_json, exc.tail)
    except HostError as exc:
        _fail(str(exc), as_json)
    finally:
        host.close()
    verdict = benchdisagg.judge(engines, before, _metrics(target), input_len)
    if as_json:
        print_json(
            {
                "endpoint": target.base,
                "backend": target.backend,
                "model": plan.served_model_name,
                "num_prompts": num_prompts,
                "input_len": input_len,
                "output_len": output_len,
                "concurrency": concurrency,
                **result.to_dict(),
                "disaggregated": verdict.to_dict(),
            }
        )
    else:
        out.print(_table(result, f"{plan.deployment}: {target.base} ({plan.served_model_name})"))
        out.print(_summary(result))
    if not result.ok:
        if not as_json:
            err.print(
                f"[bold red]{result.failed} of {result.completed + result.failed} "
                "requests failed[/]"
            )
        raise typer.Exit(EXIT_FAILED)
    if not verdict.ok:
        if not as_json:
            err.print(
                "[bold red]not a disaggregated result[/]: "
                f"{verdict.recomputed} request(s) recomputed on decode"
            )
            for line in benchdisagg.summary(verdict):
                err.print(f"  {line}")
        raise typer.Exit(EXIT_NOT_DISAGGREGATED)


@dataclass(frozen=True)
class Target:
    """Where the benchmark goes: the router's base URL and health URL, and each engine's
    role and /metrics URL (None: not known)."""

    backend: str | None  # None: nothing recorded here, the plan's addresses
    base: str
    health_url: str | None
    engines: dict[str, tuple[str, str | None]]


def _record(deployment: str, as_json: bool) -> record.Record | None:
    try:
        return record.find(deployment)
    except StateError as exc:
        _fail(str(exc), as_json)


def _target(plan: Plan, rec: record.Record | None, as_json: bool) -> Target:
    """Where the deployment really runs: its record (SSH or Slurm: a Slurm job's router is
    on the allocation's first node, at the address Slurm reaches it), else, with nothing
    recorded here, the plan's addresses (a deployment started from another control host)."""
    if rec is None:
        metrics = {
            p.name: (p.role, base_url(p.health_url) + "/metrics" if p.health_url else None)
            for p in plan.processes
            if p.role in ("prefill", "decode")
        }
        return Target(None, plan.endpoint(), plan.router.health_url, metrics)
    router = rec.router
    if rec.endpoint is None or router is None:
        why = ""
        if isinstance(rec.handle, record.SlurmHandle):
            why = f": Slurm job {rec.handle.job_id} is {rec.handle.job_state}"
            why += f" ({rec.handle.job_detail})" if rec.handle.job_detail else ""
        _fail(f"{plan.deployment}: its router is not running{why}", as_json)
    engines = {p.name: (p.role, p.metrics_url) for p in rec.engines()}
    return Target(rec.backend, rec.endpoint, router.health_url, engines)


def _metrics(target: Target) -> dict[str, str | None]:
    """Each engine's /metrics text (None where it does not answer), read from here."""
    out: dict[str, str | None] = {}
    for name, (_, url) in target.engines.items():
        try:
            out[name] = get_text(url, timeout=10) if url else None
        except OSError:
            out[name] = None
    return out


def _fail(message: str, as_json: bool, tail: str = "") -> NoReturn:
    if as_json:
        print_json({"ok": False, "error": message, "output_tail": tail})
    else:
        print_error(message)
        if tail.strip():
            err.print(Text(tail.rstrip("\n")))
    raise typer.Exit(EXIT_FAILED)
