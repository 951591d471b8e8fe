"""Let each vLLM release judge what pdlaunch plans for it: the shipped example topologies
(topologies/*.yaml), declared for the release of this interpreter's vLLM, are validated and
planned, and every planned `vllm serve` argv is parsed by this vLLM's own parser (as `vllm`
builds it) and every VLLM_* variable exported is looked up among the names this vLLM reads.

Run with the interpreter of the release to judge (scripts/gen_all_vllm_facts.sh does, for each
throwaway venv); pdlaunch itself is imported from this checkout:

    /tmp/vv-0.23.0/bin/python scripts/check_vllm_matrix.py [--json]

Prints one line per topology and a summary row for docs/vllm-versions.md:
`| 0.23.0 | topologies planned/total | processes accepted/total | VLLM_* accepted/total |`.
A topology the rules refuse for this release is listed with the rules' reasons (that is
pdlaunch refusing what the release cannot run, not a parser failure). Exit 1 if the parser
refuses an argv pdlaunch planned, or a planned variable is unknown.
"""

from __future__ import annotations

import argparse
import contextlib
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


def check(version: str) -> dict:
    from gen_vllm_facts import vllm_env_names

    from pdlaunch import devices, facts
    from pdlaunch.load import parse_text, read_text, validate_data
    from pdlaunch.plan import build_plan
    from pdlaunch.rules import has_errors, validate

    env_known = set(vllm_env_names())
    out: dict = {"vllm": version, "topologies": []}
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        data, source = parse_text(read_text(path), str(path))
        data["model"]["vllm_version"] = version  # every instance runs this release
        for role in ("prefill", "decode"):
            for inst in data.get(role, []):
                inst.pop("vllm_version", None)
        topo = validate_data(data, source)
        row: dict = {"topology": path.name}
        found = validate(topo, source)
        if has_errors(found):
            errors = {f"{f.rule}: {f.message}" for f in found if f.severity == "error"}
            row["refused"] = sorted(errors)
            out["topologies"].append(row)
            continue
        plan = build_plan(topo)
        procs = {}
        for p in plan.processes:
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
        row["processes"] = procs
        out["topologies"].append(row)
    out["facts"] = facts.vllm(version).version
    return out


def summary(result: dict) -> tuple[str, bool]:
    tops = result["topologies"]
    planned = [t for t in tops if "processes" in t]
    procs = [p for t in planned for p in t["processes"].values()]
    ok = sum(not p["error"] for p in procs)
    env_total = sum(p["env_total"] for p in procs)
    env_bad = sum(len(p["env_unknown"]) for p in procs)
    line = (
        f"| {result['vllm']} | {len(planned)}/{len(tops)} | {ok}/{len(procs)} | "
        f"{env_total - env_bad}/{env_total} |"
    )
    return line, ok == len(procs) and env_bad == 0


def main() -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # as scripts/gen_vllm_facts.py
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from gen_vllm_facts import _vllm_version

    result = check(_vllm_version())
    if args.json:
        print(json.dumps(result, indent=1))
    for t in result["topologies"]:
        if "refused" in t:
            print(f"{t['topology']}: refused for vLLM {result['vllm']}:")
            for reason in t["refused"]:
                print(f"    {reason}")
            continue
        for name, p in t["processes"].items():
            verdict = p["error"] or "accepted"
            if p["env_unknown"]:
                verdict += f"; unknown env {', '.join(p['env_unknown'])}"
            print(f"{t['topology']} {name}: {verdict}")
    line, ok = summary(result)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
