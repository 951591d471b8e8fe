"""The sh the host layer sends: the scripts in ``sh/`` beside this module, and how values
reach them (quoted, as positional arguments; never formatted into a script's text).

Each ``sh/*.sh`` file is POSIX sh (targets need nothing beyond sh, coreutils and util-linux).
A file either *runs* (its first lines name its positional arguments) or is a *library* that
only defines functions another script calls. They ship in the wheel as package data and are
read with :mod:`importlib.resources`.
"""

from __future__ import annotations

import functools
import os
import shlex
from importlib import resources


def sh_quote_path(path: str) -> str:
    """Quote ``path`` for sh, expanding a leading ``~`` / ``~/`` to the target's ``$HOME``."""
    path = os.fspath(path)
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@functools.cache
def script(name: str) -> str:
    """The text of ``sh/NAME`` (read once per process)."""
    return (resources.files(__package__) / "sh" / name).read_text(encoding="utf-8")


def with_args(name: str, *words: str, libs: tuple[str, ...] = ()) -> str:
    """A command that runs ``sh/NAME`` with positional arguments ``words``, after defining
    the functions of the ``libs`` scripts. Each word must already be a quoted sh word
    (:func:`shlex.quote`, :func:`sh_quote_path`, or the digits of an int)."""
    defs = "".join(script(lib) + "\n" for lib in libs)
    return f"{defs}set -- {' '.join(words)}\n{script(name)}"


# The owned-script guard (sh/exec-owned.sh): the SSH start command and the Slurm node runner
# (pdlaunch.backends.slurm.job renders it into templates/slurm/node-runner.sh.j2) end with it.
EXEC_OWNED = script("exec-owned.sh")


def exec_owned_script(path: str) -> str:
    """Exec the script at ``path`` only if it is still ours and nobody else could have changed
    it since the upload (the work dir is checked too, but a script is what runs with our
    rights)."""
    return f"s={sh_quote_path(path)}\n{EXEC_OWNED}"
