"""Let each vLLM release judge what pdlaunch plans for it: the shipped example topologies
(topologies/*.yaml), declared for the release of this interpreter's vLLM, are validated and
planned, and every planned `vllm serve` argv is parsed by this vLLM's own parser (as `vllm`
builds it) and every VLLM_* variable exported is looked up among the names this vLLM reads.

Run with the interpreter of the release to judge (scripts/gen_all_vllm_facts.sh does, for each
throwaway venv); pdlaunch itself is imported from this checkout:

    /tmp/vv-0.23.0/bin/python scripts/check_vllm_matrix.py [--json]

Prints one line per process and a summary row for docs/vllm-versions.md:
`| 0.23.0 | planned as written | planned, derived only | argv accepted | VLLM_* accepted |`.
A topology the rules refuse for this release is listed with the rules' reasons (pdlaunch
refusing what the release cannot run, not a parser failure) and judged again without what its
author wrote for one release (extra_args, VLLM_* env, kv_connector.load_failure_policy), so
the parser still judges everything pdlaunch derives. The argv/env columns count the processes
of every plan made (as written, else derived only). Exit 1 if the parser refuses an argv
pdlaunch planned, or a planned variable is unknown.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]


def _parse(argv: list[str]) -> str:
    """'' when this vLLM's parser accepts `vllm <argv>`, else its last error line."""
    from gen_vllm_facts import vllm_parsers

    top, _ = vllm_parsers()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            top.parse_args(argv)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return lines[-1] if lines else "exit"
    return ""


def _judge(data: dict, source, env_known: set[str]) -> dict:
    """Validate and plan `data`; parse each planned engine argv with this vLLM."""
    from pdlaunch.plan.build import build_plan
    from pdlaunch.rules import has_errors, validate
    from pdlaunch.spec import devices
    from pdlaunch.spec.load import validate_data

    topo = validate_data(data, source)
    found = validate(topo, source)
    if has_errors(found):
        return {
            "refused": sorted({f"{f.rule}: {f.message}" for f in found if f.severity == "error"})
        }
    procs = {}
    for p in build_plan(topo).processes:
        if p.role == "router":
            continue
        plugin = devices.profile(p.device).plugin_env if p.device else set()
        unknown = sorted(
            v for v in p.env if v.startswith("VLLM_") and v not in env_known and v not in plugin
        )
        procs[p.name] = {
            "error": _parse(p.argv[1:]),
            "env_total": sum(v.startswith("VLLM_") for v in p.env),
            "env_unknown": unknown,
        }
    return {"processes": procs}


def _without_user_extras(data: dict) -> dict:
    """The topology without what its author wrote for one release: extra_args, VLLM_* env
    entries and the load-failure policy (what remains is what pdlaunch derives)."""
    out = copy.deepcopy(data)
    out.get("kv_connector", {}).pop("load_failure_policy", None)
    scopes = [out.get("defaults", {}), *out.get("hosts", {}).values()]
    scopes += [i for role in ("prefill", "decode") for i in out.get(role, [])]
    for scope in scopes:
        if not isinstance(scope, dict):
            continue
        scope.pop("extra_args", None)
        env = scope.get("env") or {}
        scope["env"] = {k: v for k, v in env.items() if not k.startswith("VLLM_")}
    return out


def check(version: str) -> dict:
    from gen_vllm_facts import vllm_env_names

    from pdlaunch.spec import facts
    from pdlaunch.spec.load import parse_text, read_text

    env_known = set(vllm_env_names())
    out: dict = {"vllm": version, "topologies": []}
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        data, source = parse_text(read_text(path), str(path))
        data["model"]["vllm_version"] = version  # every instance runs this release
        for role in ("prefill", "decode"):
            for inst in data.get(role, []):
                inst.pop("vllm_version", None)
        row = {"topology": path.name, **_judge(data, source, env_known)}
        if "refused" in row:
            row["derived_only"] = _judge(_without_user_extras(data), source, env_known)
        out["topologies"].append(row)
    out["facts"] = facts.vllm(version).version
    return out


def summary(result: dict) -> tuple[str, bool]:
    """| release | planned as written | planned, derived only | argv ok | VLLM_* ok |"""
    tops = result["topologies"]
    judged = [t if "processes" in t else t.get("derived_only", {}) for t in tops]
    planned = [j for j in judged if "processes" in j]
    procs = [p for j in planned for p in j["processes"].values()]
    ok = sum(not p["error"] for p in procs)
    env_total = sum(p["env_total"] for p in procs)
    env_bad = sum(len(p["env_unknown"]) for p in procs)
    as_written = sum("processes" in t for t in tops)
    line = (
        f"| {result['vllm']} | {as_written}/{len(tops)} | {len(planned)}/{len(tops)} | "
        f"{ok}/{len(procs)} | {env_total - env_bad}/{env_total} |"
    )
    return line, ok == len(procs) and env_bad == 0


def _report(name: str, judged: dict, version: str) -> None:
    if "refused" in judged:
        print(f"{name}: refused for vLLM {version}:")
        for reason in judged["refused"]:
            print(f"    {reason}")
        return
    for proc, p in judged["processes"].items():
        verdict = p["error"] or "accepted"
        if p["env_unknown"]:
            verdict += f"; unknown env {', '.join(p['env_unknown'])}"
        print(f"{name} {proc}: {verdict}")


def main() -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # as scripts/gen_vllm_facts.py
    from vllm_runtime_facts import torch_shims

    torch_shims()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from gen_vllm_facts import _vllm_version

    result = check(_vllm_version())
    if args.json:
        print(json.dumps(result, indent=1))
    for t in result["topologies"]:
        _report(t["topology"], t, result["vllm"])
        if "derived_only" in t:
            _report(f"{t['topology']} (derived only)", t["derived_only"],
                    result["vllm"])  # fmt: skip
    line, ok = summary(result)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
