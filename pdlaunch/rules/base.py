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
    a backend makes moot, e.g. RUNTIME_ADDRESSED), less the warnings the topology accepts
    (:func:`judge` keeps those apart)."""
    return judge(topo, source, skip).findings


ACCEPTED = "accepted-warnings"


@dataclass(frozen=True)
class Judgement:
    """The findings a topology gets, less the warnings it accepts (`accepted_warnings:`, each
    with its reason), which are kept apart so `validate` can still name them."""

    findings: list[Finding]
    accepted: list[tuple[Finding, str]]


def judge(topo: Topology, source: Source, skip: frozenset[str] = frozenset()) -> Judgement:
    """Every rule's findings (as :func:`validate`), with the topology's accepted warnings set
    apart. An accepted id no rule has is an error (a typo would otherwise hide nothing and look
    like it hid something); one whose rule ran and gave no warning is a warning (stale). An
    error is never accepted."""
    found = _located(topo, source, skip)
    wanted = topo.accepted_warnings
    known = {r.id for r in RULES}
    extra: list[Finding] = []
    for rule_id in wanted:
        field = ("accepted_warnings", rule_id)
        if rule_id not in known:
            extra.append(error(ACCEPTED, field, f"no rule has the id {rule_id!r}",
                               "use a rule id `validate` prints in brackets, e.g. cpu-budget",
                               "pdlaunch/rules"))  # fmt: skip
        elif rule_id not in skip and not any(
            f.rule == rule_id and f.severity == "warning" for f in found
        ):
            extra.append(warning(ACCEPTED, field, f"{rule_id} is accepted but gives no warning "
                                 "on this topology", "remove it from accepted_warnings",
                                 "pdlaunch/rules"))  # fmt: skip
    kept = [f for f in found if not (f.severity == "warning" and f.rule in wanted)]
    accepted = [(f, wanted[f.rule]) for f in found if f not in kept]
    located = [replace(f, file=source.file, line=source.line(f.field)) for f in extra]
    findings = sorted(kept + located, key=lambda f: (f.severity != "error", f.line or 0))
    return Judgement(findings, accepted)


def _located(topo: Topology, source: Source, skip: frozenset[str]) -> list[Finding]:
    out = [replace(f, file=source.file, line=source.line(f.field)) for f in check(topo, skip)]
    return sorted(out, key=lambda f: (f.severity != "error", f.line or 0))


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
