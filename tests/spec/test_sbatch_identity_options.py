"""Issue 32, class 3: an sbatch option that changes how pdlaunch finds, checks and cancels its
job (its name, owner, work dir, log, cluster, id, start) is refused in `sbatch_opt`, in every
spelling sbatch reads: ``--job-name=x``, ``--job-name x`` (two items), ``-J x``, ``-Jx``,
combined letters and getopt_long's abbreviations (``--job=x``).

What sbatch does with each line comes from a real sbatch 22.05.8 (scripts/probe_sbatch_lines.py,
its output in tests/fixtures/slurm/sbatch-lines-22.05.8.txt): ``--job-name=nightly`` after
pdlaunch's own names the job nightly, and so do ``--job=nightly`` and ``-Jnightly``. The option
table is sbatch's man page (tests/fixtures/slurm/sbatch-22.05.8-man-options.txt)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pdlaunch.spec import slurm_args
from pdlaunch.spec.load import LoadError, load_text
from pdlaunch.spec.slurm_options import SlurmError, SlurmOptions

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "slurm"

# option sbatch reads -> spellings of it, each as sbatch_opt items
REFUSED: dict[str, list[list[str]]] = {
    "--job-name": [
        ["--job-name=nightly"],
        ["--job-name", "nightly"],
        ["-J", "nightly"],
        ["-Jnightly"],
        ["--job=nightly"],
        ["--job-n=nightly"],
        ["-vJnightly"],  # -v takes no value: the J is read as -J
        ["-HJx"],  # and so does -H
    ],
    "--chdir": [["--chdir=/tmp"], ["-D", "/tmp"], ["-D/tmp"], ["--ch=/tmp"]],
    "--output": [["--output=/tmp/x.log"], ["-o", "/tmp/x"], ["-o/tmp/x"], ["--outp=/x"]],
    "--error": [["--error=/tmp/e"], ["-e/tmp/e"], ["--err=/tmp/e"]],
    "--array": [["--array=0-1"], ["-a0-1"], ["-a", "0-1"], ["--arr=0-1"]],
    "--clusters": [["--clusters=other"], ["-Mother"], ["--clu=other"]],
    "--uid": [["--uid=nobody"]],
    "--wait": [["--wait"], ["-W"]],
    "--test-only": [["--test-only"], ["--test=x"]],
    "--export": [["--export=NONE"], ["--export", "NONE"], ["--export=PATH"], ["--expo=NONE"]],
}
CASES = [(option, spelling) for option, spellings in REFUSED.items() for spelling in spellings]
ALLOWED = [
    ["--comment=pd"],
    ["--export=ALL"],
    ["--export=ALL,HF_HOME=/data"],
    ["--parsable"],
    ["--exclusive"],
    ["--constraint=a100"],
    ["--mail-type=END"],
    ["--requeue"],
    ["--signal=B:USR1@60"],
    # they delay the job, whose name, owner and work dir stay pdlaunch's: up waits for it
    ["--begin=now+20"],
    ["--dependency=afterok:1"],
    ["--hold"],
    # ignored in an #SBATCH line by sbatch 22.05.8 (the job is submitted, its id printed)
    ["--wrap=true"],
    ["--quiet"],
]


@pytest.mark.parametrize("option, spelling", CASES, ids=[" ".join(s) for _, s in CASES])
def test_an_identity_option_is_refused_in_every_spelling(option: str, spelling: list[str]):
    with pytest.raises(SlurmError) as err:
        SlurmOptions(extra_sbatch=tuple(spelling))
    message = str(err.value)
    assert f"sets {option}" in message, message
    assert message.startswith(f"sbatch_opt {spelling[0]!r}") and "\n" not in message


@pytest.mark.parametrize("options", ALLOWED, ids=[" ".join(o) for o in ALLOWED])
def test_other_options_still_pass(options: list[str]):
    SlurmOptions(extra_sbatch=tuple(options))


def _topology(sbatch_opt: list[str]) -> str:
    data = yaml.safe_load((ROOT / "topologies" / "gb200-xpyd.yaml").read_text())
    data["slurm"] = {"partition": "gpu", "sbatch_opt": sbatch_opt}
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize("option, spelling", CASES[:12], ids=[" ".join(s) for _, s in CASES[:12]])
def test_the_slurm_block_names_its_file_line_and_key(option: str, spelling: list[str]):
    text = _topology(spelling)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith("  sbatch_opt:"))
    with pytest.raises(LoadError) as err:
        load_text(text, "t.yaml")
    [problem] = err.value.problems
    assert problem.where() == f"t.yaml:{line} slurm.sbatch_opt", problem.where()
    assert f"sets {option}" in problem.message


def _probe() -> dict[str, tuple[str, str]]:
    """The probe's cases: option line -> (what sbatch answered, what squeue showed)."""
    out = {}
    for row in (FIXTURES / "sbatch-lines-22.05.8.txt").read_text().splitlines():
        if row.startswith("#"):
            continue
        case, answered, seen = row.split("\t")
        out[case] = (answered, seen.removeprefix("squeue: "))
    return out


