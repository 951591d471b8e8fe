"""The fixed-list proxies (router.kind toy-proxy) as data: which script a router argv runs,
what its argument parser takes (facts/proxies.json, recorded from each script's argparse with
file:line), and an argv read and rewritten the way that parser reads it.

Pure; imports nothing of the proxies (they are not installed on the control host).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from functools import cache
from pathlib import PurePosixPath
from typing import Any

from pdlaunch.spec.facts import HERE as FACTS_DIR

_TYPES = {"int": int, "str": str, "float": float}


@dataclass(frozen=True)
class ProxyFacts:
    script: str  # the file name, the key in facts/proxies.json
    plugin: str  # the plugin whose checkout ships the script (vllm-gaudi, vllm-ascend)
    path: str  # its path in that checkout
    source: str
    options: tuple[dict[str, Any], ...]
    pairs: tuple[tuple[str, str], ...]  # (hosts dest, ports dest): lists of equal length
    health: str


@cache
def _all() -> dict[str, ProxyFacts]:
    raw = json.loads((FACTS_DIR / "proxies.json").read_text())
    return {
        name: ProxyFacts(
            script=name,
            plugin=f["plugin"],
            path=f["path"],
            source=f"{f['read_at']}: {f['source']}",
            options=tuple(f["options"]),
            pairs=tuple((a, b) for a, b in f["pairs"]),
            health=f["health"],
        )
        for name, f in raw.items()
        if not name.startswith("_")
    }


def known() -> list[str]:
    return sorted(_all())


def split_launcher(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the launcher: `python SCRIPT` or the script itself, the script's arguments): the plan
    writes the launcher first and every argument after it is an option (plan._router_argv)."""
    first = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    return argv[:first], argv[first:]


def facts_for(argv: list[str]) -> ProxyFacts | None:
    """The facts of the proxy script ``argv`` runs (by its file name), None if pdlaunch has
    none."""
    launcher, _ = split_launcher(argv)
    if not launcher:
        return None
    return _all().get(PurePosixPath(launcher[-1]).name)


class ProxyArgError(ValueError):
    """The argv is one the proxy's parser (or its own checks after parsing) would refuse."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # type: ignore[override]
        # argparse would print usage and exit; the caller reports one line instead.
        raise ProxyArgError(message)


def parser(proxy: ProxyFacts) -> argparse.ArgumentParser:
    """A parser with the script's options (spellings, types, nargs) and no defaults: a
    namespace holds only what the argv gives."""
    p = _Parser(prog=proxy.script, add_help=False, argument_default=argparse.SUPPRESS)
    for opt in proxy.options:
        kwargs: dict[str, Any] = {"type": _TYPES[opt["type"]]}
        if "nargs" in opt:
            kwargs["nargs"] = opt["nargs"]
        p.add_argument(*opt["flags"], **kwargs)
    return p


def parse(proxy: ProxyFacts, args: list[str]) -> dict[str, Any]:
    """The options ``args`` sets, by dest, as the script reads them; ProxyArgError where its
    parser, or its host/port pairing, refuses them."""
    values = vars(parser(proxy).parse_args(args))
    for hosts, ports in proxy.pairs:
        if len(values.get(hosts, ())) != len(values.get(ports, ())):
            raise ProxyArgError(f"{proxy.script} needs as many {hosts} as {ports}")
    return values


def unparse(proxy: ProxyFacts, values: dict[str, Any]) -> list[Any]:
    """``values`` (dest → value; a value may be any token the caller renders later) as
    arguments, in the order the script declares its options, each by its first spelling."""
    out: list[Any] = []
    for opt in proxy.options:
        dest = opt["flags"][0].lstrip("-").replace("-", "_")
        if dest in values:
            value = values[dest]
            out += [opt["flags"][0], *(value if isinstance(value, list) else [value])]
    # argparse gave ints and floats; an argv holds strings.
    return [str(v) if isinstance(v, int | float) else v for v in out]
