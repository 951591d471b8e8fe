"""Generate the vLLM / vllm-router facts pdlaunch validates against, from the installed packages.

The control host never imports vLLM, so what `validate` must know about the CLI it renders for
(every `vllm serve` flag with its value kind and choices, every environment variable vLLM
reads, the router's flags) ships as data in `pdlaunch/facts/`. This script writes that data
from the parsers themselves:

* `vllm serve`: the parser `vllm` builds (vllm/entrypoints/cli/main.py:91-111,
  serve.py:161-174: FlexibleArgumentParser + make_arg_parser);
* environment: `vllm.envs.environment_variables` plus every `VLLM_*` name read directly with
  os.environ/os.getenv anywhere in the vllm package;
* vllm-router: `RouterArgs.add_cli_args` on a plain argparse parser, exactly as
  vllm_router/launch_router.py:parse_router_args builds it.

Facts no parser can tell (flags and variables that older vLLM read and 0.32 no longer does,
with their replacement) are recorded below with their source and merged in.

    python scripts/gen_vllm_facts.py            # rewrite pdlaunch/facts/*.json
    python scripts/gen_vllm_facts.py --check    # exit 1 if the shipped files are stale
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "pdlaunch" / "facts"

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
    from vllm.utils.argparse_utils import FlexibleArgumentParser

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


def vllm_facts() -> dict[str, Any]:
    version = importlib.metadata.version("vllm").split("+")[0]
    _, parser = vllm_parsers()
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
        "flags": parser_facts(parser),
        "env": vllm_env_names(),
        "removed_flags": REMOVED_FLAGS,
        "removed_env": REMOVED_ENV,
    }


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


def outputs() -> dict[Path, str]:
    out = {}
    for facts in (vllm_facts(), router_facts()):
        path = OUT / f"{facts['tool']}-{facts['series']}.json"
        out[path] = json.dumps(facts, indent=1, sort_keys=True) + "\n"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare with the shipped files")
    args = ap.parse_args()
    stale = []
    for path, text in outputs().items():
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
