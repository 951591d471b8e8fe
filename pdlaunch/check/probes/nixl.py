"""Probe `nixl.progress_shim`: the NIXL progress-delay shim is what the node's Python loads.

The plan puts ``pdlaunch/kv/nixl_progress`` first on a NIXL instance's PYTHONPATH
(kv_connector.progress_delay_us, pdlaunch/plan/nixl_progress.py) at the path of the pdlaunch
that planned it, so a node needs pdlaunch installed at that same path (a shared venv, the same
image). On the node, the interpreter that runs vLLM starts with exactly that PYTHONPATH entry
and the delay variable empty (so the shim installs nothing), and says which ``sitecustomize``
it loaded and whether NIXL's compiled bindings still have the field the shim sets
(``nixlAgentConfig.pthrDelay``). FAIL: not the shim (the engine would spin a core);
WARN: the bindings lack the field (the shim would log that it changed nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Probe,
    ProbeContext,
    need,
    probe_json,
    q,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.kv import progress

#: prints one JSON line: {"pdlaunch_probe": 1, "file", "mark", "bindings", "pthr_delay"}
SNIPPET = """import importlib,importlib.util,json,sys
out={"pdlaunch_probe":1}
try:
    import sitecustomize as s
    out["file"]=getattr(s,"__file__",None);out["mark"]=getattr(s,"MARK",None)
except Exception as exc:
    out["error"]=repr(exc)[:300]
for name in ("nixl_cu12","nixl_cu13","nixl_rocm"):
    try:
        if importlib.util.find_spec(name) is None:
            continue
        b=importlib.import_module(name+"._bindings")
        out["bindings"]=name
        out["pthr_delay"]=hasattr(getattr(b,"nixlAgentConfig",None),"pthrDelay")
    except Exception as exc:
        out["bindings_error"]=repr(exc)[:300]
    break
print(json.dumps(out,sort_keys=True))"""


def _cmd(params: Mapping[str, Any]) -> str:
    py, shim = params.get("python", "python3"), params["shim"]
    return f"{need(q(py))}PYTHONPATH={q(shim)} {progress.ENV_VAR}= {q(py)} -c {q(SNIPPET)}"


def eval_shim(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``shim`` (the directory the plan puts on PYTHONPATH), ``python``."""
    shim = str(ctx.params.get("shim", "?"))
    data = probe_json(out.stdout)
    if data is None:
        return [unparsed(ctx, "NIXL progress shim probe", out)]
    loaded = str(data.get("file") or "")
    if data.get("mark") != progress.MARK or not loaded.startswith(shim.rstrip("/") + "/"):
        found = loaded or data.get("error") or "no sitecustomize"
        return [
            row(
                ctx,
                Status.FAIL,
                f"NIXL progress shim {shim} is not what {ctx.params.get('python')} loads "
                f"({found}): NIXL's progress thread would spin a core",
                "install pdlaunch on this host at the path it has where you run pdlaunch "
                "(a shared venv or the same image), or set kv_connector.progress_delay_us: 0",
            )
        ]
    if data.get("bindings") is None:
        why = data.get("bindings_error") or "no nixl_cu12/nixl_cu13/nixl_rocm"
        return [row(ctx, Status.WARN, f"shim found, NIXL bindings not: {why}",
                    "install nixl beside vLLM (docs/cpu-pd-recipe.md)")]  # fmt: skip
    if not data.get("pthr_delay"):
        return [
            row(
                ctx,
                Status.WARN,
                f"{data['bindings']}._bindings.nixlAgentConfig has no pthrDelay: the shim "
                "will change nothing and say so in the engine log",
                "use nixl 1.5.1 (pdlaunch/plan/nixl_progress.py), or progress_delay_us: 0",
            )
        ]
    return [row(ctx, Status.OK, f"shim {shim} loads; {data['bindings']} has pthrDelay")]


def _calls(facts: HostFacts) -> list[Call]:
    shims = sorted(
        {
            x.path_prepend["PYTHONPATH"][0]
            for x in facts.engines
            if x.env.get(progress.ENV_VAR) and x.path_prepend.get("PYTHONPATH")
        }
    )
    return [Call({"python": facts.python, "shim": s}) for s in shims]


PROGRESS_SHIM = Probe(
    "nixl.progress_shim",
    "NIXL progress-delay shim",
    _cmd,
    eval_shim,
    "NIXL progress shim probe",
    tool="python",
    install="create the venv the topology points at",
    timeout_s=60.0,
    calls=_calls,
    # A containerised engine's Python is the image's: the shim is mounted at the same path.
    inside=True,
)

PROBES = (PROGRESS_SHIM,)
