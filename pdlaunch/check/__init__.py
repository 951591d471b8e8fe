"""`pdlaunch check`: preflight of hardware, fabric, ports and versions.

This package holds the pure core: probe specs (:mod:`.probes`), parsers over real
command output (:mod:`.parsers`) and the result record (:mod:`.results`).  It imports
nothing beyond the standard library; running probes on hosts is the runner's job.
"""

from pdlaunch.check.parsers import (
    CommandOutput,
    ProbeContext,
    compare_ascend_tls,
    compare_versions,
)
from pdlaunch.check.probes import PROBES, PROBES_BY_ID, Needs, Probe, select_probes
from pdlaunch.check.results import CheckResult, Status, has_failure, worst

__all__ = [
    "PROBES",
    "PROBES_BY_ID",
    "CheckResult",
    "CommandOutput",
    "Needs",
    "Probe",
    "ProbeContext",
    "Status",
    "compare_ascend_tls",
    "compare_versions",
    "has_failure",
    "select_probes",
    "worst",
]
