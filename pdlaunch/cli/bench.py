"""`pdlaunch bench TOPOLOGY`: run `vllm bench serve` from the control host through the
deployment's router and show TTFT, ITL, TPOT and throughput. Exit 0 when every request
succeeded and the run was served disaggregated, 1 when the benchmark failed, 2 on
unreadable input, 3 when it ran but the engines' counters show requests recomputed on
decode instead of loaded over the KV connector (benchdisagg.py): not a PD result."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table
from rich.text import Text

from pdlaunch.cli import summary
from pdlaunch.cli.common import (
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
from pdlaunch.fsutil import ReadRefused, atomic_write, dumps_json_finite, read_json_bounded
from pdlaunch.hosts import HostError, LocalHost
from pdlaunch.observe import bench, lease_budget
from pdlaunch.observe import bench_disagg as benchdisagg
from pdlaunch.observe import bench_hops as benchhops
from pdlaunch.observe import hops_plot as hopsplot
from pdlaunch.observe.health import base_url, get_text, probe
from pdlaunch.plan import lease as kvlease
from pdlaunch.plan.build import Plan
from pdlaunch.rules import SLURM_SKIP
from pdlaunch.runtime import record, record_store
from pdlaunch.runtime.state import StateError

# A `check --bandwidth --json` report is a few KB per host pair; far more is not one.
FABRIC_MAX_BYTES = 16 << 20

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


@app.command("bench", short_help=summary("bench"))
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
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write the result JSON (bench.json) and the per-hop plot (hops.svg) here",
        ),
    ] = None,
    fabric: Annotated[
        Path | None,
        typer.Option(
            "--fabric",
            help="`pdlaunch check --bandwidth --json` output: KV GB/s as a share of it",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Benchmark a running deployment through its router (vllm bench serve, random dataset)
    and break its time down hop by hop from the engines' and the router's /metrics."""
    topo, _ = load_or_exit(topology, as_json)
    rec = _record(topo.deployment, as_json)
    # A Slurm job gives each node its own address at run time: the rules it was started
    # under (`up --backend slurm`) judge its topology here too.
    on_slurm = rec is not None and rec.backend == "slurm"
    plan = plan_or_exit(topology, as_json, SLURM_SKIP if on_slurm else frozenset())
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
    fabric_gbps = _fabric(fabric)
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
    router_before = _router_metrics(target)
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
    after = _metrics(target)
    verdict = benchdisagg.judge(engines, before, after, input_len)
    hops, lease = _hops(target, engines, before, after, router_before, result, fabric_gbps, plan)
    doc = {
        "endpoint": target.base,
        "backend": target.backend,
        "model": plan.served_model_name,
        "num_prompts": num_prompts,
        "input_len": input_len,
        "output_len": output_len,
        "concurrency": concurrency,
        **result.to_dict(),
        "disaggregated": verdict.to_dict(),
        "hops": hops.to_dict(),
        "kv_lease": lease,
    }
    title = f"{plan.deployment}: {target.base} ({plan.served_model_name})"
    saved = _save(out_dir, doc, hops, title, as_json)
    if as_json:
        print_json(doc)
    else:
        out.print(_table(result, title))
        out.print(_summary(result))
        out.print(_hops_table(hops))
        out.print(benchhops.kv_line(hops.kv))
        for name, rate in hops.kv_by_decode.items():
            out.print(f"  {name}: " + benchhops.kv_line(rate))
        for note in hops.notes + hops.problems:
            err.print(Text(note, style="dim"))
        _print_lease(lease)
        for path in saved:
            out.print(f"wrote {path}")
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


def _fabric(path: Path | None) -> float | None:
    """The slowest prefill -> decode ib_write_bw average of a saved `check --bandwidth --json`
    report (check keeps no record of it)."""
    if path is None:
        return None
    try:
        report = read_json_bounded(path, FABRIC_MAX_BYTES, what="--fabric report")
    except ReadRefused as exc:
        bad_input(str(exc))
    gbps = benchhops.fabric_gbps_from_check(report) if isinstance(report, dict) else None
    if gbps is None:
        bad_input(f"--fabric {path}: no ib_write_bw result (`pdlaunch check --bandwidth --json`)")
    return gbps


