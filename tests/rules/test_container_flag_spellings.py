"""Issue 32, class 5: `container.extra_args` read as `docker/podman run` read them. The rule
compared each word's text before ``=`` with a list, so ``-d`` and ``-p 8000:8000`` were
refused but ``-dit``, ``-td``, ``-p8000:8000``, ``-d=true`` and ``-Pi`` passed, which the
runtime reads as detach and publish; a stray word became the image. And a pyxis mount
``/data,/etc:/data`` passed, which pyxis splits at the comma into two mounts, /etc included.

The parser's tables are checked against the runtimes' own ``run --help``
(tests/fixtures/container/, captured from podman 4.3.1 and docker 28.2.2 on this machine),
and, when those binaries are installed, against their live output."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pdlaunch.rules import validate
from pdlaunch.spec import run_flags
from pdlaunch.spec.load import load_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "container"
HELP = {
    "podman": FIXTURES / "podman-4.3.1-run-help.txt",
    "docker": FIXTURES / "docker-28.2.2-run-help.txt",
}

BASE = """
deployment: ctr
model: {name: /models/tiny, served_name: tiny, dtype: float32, max_model_len: 1024}
defaults:
  container: {image: "localhost/pdl-engine:1", runtime: podman, mounts: ["/models:/models:ro"]}
