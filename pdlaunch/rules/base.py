"""The rule machinery: `Finding`, the registry, and `validate()`, which runs every rule and
attaches the topology line of each finding.

Rules are pure functions `Topology -> findings`, each with an id, a fix and the source of the
constraint (a seed guide or a vLLM 0.32 file:line); they live in the modules beside this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Literal

from pdlaunch.spec.load import FieldPath, Source, dotted, where
from pdlaunch.spec.topology import Topology

Severity = Literal["error", "warning"]
NIXL = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py"
KV_UTILS = "vllm/distributed/kv_transfer/kv_connector/utils.py"
SEED_HETERO = "seeds/hetero-pd-cuda-gaudi-nixl-rev2.md"
SEED_ASCEND = "seeds/ascend-mooncake-pd-openfuyao.md"
SEED_GB200 = "seeds/vllm-gb200-pd-router-guide.md"
SEED_PR = "seeds/vllm-pr30448-prefill-kv-postprocess.md"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    field: FieldPath
    message: str
    fix: str
    source: str
    file: str = ""
    line: int | None = None

    @property
    def where(self) -> str:
        return where(self.file, self.line, dotted(self.field))


@dataclass(frozen=True)
class Rule:
    id: str
    summary: str
    source: str
    check: Callable[[Topology], Iterator[Finding]]


RULES: list[Rule] = []


def rule(rule_id: str, summary: str, source: str):
    def register(fn: Callable[[Topology], Iterator[Finding]]):
        RULES.append(Rule(rule_id, summary, source, fn))
        return fn

    return register


def error(rule_id: str, field: FieldPath, message: str, fix: str, source: str) -> Finding:
    return Finding(rule_id, "error", field, message, fix, source)


def warning(rule_id: str, field: FieldPath, message: str, fix: str, source: str) -> Finding:
    return Finding(rule_id, "warning", field, message, fix, source)


# Rules about addresses the SSH backend writes into scripts; Slurm (PDLAUNCH_NODE_ADDR) and
# Kubernetes (status.podIP) put each node's own address there at run time instead.
RUNTIME_ADDRESSED = frozenset({"side-channel-host"})
# What Slurm skips: those, and the warning that a `slurm:` block is not read (rules/backend.py).
SLURM_SKIP = RUNTIME_ADDRESSED | {"unused-backend-block"}


def check(topo: Topology, skip: frozenset[str] = frozenset()) -> list[Finding]:
    findings: list[Finding] = []
    for r in RULES:
        if r.id not in skip:
            findings.extend(r.check(topo))
    return findings


def validate(topo: Topology, source: Source, skip: frozenset[str] = frozenset()) -> list[Finding]:
    """All findings, each with the file and line of its field, errors first (`skip`: rule ids
    a backend makes moot, e.g. RUNTIME_ADDRESSED)."""
    out = [replace(f, file=source.file, line=source.line(f.field)) for f in check(topo, skip)]
    return sorted(out, key=lambda f: (f.severity != "error", f.line or 0))


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
