"""The Slurm options a user may not add, read in every spelling Slurm reads: sbatch's in
``sbatch_opt`` (``--sbatch-opt``, a ``--backend-config`` file), srun's in a pyxis container's
``extra_args`` (they go onto each step's srun line, after pdlaunch's own).

How pdlaunch knows its job (backends/slurm/jobs.py): the id ``sbatch --parsable`` prints;
the name ``pdlaunch-<deployment>`` of every component, which ``scancel --name`` filters on;
the user that submitted it; the first component's work dir (``--chdir``, squeue's ``%Z``),
compared before anything is cancelled; the driver's log ``<work dir>/logs/slurm-<id>.log``
(``--output``), which `up`, `logs` and `doctor` read. Each step (templates/slurm/job.sh.j2)
runs on one node of its het group, one task, in its work dir (found again by it: `status`
looks for processes whose cwd is there), its output appended to its log.

sbatch reads ``#SBATCH`` lines, and srun its command line, with getopt_long: ``--name=x``,
``--name x`` (a required value takes the next word), ``-X x``, ``-Xx``, one-letter flags
combined (``-HJx``), and any unambiguous abbreviation of a long name (``--job=x``). Both stop
at the first word that is not an option: for srun that word is the command. The option names
are Slurm's man pages (slurm-client 22.05.8, "OPTIONS"; https://slurm.schedmd.com/sbatch.html,
srun.html) and pyxis's (NVIDIA/pyxis args.c, its srun options); tests/spec/
test_sbatch_identity_options.py compares the tables with the fixtures of the man pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

REQUIRED, OPTIONAL, NONE = "required", "optional", "none"


@dataclass(frozen=True)
class Table:
    """One command's options as getopt_long is given them."""

    tool: str
    long: dict[str, str]  # name -> REQUIRED | OPTIONAL | NONE (its argument)
    short: dict[str, str]  # letter -> long name
    refused: dict[str, str]  # long name -> why pdlaunch cannot let the user set it
    # Options end at the first other word (srun: it is the command; optstring "+"), or
    # getopt_long moves such words aside and reads on (sbatch's #SBATCH lines here).
    stops: bool


def _kinds(required: str, optional: str, none: str) -> dict[str, str]:
    return {
        **{n: REQUIRED for n in required.split()},
        **{n: OPTIONAL for n in optional.split()},
        **{n: NONE for n in none.split()},
    }


def _letters(pairs: str) -> dict[str, str]:
    """``"A:account a:array"`` -> {"A": "account", "a": "array"}."""
    return {k: v for k, _, v in (pair.partition(":") for pair in pairs.split())}


