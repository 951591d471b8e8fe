"""What the targeted vLLM and vllm-router accept, as data: flags, value kinds, env variables.

The JSON files beside this module are generated from the installed parsers by
`scripts/gen_vllm_facts.py` (a test keeps them current), so the control host judges argv
without importing vLLM. One file per vLLM series: the base series (0.32) whole, every other
as its differences from the base (`base`, `flags_added`/`flags_removed` by dest,
`env_added`/`env_removed`) plus its own `runtime` facts (NIXL side channel, handshake,
kv_transfer_config fields, registered connectors), each with the wheel's file:line.

`scan()` reads an argv the way the real parser will: vLLM's
FlexibleArgumentParser (underscores are dashes in a flag name, `--x.key v` merges into the JSON
flag `--x`, vllm/utils/argparse_utils.py:366-462) on top of argparse (`--flag=value`, unique
prefixes of a long flag). Pure functions; no import of vLLM.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_VLLM = "0.32"
# A vLLM release as the README documents it (0.32, 0.10.2, 0.10.2rc2.dev1+gf21f5ea): the
# PEP 440 subset vLLM's own versions use (release, pre, post, dev, local), each number
# bounded, so a version is never a file name (``router-0.1.17``) nor an int() of 5,000 digits.
RELEASE = re.compile(
    r"(\d{1,4})\.(\d{1,4})(?:\.\d{1,4})?(?:(?:a|b|rc)\d{1,4})?(?:\.post\d{1,4})?"
    r"(?:\.dev\d{1,9})?(?:\+[A-Za-z0-9]{1,32}(?:\.[A-Za-z0-9]{1,32}){0,3})?"
)
RELEASE_MAX = 64
ROUTER = "vllm-router-0.1.17"


# Connectors that vLLM plugins register with vLLM's KVConnectorFactory, and module paths that
# no longer exist: recorded from the plugins' source (not installable here), with where.
PLUGIN_CONNECTORS: dict[str, dict[str, str]] = {
    "MooncakeConnectorV1": {
        "plugin": "vllm-ascend",
        "module": "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector",
        "class": "MooncakeConnector",
        "source": "vllm-ascend vllm_ascend/distributed/kv_transfer/__init__.py:29-31 "
        "(HEAD 182b75ea, 2026-08-22)",
    },
    "MooncakeLayerwiseConnector": {
        "plugin": "vllm-ascend",
        "module": "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_layerwise_connector",
        "class": "MooncakeLayerwiseConnector",
        "source": "vllm-ascend vllm_ascend/distributed/kv_transfer/__init__.py:51-55",
    },
}
REMOVED_MODULES: dict[str, str] = {
    "vllm_ascend.distributed.mooncake_connector": "moved to "
    "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector by vllm-ascend commit "
    "295018ec0f (#5719, 2026-01-15)",
}


@dataclass(frozen=True)
class Flag:
    options: tuple[str, ...]
    dest: str
    kind: str  # value | flag | bool_optional | append | count | exit | positional
    nargs: int | str | None
    json: bool
    choices: tuple[str, ...] | None
    choices_exact: bool

    @property
    def takes_value(self) -> bool:
        return self.kind in ("value", "append") and self.nargs != 0

    @property
    def repeatable(self) -> bool:
        return self.kind in ("append", "count")


@dataclass(frozen=True)
class Facts:
    tool: str
    version: str
    series: str
    flexible: bool
    allow_abbrev: bool
    flags: tuple[Flag, ...]
    env: frozenset[str]
    removed_flags: dict[str, dict[str, str]]
    removed_env: dict[str, dict[str, str]]
    # vLLM only: summary (prefix-caching / DP spellings, block-size choices) and run-time
    # facts read from the wheel's code (scripts/vllm_runtime_facts.py).
    summary: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    runtime: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    by_option: dict[str, Flag] = field(repr=False, compare=False, default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.tool} {self.version}"

    def flag(self, dest: str) -> Flag | None:
        return next((f for f in self.flags if f.dest == dest), None)

    def suggest(self, spelling: str) -> str | None:
        close = difflib.get_close_matches(spelling, list(self.by_option), n=1, cutoff=0.75)
        return close[0] if close else None

    def suggest_env(self, name: str) -> str | None:
        close = difflib.get_close_matches(name, sorted(self.env), n=1, cutoff=0.8)
        return close[0] if close else None

    @property
    def nixl(self) -> dict[str, Any]:
        return self.runtime.get("nixl", {})

    @property
    def kv_config_fields(self) -> frozenset[str]:
        return frozenset(self.runtime.get("kv_transfer_config", {}).get("fields", ()))

    @property
    def kv_config_source(self) -> str:
        return self.runtime.get("kv_transfer_config", {}).get("source", "")

    @property
    def kv_unknown_keys(self) -> str:
        """What --kv-transfer-config does with a key it lacks: refused | dropped."""
        return self.runtime.get("kv_transfer_config", {}).get("unknown_keys", "refused")

    def json_config(self, dest: str) -> dict[str, Any] | None:
        """The config class behind a config-object flag: class, fields, unknown_keys, source."""
        return self.runtime.get("json_configs", {}).get(dest)

    @property
    def connectors(self) -> dict[str, dict[str, str]]:
        return self.runtime.get("connectors", {})

    @property
    def side_channel(self) -> dict[str, Any]:
        return self.nixl.get("side_channel", {})

    def module_exists(self, module: str) -> bool:
        """Whether `module` is one of the connector modules this release registers (or a
        package/module that one of them lives in)."""
        return any(
            c["module"] == module or c["module"].startswith(module + ".")
            for c in self.connectors.values()
        )


def _apply_difference(diff: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    # Mirror of scripts/gen_vllm_facts.py:apply_difference (the generator's test checks both).
    gone = set(diff["flags_removed"])
    full = {k: v for k, v in diff.items() if k != "base" and not k.startswith(("flags_", "env_"))}
    full["flags"] = [f for f in base["flags"] if f["dest"] not in gone] + diff["flags_added"]
    full["flags"].sort(key=lambda f: (f["options"][:1], f["dest"]))
    full["env"] = sorted((set(base["env"]) - set(diff["env_removed"])) | set(diff["env_added"]))
    return full


def _raw(path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text())
    if "base" in raw:
        raw = _apply_difference(raw, _raw(HERE / f"vllm-{raw['base']}.json"))
    return raw


def _load(path: Path) -> Facts:
    raw = _raw(path)
    flags = tuple(
        Flag(
            options=tuple(f["options"]),
            dest=f["dest"],
            kind=f["kind"],
            nargs=f["nargs"],
            json=f["json"],
            choices=tuple(f["choices"]) if f["choices"] is not None else None,
            choices_exact=f["choices_exact"],
        )
        for f in raw["flags"]
    )
    facts = Facts(
        tool=raw["tool"],
        version=raw["version"],
        series=raw["series"],
        flexible=raw["flexible"],
        allow_abbrev=raw["allow_abbrev"],
        flags=flags,
        env=frozenset(raw["env"]),
        removed_flags=raw["removed_flags"],
        removed_env=raw["removed_env"],
        summary=raw.get("summary", {}),
        runtime=raw.get("runtime", {}),
    )
    facts.by_option.update({o: f for f in flags for o in f.options})
    return facts


def _series_key(series: str) -> tuple[int, ...]:
    return tuple(int(p) for p in series.split("."))


def supported_vllm() -> list[str]:
    return sorted(
        (p.stem.removeprefix("vllm-") for p in HERE.glob("vllm-[0-9]*.json")), key=_series_key
    )


def is_release(version: str) -> bool:
    """Whether ``version`` has the shape of a vLLM release (`RELEASE`, at most `RELEASE_MAX`
    characters)."""
    return len(version) <= RELEASE_MAX and RELEASE.fullmatch(version) is not None


def series_of(version: str) -> str:
    """The series ("0.10") of 0.10, 0.10.2, 0.10.2rc2 or 0.10.2rc2.dev1+gf21f5ea (source build);
    a string of another shape is returned as it is."""
    m = RELEASE.fullmatch(version.strip()) if len(version) <= RELEASE_MAX else None
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else version


@lru_cache(maxsize=32)
def vllm(version: str = DEFAULT_VLLM) -> Facts:
    """The facts of the series `version` belongs to; KeyError if pdlaunch has none (or
    ``version`` is not shaped as a release: only a series names a facts file)."""
    if not is_release(version):
        raise KeyError(version)
    path = HERE / f"vllm-{series_of(version)}.json"
    if not path.is_file():
        raise KeyError(version)
    return _load(path)


@lru_cache(maxsize=1)
def router() -> Facts:
    return _load(HERE / f"{ROUTER}.json")


@dataclass(frozen=True)
class Arg:
    """One option occurrence in an argv, as the parser will read it."""

    index: int  # position of the option token in the argv
    spelling: str  # the option as written, before '='
    flag: Flag | None  # None: unknown to the parser
    values: tuple[str, ...]
    json_keys: tuple[str, ...] = ()  # `--compilation_config.pass_config.x` -> (pass_config, x)
    ambiguous: tuple[str, ...] = ()  # prefix matching several flags
    missing_value: bool = False

    @property
    def dest(self) -> str | None:
        return self.flag.dest if self.flag else None


_FLEX_NAME = re.compile(r"(?<=--)[^.]*")


def _canonical(token: str, facts: Facts) -> tuple[str, str | None]:
    """The option name the parser looks up, and an inline '=' value."""
    name, eq, value = token.partition("=")
    if facts.flexible and name.startswith("--"):
        name = _FLEX_NAME.sub(lambda m: m.group(0).replace("_", "-"), name, count=1)
    return name, (value if eq else None)


def _lookup(name: str, facts: Facts) -> tuple[Flag | None, tuple[str, ...]]:
    if name in facts.by_option:
        return facts.by_option[name], ()
    if name.startswith("--") and facts.allow_abbrev:
        # argparse._parse_optional: a unique prefix of a long option selects it.
        hits = {o: f for o, f in facts.by_option.items() if o.startswith(name)}
        dests = {f.dest for f in hits.values()}
        if len(dests) == 1:
            return next(iter(hits.values())), ()
        if len(dests) > 1:
            return None, tuple(sorted(hits))
    elif not name.startswith("--"):
        # argparse._get_option_tuples: a single-dash name is a prefix of single-dash options
        # (-t -> -tp), or a two-character option with its value attached (-O3).
        hits = {o: f for o, f in facts.by_option.items() if o.startswith(name) and o[1] != "-"}
        if name[:2] in facts.by_option and len(name) > 2:
            hits[name[:2]] = facts.by_option[name[:2]]
        dests = {f.dest for f in hits.values()}
        if len(dests) == 1:
            return next(iter(hits.values())), ()
        if len(dests) > 1:
            return None, tuple(sorted(hits))
    return None, ()


def _is_option(token: str) -> bool:
    # argparse's own test (_negative_number_matcher): -5 and -.5 are values, -1e5 is not.
    return token.startswith("-") and token != "-" and not re.fullmatch(r"-\d+|-\d*\.\d+", token)


def scan(argv: list[str], facts: Facts, start: int = 0) -> tuple[list[Arg], list[int]]:
    """Options in `argv[start:]` (indices are into argv) and the indices of positionals."""
    out: list[Arg] = []
    positionals: list[int] = []
    i = start
    while i < len(argv):
        token = argv[i]
        if not _is_option(token):
            positionals.append(i)
            i += 1
            continue
        if facts.flexible and token.startswith("-O") and not token.startswith("--"):
            # argparse_utils.py:375-390: -O3 / -O=3 / -O 3 mean --optimization-level.
            flag = facts.by_option.get("--optimization-level")
            if token == "-O" and i + 1 < len(argv) and argv[i + 1] in {"0", "1", "2", "3"}:
                out.append(Arg(i, token, flag, (argv[i + 1],)))
                i += 2
            else:
                out.append(Arg(i, token, flag, (token[3:] if token[2:3] == "=" else token[2:],)))
                i += 1
            continue
        name, inline = _canonical(token, facts)
        spelling, at = token.partition("=")[0], i
        i += 1
        if facts.flexible and "." in name:
            # argparse_utils.py:425: any dashed name with a dot, `-cc.mode` too.
            base, *keys = name.split(".")
            flag, ambiguous = _lookup(base, facts)
            if inline is None and i < len(argv):
                inline, i = argv[i], i + 1  # the dotted form always takes the next word
            values = (inline,) if inline is not None else ()
            out.append(Arg(at, spelling, flag, values, tuple(keys), ambiguous))
            continue
        flag, ambiguous = _lookup(name, facts)
        values = [inline] if inline is not None else []
        if inline is None and (flag is None or flag.takes_value):
            # An unknown option's words are left over by argparse as well.
            while i < len(argv) and not _is_option(argv[i]):
                if flag is not None and flag.nargs in (None, "?", 1) and values:
                    break
                if flag is not None and isinstance(flag.nargs, int) and len(values) >= flag.nargs:
                    break
                values.append(argv[i])
                i += 1
        missing = bool(flag and flag.takes_value and not values and flag.nargs not in ("?", "*"))
        out.append(Arg(at, spelling, flag, tuple(values), (), ambiguous, missing))
    return out, positionals


def overrides(args: list[Arg]) -> list[tuple[Arg, Arg]]:
    """(lost, winner) pairs: a later occurrence of the same setting replaces an earlier one.

    Dotted JSON keys are merged by vLLM into one `--x '{...}'` appended after every other
    argument (argparse_utils.py:455-462), so it replaces any `--x '{...}'` given whole."""
    seen: dict[object, Arg] = {}
    pairs = []
    dotted_dests = {a.dest for a in args if a.json_keys and a.flag}
    for a in args:
        if a.flag is None or a.flag.repeatable or a.flag.kind == "exit":
            continue
        if a.json_keys:
            if a.json_keys[-1].endswith("+"):
                continue  # `--x.list+ v` appends to the list
            key: object = (a.dest, a.json_keys)
        else:
            key = a.dest
        if key in seen:
            pairs.append((seen[key], a))
        seen[key] = a
    for a in args:
        if a.flag is not None and not a.json_keys and a.dest in dotted_dests:
            winner = next(b for b in args if b.dest == a.dest and b.json_keys)
            pairs.append((a, winner))
    return pairs
