"""What can go wrong on a host, as exceptions whose ``str()`` is the whole message a user
needs (no traceback): the CLI prints them as they are."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .transport import CommandResult


class HostError(Exception):
    """A user-facing failure on a host; ``str(err)`` is the whole message (no traceback needed).

    ``host`` is the host's name (address as written in the topology) when known.
    """

    def __init__(self, message: str, *, host: str | None = None):
        super().__init__(message)
        self.message = message
        self.host = host

    def __str__(self) -> str:
        return self.message


class HostConnectionError(HostError):
    """Could not reach or log in to the host (refused, timeout, DNS, jump host, ...)."""


class HostAuthError(HostConnectionError):
    """The server rejected every key / credential offered."""


class HostKeyError(HostConnectionError):
    """The server's host key is unknown (and not accepted) or has CHANGED."""

    def __init__(self, message: str, *, host: str | None = None, changed: bool = False):
        super().__init__(message, host=host)
        self.changed = changed


class CommandError(HostError):
    """``run(..., check=True)`` returned non-zero; ``result`` has the details."""

    def __init__(self, message: str, *, host: str | None = None, result: CommandResult):
        super().__init__(message, host=host)
        self.result = result


class CommandTimeout(HostError):
    """A command ran past its timeout (and was killed)."""


class ProcessSurvived(HostError):
    """A process group was still alive after SIGKILL and the wait that followed it (a process
    in uninterruptible sleep, or a host too loaded to finish the exit in time)."""


class UnsafePathError(HostError):
    """A directory pdlaunch would write into could be changed by someone else."""