def _hops(
    target: Target,
    engines: dict[str, str],
    before: dict[str, str | None],
    after: dict[str, str | None],
    router_before: str | None,
    result: bench.BenchResult,
    fabric_gbps: float | None,
    plan: Plan,
) -> tuple[benchhops.Breakdown, dict[str, Any]]:
    """The per-hop breakdown of the run and, per decode, its lease gap against the lease."""
    roles = dict(engines)
    b, a = dict(before), dict(after)
    if target.router_metrics is not None:
        roles["router"] = "router"
        b["router"], a["router"] = router_before, _router_metrics(target)
    ttft = result.metrics.get("mean_ttft_ms")
    hops = benchhops.breakdown(roles, b, a, ttft / 1e3 if ttft is not None else None, fabric_gbps)
    # Prefill done -> decode's engine has the request: the hand-offs through the router and
    # decode's HTTP frontend, known only as means (kvlease.py).
    extra = sum(
        h.mean_s
        for key in ("handoff", "decode_frontend")
        if (h := hops.hop(key)) is not None and h.mean_s is not None and h.mean_s > 0
    )
    lease = kvlease.plan_lease(plan)
    pairs = []
    for name, role in engines.items():
        if role != "decode" or a.get(name) is None:
            continue
        g = lease_budget.gap_from_metrics(name, b.get(name), a[name] or "", extra)
        pairs.append({**g.to_dict(), "warning": lease_budget.budget_warning(g, lease)})
    return hops, {
        "lease_s": lease.seconds if lease else None,
        "lease_source": lease.source if lease else None,
        "warn_fraction": lease_budget.WARN_FRACTION,
        "pairs": pairs,
    }


def _hops_table(hops: benchhops.Breakdown) -> Table:
    table = Table(title="per hop (histogram deltas over the run; derived rows: means only)")
    for col in ("hop", "n", "p50 ms", "p99 ms", "mean ms"):
        table.add_column(col, justify="left" if col == "hop" else "right")
    for row in benchhops.rows(hops):
        table.add_row(*row)
    return table


def _print_lease(lease: dict[str, Any]) -> None:
    if lease["lease_s"] is None:
        return
    for p in lease["pairs"]:
        if p["gap_p99_s"] is None:
            continue
        out.print(
            f"KV lease {lease['lease_s']:g} s ({lease['lease_source']}); {p['decode']}: gap "
            f"prefill done -> decode read p50 {p['p50_bound']}{p['gap_p50_s']:.2f} s, "
            f"p99 {p['p99_bound']}"
            f"{p['gap_p99_s']:.2f} s (estimated: decode queue time + mean hand-off)"
        )
        if p["warning"]:
            err.print(f"[yellow]warning[/]: {p['warning']}")


def _save(
    out_dir: Path | None, doc: dict[str, Any], hops: benchhops.Breakdown, title: str, quiet: bool
) -> list[Path]:
    if out_dir is None:
        return []
    data, plot = out_dir / bench.RESULT_FILENAME, out_dir / "hops.svg"
    try:
        # Both made whole before either is written: a plot that cannot be drawn leaves no
        # result behind that the plot's absence would contradict.
        texts = [dumps_json_finite(doc, indent=2) + "\n", hopsplot.svg(hops, title)]
        out_dir.mkdir(parents=True, exist_ok=True)
        # A user-named directory: a bench.json or hops.svg planted there as a symlink is
        # replaced, never written through.
        for path, text in zip((data, plot), texts, strict=True):
            atomic_write(path, text, 0o644)
    except OSError as exc:
        _fail(f"cannot write the result to {out_dir}: {exc}", quiet)
    return [data, plot]


@dataclass(frozen=True)
class Target:
    """Where the benchmark goes: the router's base URL and health URL, and each engine's
    role and /metrics URL (None: not known)."""

    backend: str | None  # None: nothing recorded here, the plan's addresses
    base: str
    health_url: str | None
    engines: dict[str, tuple[str, str | None]]
    router_metrics: str | None = None


def _record(deployment: str, as_json: bool) -> record.Record | None:
    try:
        return record_store.find(deployment)
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
        router_metrics = record.metrics_url_of("router", plan.router.health_url, _router_port(plan))
        return Target(None, plan.endpoint(), plan.router.health_url, metrics, router_metrics)
    router = rec.router
    if rec.endpoint is None or router is None:
        why = ""
        if isinstance(rec.handle, record.SlurmHandle):
            why = f": Slurm {rec.handle.job_said}"
        _fail(f"{plan.deployment}: its router is not running{why}", as_json)
    engines = {p.name: (p.role, p.metrics_url) for p in rec.engines()}
    return Target(rec.backend, rec.endpoint, router.health_url, engines, router.metrics_url)


def _router_port(plan: Plan) -> int | None:
    """vllm-router's --prometheus-port in the plan's argv (None: not rendered)."""
    argv = plan.router.argv
    for i, arg in enumerate(argv[:-1]):
        if arg == "--prometheus-port" and argv[i + 1].isdigit():
            return int(argv[i + 1])
    return None


def _router_metrics(target: Target) -> str | None:
    if target.router_metrics is None:
        return None
    try:
        return get_text(target.router_metrics, timeout=10)
    except OSError:
        return None


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
