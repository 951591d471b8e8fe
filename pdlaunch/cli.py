"""The command line: parse options, call the layers, print. Exit codes: 0 valid,
1 findings (or a failed operation), 2 unreadable input."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdlaunch.load import LoadError, load
from pdlaunch.plan import Plan, build_plan
from pdlaunch.render import render_plan, write_files
from pdlaunch.rules import Finding, has_errors, validate
from pdlaunch.topology import Topology

EXIT_OK, EXIT_FINDINGS, EXIT_INPUT = 0, 1, 2

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Declarative launcher for prefill/decode disaggregated vLLM serving.",
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

TopologyArg = Annotated[Path, typer.Argument(help="Topology YAML file", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output")]


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _load_or_exit(path: Path, as_json: bool) -> tuple[Topology, object]:
    try:
        return load(path)
    except LoadError as exc:
        if as_json:
            print_json(
                {
                    "valid": False,
                    "input_errors": [
                        {"file": p.file, "line": p.line, "field": p.field, "message": p.message}
                        for p in exc.problems
                    ],
                }
            )
        else:
            for p in exc.problems:
                err.print(f"[bold red]error[/] {p.where()}: {p.message}")
        raise typer.Exit(EXIT_INPUT) from None


def finding_dict(f: Finding) -> dict[str, object]:
    return {
        "rule": f.rule,
        "severity": f.severity,
        "file": f.file,
        "line": f.line,
        "field": f.where.split(" ", 1)[-1] if f.field else "",
        "message": f.message,
        "fix": f.fix,
        "source": f.source,
    }


def print_findings(findings: list[Finding]) -> None:
    table = Table(title="Findings", show_lines=True)
    for col in ("rule", "where", "message", "fix"):
        table.add_column(col, overflow="fold")
    for f in findings:
        color = "red" if f.severity == "error" else "yellow"
        table.add_row(f"[{color}]{f.rule}[/]", f.where, f.message, f.fix)
    err.print(table)


def load_valid(path: Path, as_json: bool = False) -> tuple[Topology, list[Finding]]:
    """Load and validate; exit 2 on unreadable input, 1 on rule errors."""
    topo, source = _load_or_exit(path, as_json)
    findings = validate(topo, source)  # type: ignore[arg-type]
    if has_errors(findings):
        if as_json:
            print_json({"valid": False, "findings": [finding_dict(f) for f in findings]})
        else:
            print_findings(findings)
            n = sum(f.severity == "error" for f in findings)
            err.print(f"[bold red]{path}: {n} error(s); nothing was started or written.[/]")
        raise typer.Exit(EXIT_FINDINGS)
    if findings and not as_json:
        print_findings(findings)
    return topo, findings


def plan_or_exit(path: Path, as_json: bool = False) -> Plan:
    topo, _ = load_valid(path, as_json)
    return build_plan(topo)


@app.command("validate")
def validate_cmd(topology: TopologyArg, as_json: JsonOpt = False) -> None:
    """Check a topology against every rule; nothing is started."""
    topo, findings = load_valid(topology, as_json)
    if as_json:
        print_json({"valid": True, "findings": [finding_dict(f) for f in findings]})
    else:
        n = len(topo.prefill) + len(topo.decode)
        out.print(f"[green]{topology}: valid[/] ({n} instances, {len(findings)} warning(s))")


@app.command("plan")
def plan_cmd(topology: TopologyArg, as_json: JsonOpt = False) -> None:
    """Show every process the topology resolves to."""
    plan = plan_or_exit(topology, as_json)
    if as_json:
        print_json(plan.model_dump(mode="json"))
        return
    table = Table(title=f"{plan.deployment}: agreed block size {plan.agreed_block_size}")
    for col in ("process", "role", "host", "ports", "devices", "health"):
        table.add_column(col, overflow="fold")
    for p in plan.processes:
        table.add_row(
            p.name,
            p.role,
            p.host,
            ", ".join(f"{x.port} {x.purpose}" for x in p.ports),
            ",".join(map(str, p.devices)),
            p.health_url or "(headless)",
        )
    out.print(table)


@app.command("render")
def render_cmd(
    topology: TopologyArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="Directory for the scripts")],
    as_json: JsonOpt = False,
) -> None:
    """Write one runnable script per process, plus index.md and plan.json."""
    plan = plan_or_exit(topology, as_json)
    if output.exists() and not output.is_dir():
        err.print(f"[bold red]error[/] {output}: exists and is not a directory")
        raise typer.Exit(EXIT_INPUT)
    try:
        written = write_files(render_plan(plan), output)
    except OSError as exc:
        err.print(f"[bold red]error[/] cannot write to {output}: {exc.strerror}")
        raise typer.Exit(EXIT_INPUT) from None
    if as_json:
        print_json({"files": [str(p) for p in written]})
    else:
        for p in written:
            out.print(f"wrote {p}")


@app.command("schema")
def schema_cmd() -> None:
    """Print the topology JSON Schema (for yaml-language-server and editors)."""
    print_json(Topology.model_json_schema())


def main() -> None:
    app()


# Commands kept in their own modules register themselves on `app`; imported last because
# they import `app` from here.
from pdlaunch import cli_bench, cli_check, cli_launch  # noqa: E402, F401
