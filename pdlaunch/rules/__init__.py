"""Validation rules: pure functions `Topology -> findings`, each with an id, a fix and the
source of the constraint. `validate()` runs them all (base.py); the rules live by subject:
kv.py (KV cache geometry and the connector), cluster.py (hosts, ports, devices, reach),
args.py (extra_args, env and secrets, judged by the targeted parsers' facts), versions.py
(what is rendered for each instance's vLLM release, and P/D release pairs).
"""

from pdlaunch.rules import args, cluster, kv, versions  # noqa: F401  (each module registers its rules)
from pdlaunch.rules.base import (
    KV_UTILS,
    NIXL,
    RULES,
    Finding,
    Rule,
    check,
    has_errors,
    validate,
)

__all__ = ["KV_UTILS", "NIXL", "RULES", "Finding", "Rule", "check", "has_errors", "validate"]
