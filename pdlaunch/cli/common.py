"""The typer app every command registers on, its consoles, exit codes, and the helpers that
turn bad input into a message and an exit code (never a traceback).

Imports no command module, and nothing heavy at import time (the command line answers
``--help`` from this module and typer alone): the topology, the rules and the plan are
imported by the helpers that use them.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
import typer.core
from rich.markup import escape

from pdlaunch.fsutil import dumps_json_finite

if TYPE_CHECKING:
    from rich.console import Console

    from pdlaunch.hosts import HostPool
    from pdlaunch.hosts.options import ConnectOptions
    from pdlaunch.plan.build import Plan
    from pdlaunch.rules import Finding, Judgement
    from pdlaunch.spec.load import LoadError, Source
    from pdlaunch.spec.topology import Topology

EXIT_OK = 0
EXIT_FINDINGS = 1  # rule errors, or a failed check
EXIT_FAILED = 1  # an operation (up, down, bench, ...) failed
EXIT_INPUT = 2  # unreadable input or a wrong argument
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def _type_label(
    param: typer.core.TyperOption | typer.core.TyperArgument, ctx: object
) -> str | None:
    """The value an option takes, as `--help` shows it: FLOAT, INTEGER, TEXT, PATH or the
    choices, and nothing for a flag, where typer 0.29 prints `<bool>`, `<float range>`,
    `<str>` (its display_type_rich, which its plain and rich help both call)."""
    if param.metavar is not None:
        return param.metavar
    if isinstance(param, typer.core.TyperOption) and (param.is_flag or param.count):
        return None
    label = typer.core.TyperArgument.display_type(param, ctx)  # type: ignore[arg-type]
    label = label.strip("<>").removesuffix(" range")
    if "|" in label:
        return label
    return {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH"}.get(
        label, label.upper()
    )


typer.core.TyperOption.display_type_rich = _type_label  # type: ignore[method-assign,assignment]
typer.core.TyperArgument.display_type_rich = _type_label  # type: ignore[method-assign,assignment]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help, as click formats it: rich's help panels cost the command line ~0.15 s of
    # imports on every `--help` (benchmarks/bench_cli_start.py).
    rich_markup_mode=None,
    help="Declarative launcher for prefill/decode disaggregated vLLM serving.",
)


def reflow(doc: str) -> str:
    """A docstring as `--help` should show it: each paragraph one line, for the terminal to
    wrap (typer keeps the line breaks of every paragraph but the first); list items and
    indented lines are kept as they are."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    out = []
    for para in paragraphs:
        lines = para.splitlines()
        if any(ln.startswith(("- ", "* ", " ")) for ln in lines):
            out.append(para)
        else:
            out.append(" ".join(ln.strip() for ln in lines))
    return "\n\n".join(out)


def reflow_help(typer_app: typer.Typer) -> None:
    """Every registered command's help reflowed (:func:`reflow`), sub-apps included."""
    for info in typer_app.registered_commands:
        doc = info.help or (inspect.getdoc(info.callback) if info.callback else None)
        if doc:
            info.help = reflow(doc)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)


@app.callback()
def _root() -> None:
    # A group even when the console script registered one command only (pdlaunch.cli.main):
    # typer runs a lone command without its name otherwise.
    pass


