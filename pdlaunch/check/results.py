"""Result records of `pdlaunch check` (pure data, stdlib only)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    """Outcome of one check. Ordered by severity: SKIP < OK < WARN < FAIL."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Status.SKIP: 0, Status.OK: 1, Status.WARN: 2, Status.FAIL: 3}


@dataclass(frozen=True)
class CheckResult:
    """One line of the check report.

    probe:   probe id, e.g. ``"rdma.sysfs"`` or ``"versions.cluster"``
    target:  a host name, or a pair written ``"src -> dst"``
    status:  OK / WARN / FAIL / SKIP
    message: what was found, one sentence
    fix:     what to do about it (empty when nothing to do)
    data:    structured facts extracted by the parser (for --json and for
             cluster-wide comparisons); keys are parser specific
    """

    probe: str
    target: str
    status: Status
    message: str
    fix: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "target": self.target,
            "status": self.status.value,
            "message": self.message,
            "fix": self.fix,
            "data": dict(self.data),
        }


def worst(results: Iterable[CheckResult]) -> Status:
    """Most severe status among ``results`` (SKIP when empty)."""
    out = Status.SKIP
    for r in results:
        if r.status.severity > out.severity:
            out = r.status
    return out


def has_failure(results: Iterable[CheckResult]) -> bool:
    return any(r.status is Status.FAIL for r in results)
