"""Probe `vllm.argv`: each planned `vllm serve` argv, parsed by the node's own vLLM.

On the node, the interpreter that runs `vllm` (the runner's `_python`) builds the parser
exactly as `vllm` does (vllm/entrypoints/cli/main.py:91-111: FlexibleArgumentParser + the
serve subparser) and parses every argv of that host without starting an engine or loading a
model. A node whose vLLM differs from the topology's series, or rejects a flag, FAILs before
`up`, naming the flag.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Probe,
    ProbeContext,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status

#: prints one JSON line: {"pdlaunch_probe": 1, "vllm": version|None, "results": {name: error}}
SNIPPET = """import contextlib,io,json,sys
from importlib import metadata as md
out={"pdlaunch_probe":1}
try:
    out["vllm"]=md.version("vllm")
except md.PackageNotFoundError:
    out["vllm"]=None
if out["vllm"]:
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception as exc:
        out["import_error"]=repr(exc)[:300]
    else:
        res={}
        for name,argv in json.loads(sys.argv[1]).items():
            top=FlexibleArgumentParser()
            ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))
            err=io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    top.parse_args(argv)
                res[name]=""
            except SystemExit:
                lines=err.getvalue().strip().splitlines()
                res[name]=lines[-1] if lines else "exit"
        out["results"]=res
print(json.dumps(out,sort_keys=True))"""


def command(params: Mapping[str, Any]) -> str:
    """params: ``python`` (interpreter that runs vllm), ``argvs`` ({process: argv[1:]})."""
    py = shlex.quote(params.get("python", "python3"))
    argvs = shlex.quote(json.dumps(params["argvs"], sort_keys=True))
    return f"command -v {py} >/dev/null 2>&1 || exit 127; {py} -c {shlex.quote(SNIPPET)} {argvs}"


def _parse(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{") and '"pdlaunch_probe"' in line:
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def evaluate(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``series`` (the topology's vLLM series, e.g. "0.32")."""
    data = _parse(out.stdout)
    if data is None:
        return [unparsed(ctx, "vLLM argv dry-parse", out)]
    series = ctx.params.get("series", "")
    version = data.get("vllm")

    def line(status: Status, message: str, fix: str = "", **extra: Any) -> CheckResult:
        return row(ctx, status, message, fix, vllm=version, **extra)

    if not version:
        return [line(Status.FAIL, "vLLM is not installed for the interpreter that runs it",
                     "install vLLM on this host (or set vllm_bin)")]  # fmt: skip
    rows: list[CheckResult] = []
    if not (version == series or version.startswith(f"{series}.")):
        rows.append(
            line(
                Status.FAIL,
                f"vLLM {version} here, but the topology targets vLLM {series}: flags and "
                "defaults differ between releases",
                f"install vLLM {series}.x on this host (or set model.vllm_version)",
            )
        )
    if "import_error" in data:
        rows.append(line(Status.WARN, f"vLLM's CLI parser did not import: {data['import_error']}",
                         "check the vLLM install on this host"))  # fmt: skip
        return rows
    for name, error in sorted(data.get("results", {}).items()):
        if error:
            rows.append(
                line(
                    Status.FAIL,
                    f"{name}: this host's vLLM {version} refuses the planned command: {error}",
                    "install the topology's vLLM version here, or drop the flag it names",
                    process=name,
                    error=error,
                )
            )
        else:
            rows.append(line(Status.OK, f"{name}: vLLM {version} accepts the planned command",
                             process=name))  # fmt: skip
    return rows


def _calls(facts: HostFacts) -> list[Call]:
    if not facts.engines:
        return []  # a router-only host runs no vLLM
    argvs = {x.name: x.argv[1:] for x in facts.engines}
    return [Call({"python": facts.python, "argvs": argvs, "series": facts.vllm_version})]


ARGV = Probe(
    "vllm.argv",
    "planned argv parses with the node's vLLM",
    command,
    evaluate,
    "vLLM argv dry-parse",
    tool="python",
    install="create the venv vllm_bin points at",
    timeout_s=180.0,
    fast=False,
    calls=_calls,
)

PROBES = (ARGV,)