_SBATCH_LONG = _kinds(
    """account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment
    constraint container core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline
    delay-boot dependency distribution error exclude export export-file extra-node-info gid
    gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input
    job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu
    mem-per-gpu mincpus network nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu
    ntasks-per-node ntasks-per-socket open-mode output partition power prefer priority profile
    qos reservation signal sockets-per-node switches thread-spec threads-per-core time time-min
    tmp uid wait-all-nodes wckey wrap""",
    "exclusive get-user-env nice no-kill propagate",
    """contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot
    requeue spread-job test-only usage use-min-nodes verbose version wait""",
)
_SBATCH_SHORT = _letters(
    """
    A:account a:array b:begin D:chdir M:clusters C:constraint S:core-spec c:cpus-per-task
    d:dependency m:distribution e:error x:exclude B:extra-node-info G:gpus h:help H:hold
    i:input J:job-name L:licenses k:no-kill F:nodefile w:nodelist N:nodes n:ntasks o:output
    O:overcommit s:oversubscribe p:partition q:qos Q:quiet t:time v:verbose V:version W:wait
    """
)
_SRUN_LONG = _kinds(
    """accel-bind account acctg-freq bb bbf bcast-exclude begin chdir cluster-constraint clusters
    comment constraint container core-spec cores-per-socket cpu-bind cpu-freq cpus-per-gpu
    cpus-per-task deadline delay-boot dependency distribution epilog error exclude export
    extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres
    gres-flags het-group hint input job-name jobid licenses mail-type mail-user mcs-label mem
    mem-bind mem-per-cpu mem-per-gpu mincpus mpi msg-timeout network nodefile nodelist nodes
    ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output
    partition power prefer priority profile prolog qos relative reservation signal slurmd-debug
    sockets-per-node switches task-epilog task-prolog thread-spec threads threads-per-core time
    time-min tmp uid wait wckey"""
    # pyxis (args.c spank_opts): added to srun's own options by its SPANK plugin
    " container-image container-mounts container-workdir container-name container-save"
    " container-env",
    "bcast compress exclusive immediate kill-on-bad-exit nice no-kill propagate resv-ports "
    "send-libs x11",
    """contiguous disable-status exact help hold label multi-prog no-allocate overcommit overlap
    oversubscribe preserve-env pty quiet quit-on-interrupt reboot spread-job test-only unbuffered
    usage use-min-nodes verbose version"""
    " container-mount-home no-container-mount-home container-remap-root no-container-remap-root"
    " container-entrypoint no-container-entrypoint container-entrypoint-log container-writable"
    " container-readonly",
)
_SRUN_SHORT = _letters(
    """
    A:account b:begin D:chdir M:clusters C:constraint S:core-spec c:cpus-per-task d:dependency
    X:disable-status m:distribution e:error x:exclude B:extra-node-info G:gpus h:help H:hold
    I:immediate i:input J:job-name K:kill-on-bad-exit l:label L:licenses Z:no-allocate
    k:no-kill F:nodefile w:nodelist N:nodes n:ntasks o:output O:overcommit s:oversubscribe
    p:partition E:preserve-env q:qos Q:quiet r:relative T:threads t:time u:unbuffered
    v:verbose V:version W:wait
    """
)

_LOG = "the driver's log is <work dir>/logs/slurm-<job id>.log, which up, logs and doctor read"
EXPORT = (
    "the processes need the submitting environment (vllm on PATH, the variables pdlaunch "
    "passes); --export other than ALL[,NAME=value...] drops it"
)
# Each sbatch refusal was tried in an #SBATCH line after pdlaunch's own on Slurm 22.05.8
# (scripts/probe_sbatch_lines.py, its output in tests/fixtures/slurm/sbatch-lines-22.05.8.txt).
# --quiet, --help, --version and --wrap are not here: in an #SBATCH line sbatch ignores them
# (the job is submitted, its id printed). Nor are --begin, --dependency and --hold: they delay
# the job, whose name, owner, work dir and id stay pdlaunch's; `up` waits for a pending job
# until its --timeout and cancels it then (tests/system/slurm/test_slurm_pending_adopt.py
# holds a job back with --begin on purpose).
SBATCH = Table(
    "sbatch",
    _SBATCH_LONG,
    _SBATCH_SHORT,
    stops=False,
    refused={
        "job-name": "pdlaunch names every component pdlaunch-<deployment> and finds, checks and "
        "cancels the job by that name (squeue, scancel --name)",
        "chdir": "the job runs in the router's work dir, which pdlaunch checks (squeue %Z) "
        "before it cancels the job",
        "output": _LOG,
        "error": _LOG + " (errors included)",
        "array": "an array runs the deployment several times on the same ports, as tasks "
        "pdlaunch does not record",
        "clusters": "the job would go to another cluster, where pdlaunch's squeue and scancel "
        "do not look",
        "uid": "the job would belong to another user, and pdlaunch cancels only its own jobs",
        "wait": "sbatch would not return until the job ends, and pdlaunch learns the job id "
        "when it returns",
        "test-only": "sbatch would only estimate the start, submitting nothing",
    },
)
_STEP = "pdlaunch places each step itself (one task on one node of its het group)"
_STEP_LOG = "the step's output goes to its log, which up, logs and doctor read"
# A step's srun line (templates/slurm/job.sh.j2) with a pyxis container: the options pdlaunch
# sets there, and those that would run something else than the process it planned.
SRUN = Table(
    "srun",
    _SRUN_LONG,
    _SRUN_SHORT,
    stops=True,
    refused={
        "nodes": _STEP,
        "ntasks": _STEP + "; more tasks would start the engine twice on one port",
        "nodelist": _STEP,
        "relative": _STEP,
        "het-group": _STEP,
        "jobid": "the step would run in another job, which pdlaunch does not cancel",
        "chdir": "the step runs in its work dir, where status finds its processes",
        "output": _STEP_LOG,
        "error": _STEP_LOG + " (errors included)",
        "open-mode": _STEP_LOG + ", appended to across restarts",
        "multi-prog": "srun would read the node runner as a configuration file, not run it",
        "test-only": "srun would start nothing",
        "container-image": "the image is container.image (validated and checked on the nodes)",
        "container-name": "pdlaunch names the container pdl-<deployment>-<process>, and a named "
        "pyxis container outlives its step",
        "container-workdir": "the step's scripts and logs are in its work dir, mounted at its "
        "own path",
    },
)


