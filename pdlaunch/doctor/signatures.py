"""The table of known failure signatures (``signatures.yaml`` beside this module), loaded and
checked once.

The table is data so that adding a signature needs no code: an id, the roles whose logs it
applies to, a regex searched in each log line, what happened, its cause, the fix, and the
source that writes the message (vLLM 0.32 file:line, vllm-router, UCX, PyTorch, or an issue).
A malformed table raises :class:`SignatureError` naming the entry and the field, so a bad edit
fails the first test that loads it rather than a user's diagnosis.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

import yaml

Severity = Literal["error", "warning"]
ROLES = ("prefill", "decode", "router", "any")
SEVERITIES = ("error", "warning")
TABLE = "signatures.yaml"

_REQUIRED = ("id", "severity", "applies_to", "regex", "what", "cause", "fix", "source")
_OPTIONAL = ("quote", "superseded_by")
_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


class SignatureError(ValueError):
    """The signature table is malformed; the message names the entry and the field."""


@dataclass(frozen=True)
class Signature:
    id: str
    severity: Severity
    applies_to: tuple[str, ...]
    regex: re.Pattern[str]
    what: str
    cause: str
    fix: str
    source: str
    quote: str | None = None
    superseded_by: tuple[str, ...] = ()

    def applies(self, role: str) -> bool:
        return "any" in self.applies_to or role in self.applies_to

    def describe(self, groups: Mapping[str, str | None]) -> str:
        """``what`` with ``{name}`` filled from the regex's named groups (absent ones stay)."""
        values = {k: v for k, v in groups.items() if v is not None}
        return "".join(
            literal + (values.get(field, "{" + field + "}") if field is not None else "")
            for literal, field, _, _ in string.Formatter().parse(self.what)
        )


def parse_table(text: str) -> tuple[Signature, ...]:
    """Signatures from the YAML text of a table; raises SignatureError on any defect."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SignatureError(f"{TABLE} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"signatures"}:
        raise SignatureError(f"{TABLE} must hold exactly one key, `signatures`")
    entries = data["signatures"]
    if not isinstance(entries, list) or not entries:
        raise SignatureError(f"{TABLE}: `signatures` must be a non-empty list")
    out = [_signature(i, e) for i, e in enumerate(entries)]
    ids = [s.id for s in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SignatureError(f"{TABLE}: duplicate id(s) {', '.join(dup)}")
    for s in out:
        unknown = [x for x in s.superseded_by if x not in ids or x == s.id]
        if unknown:
            raise SignatureError(f"{s.id}.superseded_by: unknown or own id(s) {unknown}")
    return tuple(out)


def _signature(index: int, entry: Any) -> Signature:
    name = entry.get("id", f"#{index}") if isinstance(entry, dict) else f"#{index}"
    if not isinstance(entry, dict):
        raise SignatureError(f"signature {name}: expected a mapping")
    missing = [k for k in _REQUIRED if k not in entry]
    extra = sorted(set(entry) - set(_REQUIRED) - set(_OPTIONAL))
    if missing or extra:
        raise SignatureError(
            f"signature {name}: "
            + "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else [])
                + ([f"unknown key(s) {', '.join(extra)}"] if extra else [])
            )
        )
    for key in ("id", "severity", "regex", "what", "cause", "fix", "source", "quote"):
        if key in entry and not (isinstance(entry[key], str) and entry[key].strip()):
            raise SignatureError(f"signature {name}.{key}: expected non-empty text")
    if not _ID.fullmatch(entry["id"]):
        raise SignatureError(f"signature {name}.id: use lower-case words joined by '-'")
    if entry["severity"] not in SEVERITIES:
        raise SignatureError(f"signature {name}.severity: one of {', '.join(SEVERITIES)}")
    roles = entry["applies_to"]
    if not isinstance(roles, list) or not roles or any(r not in ROLES for r in roles):
        raise SignatureError(f"signature {name}.applies_to: a list of {', '.join(ROLES)}")
    try:
        regex = re.compile(entry["regex"])
    except re.error as exc:
        raise SignatureError(f"signature {name}.regex: {exc}") from None
    try:
        placeholders = {f for _, f, _, _ in string.Formatter().parse(entry["what"]) if f}
    except ValueError as exc:
        raise SignatureError(f"signature {name}.what: {exc}") from None
    unknown = sorted(placeholders - set(regex.groupindex))
    if unknown:
        raise SignatureError(
            f"signature {name}.what: {{{', '.join(unknown)}}} is no named group of the regex"
        )
    superseded = entry.get("superseded_by", [])
    if not isinstance(superseded, list) or not all(isinstance(x, str) for x in superseded):
        raise SignatureError(f"signature {name}.superseded_by: a list of ids")
    return Signature(
        id=entry["id"],
        severity=entry["severity"],
        applies_to=tuple(roles),
        regex=regex,
        what=" ".join(entry["what"].split()),
        cause=" ".join(entry["cause"].split()),
        fix=" ".join(entry["fix"].split()),
        source=entry["source"].strip(),
        quote=entry.get("quote"),
        superseded_by=tuple(superseded),
    )


def table_text() -> str:
    return resources.files("pdlaunch.doctor").joinpath(TABLE).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def signatures() -> tuple[Signature, ...]:
    """The shipped table (parsed once per process)."""
    return parse_table(table_text())


def by_id() -> dict[str, Signature]:
    return {s.id: s for s in signatures()}