def test_the_probe_shows_what_each_refused_line_does():
    """The refusals rest on a real sbatch: each line that renamed the job, moved it, gave it
    another owner, made an array, kept sbatch from returning or submitted nothing is refused;
    the lines sbatch ignored pass."""
    baseline = "pdlaunch-x|root|<dir>|PENDING"
    for case, (answered, seen) in _probe().items():
        job = seen.split("|", 1)
        changed = len(job) != 2 or job[1] != baseline or not job[0].isdigit()
        refused = slurm_args.sbatch_refusal([case]) is not None
        if case == "--export=NONE":
            assert refused, case  # the same in squeue, but the steps get no environment
        elif case == "--d=afterok:1":
            assert "ambiguous" in answered  # sbatch refuses it itself
        else:
            assert refused == changed, (case, answered, seen)
    assert _probe()["--job=nightly"][1].split("|")[1] == "nightly"


def _man_table(lines: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(long name -> its argument, letter -> long name) of a man page's OPTIONS headings."""
    longs: dict[str, str] = {}
    shorts: dict[str, str] = {}
    for line in lines:
        m = re.match(r"^\s+(?:-(\w),\s+)?--([a-z][a-z0-9-]*)(=|\[=)?", line)
        if not m:
            continue
        longs[m.group(2)] = {"=": "required", "[=": "optional", None: "none"}[m.group(3)]
        if m.group(1):
            shorts[m.group(1)] = m.group(2)
    return longs, shorts


@pytest.mark.parametrize("table", [slurm_args.SBATCH, slurm_args.SRUN], ids=lambda t: t.tool)
def test_the_option_tables_are_slurm_s_own(table: slurm_args.Table):
    fixture = FIXTURES / f"{table.tool}-22.05.8-man-options.txt"
    longs, shorts = _man_table(fixture.read_text().splitlines()[1:])
    pyxis = {k: v for k, v in table.long.items() if k.startswith(("container-", "no-container"))}
    assert {k: v for k, v in table.long.items() if k not in pyxis} == longs
    assert table.short == shorts
    assert set(table.refused) <= set(table.long)


@pytest.mark.parametrize("tool", ["sbatch", "srun"])
def test_the_fixture_is_the_installed_man_page(tool: str):
    if not all(shutil.which(c) for c in ("man", "sbatch", "dpkg-query")):
        pytest.skip("no sbatch man page here; the fixture names its version")
    version = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "slurm-client"], capture_output=True, text=True
    ).stdout
    if not version.startswith("22.05.8"):
        pytest.skip(f"the installed sbatch is {version or 'not a Debian package'}, not 22.05.8")
    res = subprocess.run(["man", "-P", "cat", tool], capture_output=True, text=True)
    live = [ln for ln in res.stdout.splitlines() if re.match(r"^       -[-A-Za-z]", ln)]
    fixture = (FIXTURES / f"{tool}-22.05.8-man-options.txt").read_text().splitlines()[1:]
    assert [ln.rstrip() for ln in live] == fixture
