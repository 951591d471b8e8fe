"""The lifecycle, written once over :class:`pdlaunch.runtime.base.Runtime`: `up` (readiness,
canary, rollback, signals), `down`, `status`, `logs`; one Reporter, one error contract
(LaunchError; Interrupted on a signal)."""

from .down import down
from .inspect import StatusReport, logs, status
from .model import (
    STOP_ORDER,
    DownResult,
    Failure,
    Interrupted,
    LaunchError,
    Reporter,
    UpOptions,
    UpResult,
    View,
)
from .readiness import wait_until
from .up import up

__all__ = [
    "STOP_ORDER",
    "DownResult",
    "Failure",
    "Interrupted",
    "LaunchError",
    "Reporter",
    "StatusReport",
    "UpOptions",
    "UpResult",
    "View",
    "down",
    "logs",
    "status",
    "up",
    "wait_until",
]
