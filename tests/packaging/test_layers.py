"""The package's shape: imports point down the layers and never in a circle.

Layers, lowest first (docs/architecture.md): a module may import its own layer and the ones
below it, never one above. Imports inside functions count (a lazy import that climbs is still
a climb); imports under ``if TYPE_CHECKING:`` do not (they never run). Read from the source with
``ast``, so the check needs nothing installed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pdlaunch"

# Lowest first. Prefixes: a module belongs to the layer of the longest prefix it starts with.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("pdlaunch", "pdlaunch.fsutil"),  # the version and atomic file writing
    ("pdlaunch.kv",),  # the connector extension, loaded inside vLLM: imports only itself
    ("pdlaunch.spec",),  # what the user declares and what runtimes accept
    ("pdlaunch.plan",),  # topology -> processes -> scripts, pure
    ("pdlaunch.rules",),  # topology -> findings, pure (may ask the plan's derivations)
    ("pdlaunch.hosts",),  # the only code that runs commands
    ("pdlaunch.observe",),  # talking to running engines
    ("pdlaunch.runtime",),  # the interface, the lifecycle, the record
    ("pdlaunch.backends",),  # one folder per backend
    ("pdlaunch.check", "pdlaunch.doctor"),  # preflight and diagnosis, over every backend
    ("pdlaunch.testing",),  # fakes for users' tests
    ("pdlaunch.cli", "pdlaunch.__main__"),
)
BACKENDS = ("pdlaunch.backends.ssh", "pdlaunch.backends.slurm", "pdlaunch.backends.k8s")
TOP_LEVEL_MODULES_MAX = 8


def module_files() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    for sub in ast.walk(child):
                        if hasattr(sub, "lineno"):
                            lines.add(sub.lineno)
    return lines


def imports(modules: dict[str, Path]) -> Iterator[tuple[str, str, int]]:
    """(importer, imported module, line) for every pdlaunch import that runs."""

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "pdlaunch":
                        yield mod, resolve(alias.name), node.lineno
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    full = ".".join(base + ([node.module] if node.module else []))
                else:
                    full = node.module or ""
                if full.split(".")[0] != "pdlaunch":
                    continue
                for alias in node.names:
                    sub = f"{full}.{alias.name}"
                    target = sub if sub in modules else resolve(full)
                    if target != mod:
                        yield mod, target, node.lineno


def layer_of(mod: str) -> int:
    best, best_len = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best >= 0, f"{mod} is in no layer: add it to LAYERS"
    return best


def backend_of(mod: str) -> str | None:
    return next((b for b in BACKENDS if mod == b or mod.startswith(b + ".")), None)


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


MODULES = module_files()
EDGES = list(imports(MODULES))


def test_every_module_has_a_layer() -> None:
    for mod in MODULES:
        layer_of(mod)


def test_no_import_climbs_to_a_higher_layer() -> None:
    climbs = [
        f"{a} (line {line}) imports {b}: layer {LAYERS[layer_of(a)][0]} < {LAYERS[layer_of(b)][0]}"
        for a, b, line in EDGES
        if layer_of(b) > layer_of(a)
    ]
    assert not climbs, "\n".join(climbs)


def test_no_backend_imports_another_backend() -> None:
    crossings = [
        f"{a} (line {line}) imports {b}"
        for a, b, line in EDGES
        if backend_of(a) and backend_of(b) and backend_of(a) != backend_of(b)
    ]
    assert not crossings, "\n".join(crossings)


def test_no_import_circles() -> None:
    # Module-level imports only: a lazy import inside a function is how a module defers a
    # heavy dependency, and the layer test above already keeps those pointing down.
    found = cycles({(a, b) for a, b, _ in EDGES if a != b})
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_few_modules_directly_under_the_package() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES_MAX, top


def test_the_guard_sees_a_climb_and_a_circle() -> None:
    # Negative controls: the helpers find what they are for.
    assert layer_of("pdlaunch.spec.topology") < layer_of("pdlaunch.backends.slurm.job")
    assert cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    assert cycles({("a", "b"), ("b", "c")}) == []