class _LazyConsole:
    """A rich Console made on first use: rich.console and its styles, themes and emoji cost
    `--help` ~30 ms of imports it never uses (benchmarks/bench_cli_start.py)."""

    def __init__(self, **options: object) -> None:
        self._options = options
        self._console: Console | None = None

    def resolved(self) -> Console:
        """The Console itself, for rich objects that keep it (Live sets attributes on it)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)  # type: ignore[arg-type]
        return self._console

    def __getattr__(self, name: str) -> object:
        return getattr(self.resolved(), name)


out: Console = _LazyConsole(highlight=False, soft_wrap=True)  # type: ignore[assignment]
err: Console = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)  # type: ignore[assignment]


def print_json(data: object) -> None:
    # NaN/Infinity are not JSON: a counter or a benchmark that gave one prints null.
    sys.stdout.write(dumps_json_finite(data, indent=2, sort_keys=True) + "\n")


def print_error(message: str) -> None:
    """A red `error` line on stderr. ``message`` is plain text: a path or host name with
    brackets in it must not be read as rich markup."""
    err.print(f"[bold red]error[/] {escape(message)}")


def bad_input(message: str) -> NoReturn:
    """A user mistake (a path, an argument): say so and exit 2."""
    print_error(message)
    raise typer.Exit(EXIT_INPUT)


def failed(message: str) -> NoReturn:
    """An operation that could not be done: say so and exit 1."""
    print_error(message)
    raise typer.Exit(EXIT_FAILED)


def load_or_exit(path: Path, as_json: bool) -> tuple[Topology, Source]:
    """The topology and its source lines; exit 2 with every problem on unreadable input."""
    from pdlaunch.spec.load import LoadError, load

    try:
        return load(path)
    except LoadError as exc:
        input_errors(exc, as_json)


def input_errors(exc: LoadError, as_json: bool) -> NoReturn:
    """Every problem of an unreadable input file (file, line, key), then exit 2."""
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
            print_error(f"{p.where()}: {p.message}")
    raise typer.Exit(EXIT_INPUT)


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


def finding_lines(f: Finding, width: int = 80) -> list[str]:
    """One finding as a compiler prints one: ``FILE:LINE: severity [rule] field`` first (the
    form editors and pre-commit hooks jump from), then the message and the fix, wrapped and
    indented. Plain text: the caller adds colour."""
    from pdlaunch.spec.load import dotted

    file_line = f"{f.file}:{f.line}" if f.file and f.line else (f.file or "topology")
    field = dotted(f.field)
    head = f"{file_line}: {f.severity} [{f.rule}]" + (f" {field}" if field else "")
    body = textwrap.wrap(f.message, width, initial_indent="  ", subsequent_indent="  ")
    if f.fix:
        body += textwrap.wrap(f"fix: {f.fix}", width, initial_indent="  ",
                              subsequent_indent="       ")  # fmt: skip
    return [head, *body]


def print_findings(findings: list[Finding]) -> None:
    width = max(40, err.width)
    for f in findings:
        head, *body = finding_lines(f, width)
        color = "red" if f.severity == "error" else "yellow"
        err.print(f"[{color}]{escape(head)}[/]", soft_wrap=True)
        for line in body:
            err.print(escape(line), soft_wrap=True)


def load_valid(
    path: Path, as_json: bool = False, skip: frozenset[str] = frozenset()
) -> tuple[Topology, list[Finding]]:
    """Load and validate; exit 2 on unreadable input, 1 on rule errors."""
    topo, source = load_or_exit(path, as_json)
    return topo, judged(path, topo, source, as_json, skip)


def judged(
    path: Path,
    topo: Topology,
    source: Source,
    as_json: bool,
    skip: frozenset[str] = frozenset(),
    shown: list[Finding] | None = None,
) -> list[Finding]:
    """Every rule's findings on ``topo``; exit 1 on errors. The findings are printed, but
    those in ``shown`` (already printed for the same file)."""
    return judgement(path, topo, source, as_json, skip, shown).findings


def judgement(
    path: Path,
    topo: Topology,
    source: Source,
    as_json: bool,
    skip: frozenset[str] = frozenset(),
    shown: list[Finding] | None = None,
) -> Judgement:
    """:func:`judged`, with the warnings the topology accepts kept apart (for `validate`)."""
    from pdlaunch.rules import has_errors, judge

    result = judge(topo, source, skip)
    if has_errors(result.findings):
        refuse(path, result.findings, as_json)
    new = [f for f in result.findings if f not in (shown or [])]
    if new and not as_json:
        print_findings(new)
    return result


def refuse(path: Path, findings: list[Finding], as_json: bool, backend: str = "") -> NoReturn:
    """Print the findings (or their JSON) and exit 1: ``backend`` names the target whose own
    rules refused, e.g. "Slurm"."""
    if as_json:
        print_json({"valid": False, "findings": [finding_dict(f) for f in findings]})
    else:
        print_findings(findings)
        n = sum(f.severity == "error" for f in findings)
        what = f" for {backend}; nothing was submitted" if backend else "; nothing was started"
        err.print(f"[bold red]{escape(str(path))}: {n} error(s){what} or written.[/]")
    raise typer.Exit(EXIT_FINDINGS)


def plan_or_exit(path: Path, as_json: bool = False, skip: frozenset[str] = frozenset()) -> Plan:
    from pdlaunch.plan.build import build_plan

    topo, _ = load_valid(path, as_json, skip)
    return build_plan(topo)


def plan_on_hosts(
    path: Path,
    connect: ConnectOptions,
    as_json: bool = False,
    skip: frozenset[str] = frozenset(),
    pool: HostPool | None = None,
) -> Plan:
    """:func:`plan_or_exit` for commands that reach the hosts (`up` over SSH, `check`): a host
    whose CPU engines the topology binds without `hosts.<host>.cpus` gets the core count its
    own affinity mask allows (read on the host), so no engine is bound to a core the host
    lacks; the rules judge the topology again with it. Says which counts were measured.
    ``pool``: connect through it and leave it open (the command goes on with those hosts)."""
    from pdlaunch.check.host_cpus import measure_cpus
    from pdlaunch.hosts import HostPool
    from pdlaunch.plan.build import build_plan
    from pdlaunch.plan.cpu import hosts_without_cpus, with_host_cpus

    topo, source = load_or_exit(path, as_json)
    findings = judged(path, topo, source, as_json, skip)
    need = hosts_without_cpus(topo)
    if not need:
        return build_plan(topo)
    own = pool is None
    hosts = HostPool(connect) if pool is None else pool
    try:
        measured = measure_cpus(build_plan(topo), need, hosts)
    finally:
        if own:
            hosts.close()
    if not measured:
        return build_plan(topo)
    if not as_json:
        for host, cpus in measured.items():
            err.print(
                f"[dim]{escape(host)}: {cpus} core(s), read from the host's affinity mask "
                f"(`hosts.{escape(host)}.cpus` not set); CPU engines are bound within them[/]"
            )
    topo = with_host_cpus(topo, measured)
    judged(path, topo, source, as_json, skip, shown=findings)  # as the rules see it now
    return build_plan(topo)
