"""Read a topology file into a `Topology`, keeping the line of every field.

Every failure becomes a `LoadError` holding `Problem`s that say file, line and
field: a user mistake never surfaces as a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError

from pdlaunch.fsutil import ReadRefused, read_bounded
from pdlaunch.spec.addresses import canonical_host
from pdlaunch.spec.backend_settings import BackendConfig
from pdlaunch.spec.topology import Topology

FieldPath = tuple[str | int, ...]
MAX_BYTES = 4 * 1024 * 1024


def where(file: str, line: int | None, field: str) -> str:
    """`file:line field`: how load problems and rule findings point at their place."""
    loc = f"{file}:{line}" if line else file
    return f"{loc} {field}".strip()


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str
    message: str

    def where(self) -> str:
        return where(self.file, self.line, self.field)


class LoadError(Exception):
    def __init__(self, problems: list[Problem]):
        super().__init__("; ".join(f"{p.where()}: {p.message}" for p in problems))
        self.problems = problems


@dataclass
class Source:
    """Where each field came from, so rules can point at a line."""

    file: str
    lines: dict[FieldPath, int] = field(default_factory=dict)

    def line(self, path: FieldPath) -> int | None:
        # Fall back to the nearest enclosing key: a defaulted field has no line of its own.
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())


def dotted(path: FieldPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _BadKey(Exception):
    def __init__(self, line: int, message: str = "a key must be a plain value"):
        self.line, self.message = line, message


class _Duplicate(Exception):
    def __init__(self, key: str, line: int):
        self.key, self.line = key, line


MAX_EXPANDED_NODES = 200_000
# libyaml when present (10x faster on large topologies); same safe constructors either way.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _expanded_size(node: yaml.Node, sizes: dict[int, int], stack: set[int]) -> int:
    """Nodes after alias expansion: refuses alias cycles and 'billion laughs' blow-ups."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in stack:
        raise _BadKey(node.start_mark.line + 1, "an alias refers to itself")
    stack.add(key)
    children: list[yaml.Node] = []
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    total = 1 + sum(_expanded_size(c, sizes, stack) for c in children)
    stack.discard(key)
    if total > MAX_EXPANDED_NODES:
        raise _BadKey(node.start_mark.line + 1, "too large once aliases are expanded")
    sizes[key] = total
    return total


