"""The sbatch options a user may not add (``sbatch_opt``, ``--sbatch-opt``, a
``--backend-config`` file): those that change how pdlaunch finds, checks and cancels its job,
or where the job's own files go, read in every spelling sbatch reads.

How pdlaunch knows its job (backends/slurm/jobs.py): the id ``sbatch --parsable`` prints;
the name ``pdlaunch-<deployment>`` of every component, which ``scancel --name`` filters on;
the user that submitted it; the first component's work dir (``--chdir``, squeue's ``%Z``),
compared before anything is cancelled; the driver's log ``<work dir>/logs/slurm-<id>.log``
(``--output``), which `up`, `logs` and `doctor` read. sbatch keeps the last of a repeated
option, and the user's options come after pdlaunch's in each component.

sbatch reads ``#SBATCH`` lines with getopt_long, as its command line: ``--job-name=x``,
``--job-name x``, ``-J x``, ``-Jx``, one-letter flags combined (``-HJx``), and any unambiguous
abbreviation of a long name (``--job=x``, ``--ch=/tmp``). The option names are sbatch's own
(man sbatch, slurm-client 22.05.8, "OPTIONS"; https://slurm.schedmd.com/sbatch.html);
tests/spec/test_sbatch_identity_options.py compares them with the installed man page.
"""

from __future__ import annotations

# Every long option of sbatch 22.05.8 (its man page), for getopt_long's abbreviations.
_MAN_OPTIONS = """
    account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment
    constraint container contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu
    cpus-per-task deadline delay-boot dependency distribution error exclude exclusive export
    export-file extra-node-info get-user-env gid gpu-bind gpu-freq gpus gpus-per-node
    gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs input job-name
    kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu
    mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks
    ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output
    overcommit oversubscribe parsable partition power prefer priority profile propagate qos
    quiet reboot requeue reservation signal sockets-per-node spread-job switches test-only
    thread-spec threads-per-core time time-min tmp uid usage use-min-nodes verbose version
    wait wait-all-nodes wckey wrap
"""
LONG: frozenset[str] = frozenset(_MAN_OPTIONS.split())
# One-letter option -> (its long name, whether it takes a value): the man page's "-X, --name".
SHORT: dict[str, tuple[str, bool]] = {
    "A": ("account", True),
    "a": ("array", True),
    "B": ("extra-node-info", True),
    "b": ("begin", True),
    "C": ("constraint", True),
    "c": ("cpus-per-task", True),
    "D": ("chdir", True),
    "d": ("dependency", True),
    "e": ("error", True),
    "F": ("nodefile", True),
    "G": ("gpus", True),
    "H": ("hold", False),
    "h": ("help", False),
    "i": ("input", True),
    "J": ("job-name", True),
    "k": ("no-kill", False),
    "L": ("licenses", True),
    "M": ("clusters", True),
    "m": ("distribution", True),
    "N": ("nodes", True),
    "n": ("ntasks", True),
    "O": ("overcommit", False),
    "o": ("output", True),
    "p": ("partition", True),
    "Q": ("quiet", False),
    "q": ("qos", True),
    "S": ("core-spec", True),
    "s": ("oversubscribe", False),
    "t": ("time", True),
    "V": ("version", False),
    "v": ("verbose", False),
    "W": ("wait", False),
    "w": ("nodelist", True),
    "x": ("exclude", True),
}
_LOG = "the driver's log is <work dir>/logs/slurm-<job id>.log, which up, logs and doctor read"
_START = "up waits for the job to start only until its --timeout, then cancels it"
# Option -> why pdlaunch cannot let the user set it. Each was tried in an #SBATCH line after
# pdlaunch's own on Slurm 22.05.8 (scripts/probe_sbatch_lines.py, its output in
# tests/fixtures/slurm/sbatch-lines-22.05.8.txt). --quiet, --help, --version and --wrap are
# not here: in an #SBATCH line sbatch ignores them (the job is submitted, its id printed).
IDENTITY: dict[str, str] = {
    "job-name": "pdlaunch names every component pdlaunch-<deployment> and finds, checks and "
    "cancels the job by that name (squeue, scancel --name)",
    "chdir": "the job runs in the router's work dir, which pdlaunch checks (squeue %Z) before "
    "it cancels the job",
    "output": _LOG,
    "error": _LOG + " (errors included)",
    "array": "an array runs the deployment several times on the same ports, as tasks pdlaunch "
    "does not record",
    "clusters": "the job would go to another cluster, where pdlaunch's squeue and scancel do "
    "not look",
    "uid": "the job would belong to another user, and pdlaunch cancels only its own jobs",
    "dependency": "the job would wait for other jobs; " + _START,
    "hold": "a held job waits to be released by hand; " + _START,
    "begin": "the job would wait for a time; " + _START,
    "wait": "sbatch would not return until the job ends, and pdlaunch learns the job id when "
    "it returns",
    "test-only": "sbatch would only estimate the start, submitting nothing",
}
_EXPORT = (
    "the driver and every step need the submitting environment (vllm on PATH, the variables "
    "pdlaunch passes); --export other than ALL[,NAME=value...] drops it"
)


def _candidates(name: str) -> list[str]:
    """The long options getopt_long may read ``--name`` as: itself, else those it
    abbreviates (several: sbatch refuses it as ambiguous)."""
    if name in LONG:
        return [name]
    return sorted(o for o in LONG if o.startswith(name)) if name else []


def _export_drops_env(value: str | None) -> bool:
    return value is None or value.split(",", 1)[0].upper() != "ALL"


def _long_refusal(word: str, following: str | None) -> str | None:
    name, eq, value = word[2:].partition("=")
    candidates = _candidates(name)
    for option in candidates:
        if option == name:
            how = ""
        elif len(candidates) == 1:
            how = f" (sbatch reads --{name} as --{option})"
        else:  # ambiguous today (sbatch refuses it), --{option} once the others are gone
            how = f" (--{name} abbreviates --{option})"
        if option in IDENTITY:
            return f"sets --{option}{how}: {IDENTITY[option]}"
        if option == "export" and _export_drops_env(value if eq else following):
            return f"sets --export{how}: {_EXPORT}"
    return None


def _short_refusal(word: str) -> str | None:
    rest = word[1:]
    while rest:
        letter, rest = rest[0], rest[1:]
        if letter not in SHORT:
            return None  # sbatch refuses an unknown letter itself
        option, takes_value = SHORT[letter]
        if option in IDENTITY:
            return f"sets --{option} (-{letter}): {IDENTITY[option]}"
        if takes_value:
            return None  # the rest of the word, or the next one, is its value
    return None


def refusal(options: tuple[str, ...] | list[str]) -> str | None:
    """Why one of ``options`` (sbatch options, one word each as the user gave them) cannot
    be given, in one line naming it; None when none changes the job's identity or files."""
    for i, word in enumerate(options):
        following = options[i + 1] if i + 1 < len(options) else None
        if word.startswith("--"):
            why = _long_refusal(word, following)
        elif word.startswith("-") and word != "-":
            why = _short_refusal(word)
        else:
            continue
        if why:
            return f"sbatch_opt {word!r} {why}; remove it (pdlaunch sets what the job needs)"
    return None
