"""`docker run` / `podman run` flags read the way the runtimes read them, so a rule sees
``-dit``, ``-p8000:8000``, ``-d=true`` and ``--publish=8000:8000`` as the flags they are.

Both CLIs parse with spf13/pflag under cobra (docker/cli, containers/podman), whose rules are:

* ``--name=value`` or ``--name value`` for a flag that takes a value; a boolean flag takes no
  next word (``--detach false``: ``false`` is not its value), only ``--detach=false``;
  no abbreviation of a long name (pflag has no prefix matching).
* ``-abc``: one-letter flags combined; a letter that takes a value takes the rest of the
  word (``-p8000:8000``, ``-v/x:/y``, after an optional ``=``) or else the next word; a
  boolean letter may end the word with ``=value`` (``-d=false``).
* ``run`` stops reading flags at the first word that is not one (SetInterspersed(false)):
  that word is the image, and every word after it the command. ``--`` ends flags too.

The tables are the two CLIs' own ``run --help`` (tests/fixtures/container/: podman 4.3.1,
docker 28.2.2; tests/spec/test_run_flags.py compares them): both have the same fifteen
one-letter flags, and no flag is boolean in one and valued in the other. A long flag neither
lists (hidden or newer, e.g. ``--net``) is taken to take a value, as most do.
"""

from __future__ import annotations

from dataclasses import dataclass

# One-letter flag -> its long name, and whether it takes a value (both CLIs, same table).
SHORT: dict[str, tuple[str, bool]] = {
    "a": ("--attach", True),
    "c": ("--cpu-shares", True),
    "d": ("--detach", False),
    "e": ("--env", True),
    "h": ("--hostname", True),
    "i": ("--interactive", False),
    "l": ("--label", True),
    "m": ("--memory", True),
    "p": ("--publish", True),
    "P": ("--publish-all", False),
    "q": ("--quiet", False),
    "t": ("--tty", False),
    "u": ("--user", True),
    "v": ("--volume", True),
    "w": ("--workdir", True),
}
# Long flags that take no value (pflag NoOptDefVal), in either CLI's `run --help`.
BOOLEAN: frozenset[str] = frozenset(
    {
        "--detach",
        "--disable-content-trust",
        "--env-host",
        "--help",
        "--http-proxy",
        "--init",
        "--interactive",
        "--no-healthcheck",
        "--no-hosts",
        "--oom-kill-disable",
        "--passwd",
        "--privileged",
        "--publish-all",
        "--quiet",
        "--read-only",
        "--read-only-tmpfs",
        "--replace",
        "--rm",
        "--rmi",
        "--rootfs",
        "--sig-proxy",
        "--tls-verify",
        "--tty",
        "--unsetenv-all",
        "--use-api-socket",
    }
)


@dataclass(frozen=True)
class RunFlag:
    """One flag as the runtime reads it: ``flag`` its long name, ``spelling`` the word (or
    the part of a combined word) that gave it, ``index`` the word's position."""

    index: int
    flag: str
    spelling: str
    value: str | None


@dataclass(frozen=True)
class Parsed:
    flags: list[RunFlag]
    # Words the runtime would not read as flags: the first is taken as the image.
    stray: list[tuple[int, str]]
    # One-letter flags neither CLI has: `run` refuses them.
    unknown: list[tuple[int, str]]


def _short(word: str, index: int, args: list[str]) -> tuple[list[RunFlag], list[str], int]:
    """The flags of one ``-xyz`` word; the letters neither CLI knows; how many words it used."""
    flags: list[RunFlag] = []
    unknown: list[str] = []
    rest = word[1:]
    while rest:
        letter, rest = rest[0], rest[1:]
        if letter not in SHORT:
            unknown.append("-" + letter)
            return flags, unknown, 1  # pflag stops the whole command at an unknown letter
        name, takes_value = SHORT[letter]
        if rest.startswith("="):
            flags.append(RunFlag(index, name, "-" + letter, rest[1:]))
            return flags, unknown, 1
        if takes_value:
            if rest:
                flags.append(RunFlag(index, name, "-" + letter, rest))
                return flags, unknown, 1
            value = args[index + 1] if index + 1 < len(args) else None
            flags.append(RunFlag(index, name, "-" + letter, value))
            return flags, unknown, 2
        flags.append(RunFlag(index, name, "-" + letter, None))
    return flags, unknown, 1


def parse(args: list[str]) -> Parsed:
    """``args`` (words placed before the image) as `docker/podman run` reads them."""
    flags: list[RunFlag] = []
    stray: list[tuple[int, str]] = []
    unknown: list[tuple[int, str]] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--" or not word.startswith("-") or word == "-":
            # Flags end here: this word (or the next, after --) is the image for the runtime.
            start = i + 1 if word == "--" else i
            stray += [(j, args[j]) for j in range(start, len(args))]
            break
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            if eq:
                flags.append(RunFlag(i, name, name, value))
                i += 1
            elif name in BOOLEAN:
                flags.append(RunFlag(i, name, name, None))
                i += 1
            else:
                flags.append(RunFlag(i, name, name, args[i + 1] if i + 1 < len(args) else None))
                i += 2
            continue
        got, bad, used = _short(word, i, args)
        flags += got
        unknown += [(i, b) for b in bad]
        i += used
    return Parsed(flags, stray, unknown)