prefill: [{host: 127.0.0.1, bind: 127.0.0.1, device: cpu, port: 8100, block_size: 32}]
decode: [{host: 127.0.0.1, bind: 127.0.0.1, device: cpu, port: 8200, block_size: 32}]
router: {host: 127.0.0.1, port: 8123, prometheus_port: 29123}
"""


def _findings(**container: object) -> list:
    data = yaml.safe_load(BASE)
    data["defaults"]["container"].update(container)
    topo, src = load_text(yaml.safe_dump(data), "t.yaml")
    return [
        f for f in validate(topo, src) if f.rule.startswith("container-") and f.severity == "error"
    ]


# spelling -> the flag the runtime reads (and the words of the message's reason)
REFUSED = {
    "-dit": ("--detach", "foreground"),
    "-td": ("--detach", "foreground"),
    "-itd": ("--detach", "foreground"),
    "-d=true": ("--detach", "foreground"),
    "--detach=true": ("--detach", "foreground"),
    "-p8000:8000": ("--publish", "host port"),
    "-p=8000:8000": ("--publish", "host port"),
    "-ip8000:8000": ("--publish", "host port"),
    "--publish=8000:8000": ("--publish", "host port"),
    "-Pi": ("--publish-all", "host port"),
    "-tP": ("--publish-all", "host port"),
    "--name=x": ("--name", "pdl-<deployment>"),
}


@pytest.mark.parametrize("spelling", list(REFUSED))
def test_a_managed_flag_is_refused_in_every_spelling(spelling: str):
    flag, words = REFUSED[spelling]
    found = _findings(extra_args=[spelling])
    assert [f.rule for f in found] == ["container-flags"], found
    assert words in found[0].message and spelling in found[0].message
    if spelling.partition("=")[0] != flag:
        assert f"read by the runtime as {flag}" in found[0].message
    assert found[0].field == ("defaults", "container", "extra_args")


@pytest.mark.parametrize(
    "args",
    [["-p", "8000:8000"], ["--publish", "8000:8000"], ["-it", "-p", "1:1"], ["--network", "x"]],
)
def test_a_value_in_the_next_word_is_still_read(args: list[str]):
    assert [f.rule for f in _findings(extra_args=args)] == ["container-flags"]


@pytest.mark.parametrize(
    "args",
    [
        ["-v/x:/x"],  # -v takes the rest of the word: not the letters v, /, x
        ["-v", "/d:/d"],
        ["-e", "-d"],  # -e takes the next word whatever it is: -d is its value
        ["--env=-d"],
        ["-it"],
        ["-w/tmp", "-u0"],
        ["--ulimit", "nofile=1:1", "--net=host"],
        ["--init", "--ipc=host"],
    ],
)
def test_values_are_values_not_flags(args: list[str]):
    assert _findings(extra_args=args) == []


def test_a_word_that_would_become_the_image_is_refused():
    found = _findings(extra_args=["--init", "debug"])  # --init takes no value
    assert [f.rule for f in found] == ["container-flags"]
    assert "'debug'" in found[0].message and "image" in found[0].message
    found = _findings(extra_args=["--", "-d"])
    assert [f.rule for f in found] == ["container-flags"] and "'-d'" in found[0].message


def test_a_letter_neither_runtime_has_is_refused():
    found = _findings(extra_args=["-x"])
    assert [f.rule for f in found] == ["container-flags"] and "-x" in found[0].message


def test_parse_reads_combined_letters_as_pflag_does():
    parsed = run_flags.parse(["-dit", "-p8000:8000", "-ev=1", "-d=false", "--rm"])
    assert [(f.flag, f.value) for f in parsed.flags] == [
        ("--detach", None),
        ("--interactive", None),
        ("--tty", None),
        ("--publish", "8000:8000"),
        ("--env", "v=1"),
        ("--detach", "false"),
        ("--rm", None),
    ]
    assert parsed.stray == [] and parsed.unknown == []


def _help_table(text: str) -> tuple[dict[str, tuple[str, bool]], set[str], set[str]]:
    """(one-letter flags, boolean long flags, every long flag) of a `run --help`."""
    short: dict[str, tuple[str, bool]] = {}
    boolean, every = set(), set()
    for line in text.splitlines():
        m = re.match(r"^\s+(?:-(\w), )?(--[\w-]+)( \S+)?(?:\s{2,}|$)", line)
        if not m:
            continue
        every.add(m.group(2))
        if not m.group(3):
            boolean.add(m.group(2))
        if m.group(1):
            short[m.group(1)] = (m.group(2), bool(m.group(3)))
    return short, boolean, every


@pytest.mark.parametrize("runtime", list(HELP))
def test_the_tables_are_the_runtimes_own(runtime: str):
    short, boolean, every = _help_table(HELP[runtime].read_text())
    assert short == run_flags.SHORT
    assert boolean <= run_flags.BOOLEAN
    assert not (run_flags.BOOLEAN & (every - boolean))  # never valued in the other CLI


@pytest.mark.parametrize("runtime", list(HELP))
def test_the_fixture_is_what_the_installed_runtime_says(runtime: str):
    if shutil.which(runtime) is None:
        pytest.skip(f"{runtime} is not installed here; the fixture names its version")
    version = subprocess.run([runtime, "--version"], capture_output=True, text=True, timeout=30)
    if HELP[runtime].name.split("-")[1] not in version.stdout:
        pytest.skip(f"installed {version.stdout.strip()}, fixture of another version")
    live = subprocess.run([runtime, "run", "--help"], capture_output=True, text=True, timeout=30)
    assert _help_table(live.stdout) == _help_table(HELP[runtime].read_text())


# -- pyxis mounts ---------------------------------------------------------------------------------
def test_a_pyxis_mount_with_a_comma_in_a_path_is_refused():
    found = _findings(runtime="pyxis", mounts=["/data,/etc:/data"])
    assert [f.rule for f in found] == ["container-pyxis-mounts"], found
    assert "/etc" in found[0].message and "2 mounts" in found[0].message
    assert found[0].field == ("defaults", "container", "mounts")
    found = _findings(runtime="pyxis", mounts=["/models:/models:ro", "/a:/b,/etc"])
    assert [f.rule for f in found] == ["container-pyxis-mounts"]


def test_a_pyxis_mount_with_comma_separated_flags_is_refused():
    found = _findings(runtime="pyxis", mounts=["/d:/d:ro,z"])
    assert [f.rule for f in found] == ["container-pyxis-mounts"] and "+" in found[0].message


def test_the_same_mounts_pass_for_podman_which_takes_each_as_its_own_argument():
    assert _findings(mounts=["/d:/d:ro,z"]) == []
    assert _findings(runtime="pyxis", mounts=["/data:/data:ro"]) == []


# -- pyxis extra_args: srun options of each step ------------------------------------------------
# pyxis's extra_args go onto each step's srun line after pdlaunch's own (job.sh.j2);
# srun keeps the last of a repeated option, and stops reading options at the first other word.
SRUN_REFUSED = {
    "--output": [["--output=/x"], ["-o/x"], ["-o", "/x"], ["--out=/x"]],
    "--chdir": [["--chdir=/x"], ["-D/x"], ["-lD", "/x"]],
    "--ntasks": [["--ntasks=2"], ["-n2"], ["-n", "2"]],
    "--nodes": [["-N", "2"]],
    "--nodelist": [["-w", "n2"], ["--nodelist=n2"]],
    "--het-group": [["--het-group=1"], ["--het=1"]],
    "--jobid": [["--jobid=5"]],
    "--container-name": [["--container-name=x"], ["--container-n=x"]],
    "--container-image": [["--container-image=other:1"]],
    "--export": [["--export=NONE"], ["--export", "HOME"]],
    "--multi-prog": [["--multi-prog"]],
}
SRUN_CASES = [(o, s) for o, spellings in SRUN_REFUSED.items() for s in spellings]


@pytest.mark.parametrize("option, args", SRUN_CASES, ids=[" ".join(a) for _, a in SRUN_CASES])
def test_a_pyxis_srun_option_pdlaunch_sets_is_refused(option: str, args: list[str]):
    found = _findings(runtime="pyxis", mounts=["/models:/models"], extra_args=args)
    assert [f.rule for f in found] == ["container-flags"], found
    assert f"sets {option}" in found[0].message and "srun" in found[0].message


@pytest.mark.parametrize("args", [["hostname"], ["--label", "extra"], ["--", "-o/x"]])
def test_a_pyxis_word_srun_would_run_as_the_command_is_refused(args: list[str]):
    found = _findings(runtime="pyxis", mounts=["/models:/models"], extra_args=args)
    assert [f.rule for f in found] == ["container-flags"], found
    assert "command" in found[0].message


@pytest.mark.parametrize(
    "args",
    [
        ["--container-remap-root"],
        ["--no-container-mount-home", "--container-writable"],
        ["--container-env=HF_HOME"],
        ["-l", "--unbuffered", "--cpu-bind=none"],
        ["--export=ALL,X=1"],
        ["-d", "x"],  # srun's -d is --dependency with the value x: not docker's --detach
    ],
)
def test_other_pyxis_srun_options_pass(args: list[str]):
    assert _findings(runtime="pyxis", mounts=["/models:/models"], extra_args=args) == []