@dataclass(frozen=True)
class Option:
    """One option as getopt_long reads it: ``names`` the long options it may be (one, or
    several for an ambiguous abbreviation, which the tool refuses itself)."""

    index: int
    word: str
    spelling: str  # --name or -X as written
    names: tuple[str, ...]
    value: str | None


def _names(table: Table, name: str) -> tuple[str, ...]:
    if name in table.long:
        return (name,)
    return tuple(sorted(o for o in table.long if name and o.startswith(name)))


def read(words: Sequence[str], table: Table) -> tuple[list[Option], list[int]]:
    """The options in ``words``, and the indices of the words getopt_long would not read as
    options (for srun, from the first on: the command)."""
    out: list[Option] = []
    stray: list[int] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return out, [*stray, *range(i + 1, len(words))]
        if not word.startswith("-") or word == "-":
            if table.stops:
                return out, [*stray, *range(i, len(words))]
            stray.append(i)
            i += 1
            continue
        if word.startswith("--"):
            name, eq, inline = word[2:].partition("=")
            names = _names(table, name)
            kind = table.long[names[0]] if len(names) == 1 else REQUIRED
            value, used = (inline if eq else None), 1
            if not eq and kind == REQUIRED and i + 1 < len(words):
                value, used = words[i + 1], 2
            out.append(Option(i, word, "--" + name, names, value))
            i += used
            continue
        rest, used = word[1:], 1
        while rest:
            letter, rest = rest[0], rest[1:]
            long_name = table.short.get(letter)
            if long_name is None:
                break  # the tool refuses an unknown letter itself
            value = None
            if table.long[long_name] == REQUIRED:
                if rest:
                    value, rest = rest, ""
                elif i + 1 < len(words):
                    value, used = words[i + 1], 2
            elif table.long[long_name] == OPTIONAL and rest:
                value, rest = rest, ""
            out.append(Option(i, word, "-" + letter, (long_name,), value))
        i += used
    return out, stray


def _why(option: Option, table: Table) -> str | None:
    for name in option.names:
        if option.spelling == f"--{name}":
            how = ""
        elif option.spelling.startswith("--") and len(option.names) == 1:
            how = f" ({table.tool} reads {option.spelling} as --{name})"
        elif option.spelling.startswith("--"):
            how = f" ({option.spelling} abbreviates --{name})"
        else:
            how = f" ({option.spelling})"
        if name in table.refused:
            return f"sets --{name}{how}: {table.refused[name]}"
        if name == "export" and (option.value or "").split(",", 1)[0].upper() != "ALL":
            return f"sets --export{how}: {EXPORT}"
    return None


def refusal(words: Sequence[str], table: Table = SBATCH) -> tuple[str, str] | None:
    """(the word, why it cannot be given) for the first of ``words`` that sets an option of
    ``table.refused`` (or drops the environment), in one line; None when none does."""
    options, _ = read(words, table)
    for option in options:
        why = _why(option, table)
        if why:
            return option.word, why
    return None


def sbatch_refusal(words: Sequence[str]) -> str | None:
    """`refusal` over ``sbatch_opt``, as its message."""
    found = refusal(words, SBATCH)
    if found is None:
        return None
    word, why = found
    return f"sbatch_opt {word!r} {why}; remove it (pdlaunch sets what the job needs)"
