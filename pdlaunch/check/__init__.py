"""`pdlaunch check`: preflight of hardware, fabric, ports and versions.

The pure core is :mod:`.probes` (one module per tool family: command, parsers, evaluator
and parameters side by side) and the result record (:mod:`.results`); it imports nothing
beyond the standard library and the device table. Running probes on hosts is
:mod:`.runner`'s job.
"""

from pdlaunch.check.probes import (
    PROBES,
    Call,
    CommandOutput,
    HostFacts,
    Needs,
    Probe,
    ProbeContext,
    families_of,
    select_probes,
)
from pdlaunch.check.results import CheckResult, Status, has_failure, worst

__all__ = [
    "PROBES",
    "Call",
    "CheckResult",
    "CommandOutput",
    "HostFacts",
    "Needs",
    "Probe",
    "ProbeContext",
    "Status",
    "families_of",
    "has_failure",
    "select_probes",
    "worst",
]