def _walk(node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int]) -> None:
    """Record the line of every key and item; refuse duplicate and non-scalar keys."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise _BadKey(key_node.start_mark.line + 1)
            key = key_node.value
            if key in seen:
                raise _Duplicate(dotted((*path, key)), key_node.start_mark.line + 1)
            seen.add(key)
            lines[(*path, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*path, key), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines)


MAX_DEPTH = 64


def _check_depth(text: str, file: str) -> None:
    """Refuse absurd nesting before composing: libyaml's composer recurses and can crash the
    process on tens of thousands of levels; the event stream is flat."""
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else None
                raise LoadError([Problem(file, line, "", "nested too deeply to be a topology")])
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _alias_host_keys(lines: dict[FieldPath, int]) -> None:
    """`hosts:` keys are canonicalised by the schema (Node1.Example.COM. -> node1.example.com);
    findings name the canonical key, so give it the line of the key as written."""
    for path, line in list(lines.items()):
        if len(path) >= 2 and path[0] == "hosts" and isinstance(path[1], str):
            lines.setdefault(("hosts", canonical_host(path[1]), *path[2:]), line)


def parse_text(text: str, file: str) -> tuple[Any, Source]:
    source = Source(file)
    try:
        _check_depth(text, file)
        # One document only; aliases/anchors are fine, custom tags are not (SafeLoader).
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise LoadError([Problem(file, line, "", f"invalid YAML: {exc.problem or exc}")]) from None
    except yaml.YAMLError as exc:
        raise LoadError([Problem(file, None, "", f"invalid YAML: {exc}")]) from None
    if node is None:
        raise LoadError([Problem(file, None, "", "the file is empty: a topology is a mapping")])
    try:
        _expanded_size(node, {}, set())
        _walk(node, (), source.lines)
        _alias_host_keys(source.lines)
        data = _LOADER("").construct_document(node)
    except _BadKey as bad:
        raise LoadError([Problem(file, bad.line, "", bad.message)]) from None
    except _Duplicate as dup:
        raise LoadError([Problem(file, dup.line, dup.key, "key given twice")]) from None
    except (yaml.YAMLError, ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LoadError([Problem(file, None, "", f"invalid YAML value: {first}")]) from None
    if not isinstance(data, dict):
        raise LoadError(
            [Problem(file, source.line(()), "", "the top level must be a mapping of keys")]
        )
    return data, source


def _message(err: dict[str, Any]) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key (check its spelling; `pdlaunch schema` lists the keys)"
    if kind == "missing":
        return "required key is missing"
    if kind.startswith("literal_error"):
        return msg.replace("Input should be", "must be")
    return msg.removeprefix("Value error, ")


def _field_path(loc: tuple[Any, ...]) -> FieldPath:
    # pydantic puts union member names ('int', "literal['auto']") and validator tags in loc.
    return tuple(p for p in loc if isinstance(p, int) or ("[" not in p and p not in _UNION_TAGS))


_UNION_TAGS = {"int", "str", "float", "bool", "constrained-int", "constrained-float"}


def validate_data(data: dict[str, Any], source: Source) -> Topology:
    try:
        return Topology.model_validate(data)
    except ValidationError as exc:
        raise LoadError(_problems(exc, source)) from None


def _problems(exc: ValidationError, source: Source) -> list[Problem]:
    """pydantic's errors, one per field (file, line, dotted key)."""
    # A union (e.g. `auto | N`) reports one error per member: merge them per field.
    by_path: dict[FieldPath, list[str]] = {}
    for err in exc.errors():
        msgs = by_path.setdefault(_field_path(err["loc"]), [])
        if (msg := _message(err)) not in msgs:
            msgs.append(msg)
    return [
        Problem(source.file, source.line(path), dotted(path), "; or ".join(msgs))
        for path, msgs in by_path.items()
    ]


def load_backend_config(path: str | Path) -> BackendConfig:
    """A `--backend-config` file (``slurm:`` as in a topology), read as a topology is: one
    YAML document, every error named with its line (LoadError)."""
    name = str(path)
    try:
        data, source = parse_text(read_text(Path(path), "backend config"), name)
        return BackendConfig.model_validate(data)
    except ValidationError as exc:
        raise LoadError(_problems(exc, source)) from None
    except RecursionError:
        raise LoadError(
            [Problem(name, None, "", "nested too deeply to be a backend config")]
        ) from None


def read_text(path: Path, what: str = "topology file") -> str:
    """The UTF-8 text of the file a user named, read bounded (fsutil.read_bounded: a FIFO, a
    device or a file over MAX_BYTES is refused before it can hang pdlaunch or take its
    memory); ``what`` names the kind of file in the message."""
    name = str(path)

    def refuse(message: str) -> NoReturn:
        raise LoadError([Problem(name, None, "", message)])

    if not path.exists() and not path.is_symlink():
        refuse("no such file")
    if path.is_dir():
        refuse(f"is a directory, not a {what}")
    try:
        raw = read_bounded(path, MAX_BYTES, what=what)
    except ReadRefused as exc:
        # The problem is shown after the file's name: say the rest once.
        message = str(exc).removeprefix(f"{what} {name!r} ")
        if "Permission denied" in message:
            refuse("permission denied")
        if message.startswith("cannot be read"):
            refuse(message)
        refuse(f"{message} (a {what} is YAML text of at most {MAX_BYTES:,} bytes)")
    if b"\0" in raw:
        refuse(f"binary file: a {what} is YAML text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        refuse(f"not UTF-8 text ({exc.reason})")


def load_text(text: str, file: str = "<text>") -> tuple[Topology, Source]:
    try:
        data, source = parse_text(text, file)
        return validate_data(data, source), source
    except RecursionError:
        # A topology is a few levels deep; thousands of nested brackets are not one.
        raise LoadError([Problem(file, None, "", "nested too deeply to be a topology")]) from None


def load(path: str | Path) -> tuple[Topology, Source]:
    p = Path(path)
    return load_text(read_text(p), str(path))
