"""Orchestration: `up`, `down`, `status`, `logs` over the hosts layer.

- :mod:`.up`: reconcile with what runs, start in order, wait, canary, roll back on failure.
- :mod:`.down`: stop and forget, only once everything is proven gone.
- :mod:`.inspect`: `status` and `logs`, read-only.
- :mod:`.records`: the survey (alive / gone / unknown) every command starts from.
- :mod:`.readiness`: the pure wait-until-ready loop.

No secret value is ever stored, logged or returned: only variable names.
"""

from pdlaunch.state import file_hashes

from .down import down
from .inspect import logs, status
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
from .records import describe_changes, missing_secrets, secrets_file, survey
from .stopping import stop_processes
from .up import up

__all__ = [
    "STOP_ORDER",
    "DownResult",
    "Failure",
    "Interrupted",
    "LaunchError",
    "Reporter",
    "UpOptions",
    "UpResult",
    "View",
    "describe_changes",
    "down",
    "file_hashes",
    "logs",
    "missing_secrets",
    "secrets_file",
    "status",
    "stop_processes",
    "survey",
    "up",
    "wait_until",
]
