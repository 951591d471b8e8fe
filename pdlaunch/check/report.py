"""What `pdlaunch check` hands back: every result, the hosts and pairs it was about, grouped
in report order for the CLI and as JSON for ``--json``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pdlaunch.check.results import CheckResult, Status, has_failure
from pdlaunch.check.targets import HostTarget


@dataclass
class CheckReport:
    results: list[CheckResult]
    hosts: list[HostTarget]
    pairs: list[str]
    elapsed_s: float
    fast: bool = False

    @property
    def failed(self) -> bool:
        return has_failure(self.results)

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Status}
        for r in self.results:
            out[r.status.value] += 1
        return out

    def groups(self) -> list[tuple[str, str, list[CheckResult]]]:
        """``(kind, target, results)`` in report order: hosts, pairs, cluster."""
        by_target: dict[str, list[CheckResult]] = {}
        for r in self.results:
            by_target.setdefault(r.target, []).append(r)
        out = []
        for h in self.hosts:
            if h.label in by_target:
                out.append(("host", h.label, by_target.pop(h.label)))
        for pair in self.pairs:
            if pair in by_target:
                out.append(("pair", pair, by_target.pop(pair)))
        for target, rs in by_target.items():
            out.append(("cluster" if target == "cluster" else "other", target, rs))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.failed,
            "fast": self.fast,
            "elapsed_s": round(self.elapsed_s, 3),
            "counts": self.counts(),
            "hosts": [h.to_dict() for h in self.hosts],
            "pairs": list(self.pairs),
            "results": [_jsonable(r.to_dict()) for r in self.results],
        }


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)
