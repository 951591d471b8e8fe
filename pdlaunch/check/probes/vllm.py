"""Probe `vllm.argv`: each planned `vllm serve` argv, parsed by the node's own vLLM.

On the node, the interpreter that runs `vllm` (the runner's `_python`) builds the parser
exactly as `vllm` does (vllm/entrypoints/cli/main.py:91-111: FlexibleArgumentParser + the
serve subparser) and parses every argv of that host without starting an engine or loading a
model. Each process's argv was planned for the release its instance declares (vllm_version,
else model.vllm_version): a node whose vLLM is another release (or, for a declared source
build `0.10.2rc2.dev1+gf21f5ea`, another commit), or that rejects a flag, FAILs before `up`.
"""

from __future__ import annotations

import json
import re
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
        u=json.loads(md.distribution("vllm").read_text("direct_url.json") or "{}")
        out["commit"]=(u.get("vcs_info") or {}).get("commit_id")
    except Exception:
        pass
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:
            from vllm.utils import FlexibleArgumentParser
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


_RELEASE = re.compile(r"\d+\.\d+(?:\.\d+)?(?:(?:rc|\.post|\.dev)\d+)*")
_COMMIT = re.compile(r"(?:\+|\.)g([0-9a-f]{7,40})\b")


def _series(version: str) -> str:
    return ".".join(version.split(".")[:2])


def mismatch(declared: str, installed: str, commit: str | None = None) -> str | None:
    """Why a node's vLLM `installed` (its distribution version; `commit`: a VCS install's
    direct_url.json commit) is not the `declared` release, or None.

    "0.32" accepts any 0.32.x; "0.10.2" that release (rc/dev builds of it included);
    "0.10.2rc2.dev1+gf21f5ea" also needs the commit (from the version's +g<hash> or
    direct_url.json)."""
    rel = _RELEASE.match(declared.strip())
    have = _RELEASE.match(installed)
    if rel is None or have is None:
        return None if declared == installed else "releases differ"
    if _series(rel.group(0)) != _series(have.group(0)):
        return f"series {_series(have.group(0))}, not {_series(rel.group(0))}"
    want = _COMMIT.search(declared)
    # A source build's dev number counts commits: with a commit declared, X.Y.Z and the
    # commit decide; without, the declared release is a prefix of the installed one.
    release = re.match(r"\d+\.\d+\.\d+", rel.group(0)) if want else rel
    full = release and release.group(0).count(".") >= 2
    if full and not have.group(0).startswith(release.group(0)):
        return f"release {have.group(0)}, not {release.group(0)}"
    if want:
        got = _COMMIT.search(installed)
        found = commit or (got.group(1) if got else None)
        if found is None:
            return f"no commit recorded (not a source build of {want.group(1)})"
        n = min(len(found), len(want.group(1)))
        if found[:n] != want.group(1)[:n]:
            return f"commit {found[:12]}, not {want.group(1)}"
    return None


def _declared(params: Mapping[str, Any], names: list[str]) -> dict[str, list[str]]:
    """declared release -> processes; params ``series``: one string, or {process: release}."""
    series = params.get("series", "")
    out: dict[str, list[str]] = {}
    for name in names:
        out.setdefault(series if isinstance(series, str) else series.get(name, ""), []).append(name)
    return out


def evaluate(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``series``: the vLLM release each process was planned for ({process: "0.32"};
    one string for all)."""
    data = _parse(out.stdout)
    if data is None:
        return [unparsed(ctx, "vLLM argv dry-parse", out)]
    version = data.get("vllm")

    def line(status: Status, message: str, fix: str = "", **extra: Any) -> CheckResult:
        return row(ctx, status, message, fix, vllm=version, **extra)

    if not version:
        return [line(Status.FAIL, "vLLM is not installed for the interpreter that runs it",
                     "install vLLM on this host (or set vllm_bin)")]  # fmt: skip
    rows: list[CheckResult] = []
    names = sorted(ctx.params.get("argvs", {}))
    for declared, procs in sorted(_declared(ctx.params, names).items()):
        why = mismatch(declared, version, data.get("commit"))
        if why:
            rows.append(
                line(
                    Status.FAIL,
                    f"vLLM {version} here, but the topology targets vLLM {declared} for "
                    f"{', '.join(procs)} ({why}): its argv, env and ports were planned for "
                    "that release",
                    f"install vLLM {declared} on this host, or declare what it runs "
                    "(the instance's vllm_version)",
                    declared=declared,
                    commit=data.get("commit"),
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
    series = {x.name: x.vllm_version or facts.vllm_version for x in facts.engines}
    return [Call({"python": facts.python, "argvs": argvs, "series": series})]


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
    inside=True,
)

PROBES = (ARGV,)
