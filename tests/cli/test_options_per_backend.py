"""An option the chosen backend does not read is refused (exit 2, the option and the backend
named), never silently ignored; the same thing has the same option name on every command;
`render --backend k8s` and its old name `export k8s` write the same bytes."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app
from pdlaunch.cli.backend_options import EVERY_BACKEND, OPTION_BACKENDS, long_name

ROOT = Path(__file__).resolve().parents[2]
GB200 = str(ROOT / "topologies" / "gb200-xpyd.yaml")
runner = CliRunner()


def run(*args: str):
    res = runner.invoke(app, list(args))
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


# Each: the command line (OUT: an output dir that must not appear), the options refused,
# the backend named.
REFUSED_CHOSEN = [
    (["up", GB200, "--backend", "slurm", "--known-hosts", "kh"], ["--known-hosts"], "slurm"),
    (["up", GB200, "--backend", "slurm", "--ssh-config", "c"], ["--ssh-config"], "slurm"),
    (
        ["up", GB200, "--backend", "slurm", "--accept-new-host-keys"],
        ["--accept-new-host-keys"],
        "slurm",
    ),
    (["up", GB200, "--backend", "slurm", "--grace", "10"], ["--grace"], "slurm"),
    (["up", GB200, "--backend", "slurm", "--skip-check"], ["--skip-check"], "slurm"),
    # --replace and --canary-scope are the lifecycle's: read on every runtime (tests/runtime).
    (["up", GB200, "--exclusive", "--time", "5"], ["--time", "--exclusive"], "ssh"),
    (["validate", GB200, "--partition", "gpu"], ["--partition"], "ssh"),
    (["render", GB200, "-o", "OUT", "--nodelist", "n1"], ["--nodelist"], "ssh"),
    (["render", GB200, "-o", "OUT", "--k8s-target", "lws"], ["--k8s-target"], "ssh"),
    (["render", GB200, "-o", "OUT", "--backend", "slurm", "--image", "i"], ["--image"], "slurm"),
    (
        ["render", GB200, "-o", "OUT", "--backend", "k8s", "--partition", "p"],
        ["--partition"],
        "k8s",
    ),
]


@pytest.mark.parametrize("argv, named, backend", REFUSED_CHOSEN)
def test_an_option_of_another_backend_is_refused(argv, named, backend, tmp_path: Path):
    out = tmp_path / "out"
    res = run(*[str(out) if a == "OUT" else a for a in argv])
    assert res.exit_code == 2, res.output
    line = res.output
    assert f"{', '.join(named)}:" in line and f"not read with --backend {backend}" in line, line
    assert not out.exists()


def _slurm_recorded(state_dir: Path, name: str = "gb") -> str:
    # Which backend a deployment is on is read from which record file it has.
    d = state_dir / name
    d.mkdir(parents=True)
    (d / "slurm.json").write_text("{}")
    return name


@pytest.mark.parametrize(
    "argv, named",
    [
        (["status", "DEP", "--known-hosts", "kh"], ["--known-hosts"]),
        (["status", "DEP", "--watch", "--ssh-config", "c"], ["--ssh-config"]),
        (
            ["down", "DEP", "--grace", "1", "--accept-new-host-keys"],
            ["--accept-new-host-keys", "--grace"],
        ),
        (["logs", "DEP", "router", "--ssh-config", "c"], ["--ssh-config"]),
        (["doctor", "DEP", "--known-hosts", "kh"], ["--known-hosts"]),
    ],
)
def test_ssh_options_on_a_slurm_deployment_are_refused(argv, named, state_dir: Path):
    dep = _slurm_recorded(state_dir)
    res = run(*[dep if a == "DEP" else a for a in argv])
    assert res.exit_code == 2, res.output
    assert f"{', '.join(named)}: SSH option(s), not read with --backend slurm" in res.output
    assert f"the backend '{dep}' is recorded on" in res.output
    # The record decides, so the message does not suggest overriding it.
    assert "add --backend" not in res.output
    assert (state_dir / dep / "slurm.json").read_text() == "{}"


def test_options_of_the_chosen_backend_pass_the_check(state_dir: Path):
    # No record: SSH, whose options apply; `status` says "nothing recorded" (exit 1), not 2.
    res = run("status", "nothing-here", "--known-hosts", "kh")
    assert res.exit_code == 1 and "not running (nothing recorded)" in res.output, res.output
    # `--backend ssh` given explicitly over a Slurm record: SSH options apply again.
    dep = _slurm_recorded(state_dir)
    res = run("status", dep, "--backend", "ssh", "--known-hosts", "kh")
    assert res.exit_code == 1 and "not read with" not in res.output, res.output


def _commands():
    root = typer.main.get_command(app)
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        for sub_name, sub in getattr(cmd, "commands", {name: cmd}).items():
            yield f"{name} {sub_name}".strip() if sub is not cmd else name, sub


def test_every_option_of_a_backend_command_is_classified():
    """A new option on a command with a backend must say which backends read it (or that
    all do): otherwise it would be ignored on the others without a word."""
    unclassified = []
    for name, cmd in _commands():
        opts = {long_name(p) for p in cmd.params if p.param_type_name == "option"}
        if "--backend" not in opts and name != "export k8s":
            continue
        unclassified += [f"{name} {o}" for o in opts - EVERY_BACKEND - set(OPTION_BACKENDS)]
    assert not unclassified
    # And every entry of the table is an option some command has.
    every = {long_name(p) for _, c in _commands() for p in c.params}
    assert set(OPTION_BACKENDS) <= every


def test_every_output_directory_is_dash_o_output():
    for name, cmd in _commands():
        for p in cmd.params:
            if "-o" in p.opts:
                assert "--output" in p.opts, name


# -- Kubernetes: `render --backend k8s`, and `export k8s` as its old name ----------------------
@pytest.mark.parametrize(
    "command", [["render", GB200, "--backend", "k8s"], ["export", "k8s", GB200]]
)
def test_a_bad_k8s_target_is_a_usage_error(command, tmp_path: Path):
    res = run(*command, "-o", str(tmp_path / "o"), "--k8s-target", "helm")
    assert res.exit_code == 2, res.output
    assert "--k8s-target" in res.output and "disaggregatedset" in res.output and "lws" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("target", ["disaggregatedset", "lws"])
def test_render_k8s_and_its_aliases_write_the_same(target: str, tmp_path: Path):
    spellings = {
        "render": ["render", GB200, "--backend", "k8s", "-o"],
        "render-long": ["render", GB200, "--backend", "K8S", "--output"],
        "export": ["export", "k8s", GB200, "-o"],
        "export-old": ["export", "k8s", GB200, "--out"],
    }
    outputs = {}
    for key, argv in spellings.items():
        d = tmp_path / key
        res = run(*argv, str(d), "--k8s-target", target)
        assert res.exit_code == 0, res.output
        outputs[key] = res.output.replace(str(d), "DIR")
        files = sorted(p.name for p in d.iterdir())
        assert any(f.endswith(".yaml") for f in files) and "index.md" in files
        cmp = filecmp.dircmp(tmp_path / "render", d)
        assert not cmp.left_only and not cmp.right_only and not cmp.diff_files, key
    assert len(set(outputs.values())) == 1, outputs
    assert f"manifest(s) to DIR ({target})" in outputs["render"]


def test_export_k8s_output_spellings_are_checked(tmp_path: Path):
    res = run("export", "k8s", GB200)
    assert res.exit_code == 2 and "-o/--output" in res.output, res.output
    res = run("export", "k8s", GB200, "-o", str(tmp_path / "a"), "--out", str(tmp_path / "b"))
    assert res.exit_code == 2 and "--out" in res.output, res.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # The old spelling works but is not advertised.
    assert "--out " not in run("export", "k8s", "--help").output


def test_render_k8s_json_lists_the_files(tmp_path: Path):
    res = run("render", GB200, "--backend", "k8s", "-o", str(tmp_path / "o"), "--json")
    assert res.exit_code == 0, res.output
    files = json.loads(res.stdout)["files"]
    assert files and all(Path(f).is_file() and Path(f).parent == tmp_path / "o" for f in files)


@pytest.mark.parametrize(
    "extra, named, why",
    [
        (["--interval", "2"], "--interval", "without --watch"),
        (["--count", "3"], "--count", "without --watch"),
        (["--watch", "--known-hosts", "kh"], "--known-hosts", "by status --watch"),
    ],
)
def test_status_refuses_options_its_mode_does_not_read(extra, named, why):
    # No record at all: SSH, so only the mode decides.
    res = run("status", "nothing-here", *extra)
    assert res.exit_code == 2, res.output
    assert f"{named}: not read {why}" in res.output


def test_validate_k8s_refuses_what_the_export_refuses_and_writes_nothing(tmp_path: Path):
    data = yaml.safe_load(Path(GB200).read_text())
    # Valid for SSH and Slurm, but one LeaderWorkerSet template cannot hold two prefills
    # that differ (pdlaunch/backends/k8s/manifests.py).
    data["prefill"][1]["extra_args"] = ["--max-num-seqs=16"]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    assert run("validate", str(path)).exit_code == 0
    res = run("validate", str(path), "--backend", "k8s")
    assert res.exit_code == 1 and "prefill-0 and prefill-1 differ" in res.output, res.output
    res = run("render", str(path), "--backend", "k8s", "-o", str(tmp_path / "o"))
    assert res.exit_code == 1 and "differ" in res.output, res.output
    assert not (tmp_path / "o").exists()
    res = run("validate", GB200, "--backend", "k8s", "--k8s-target", "lws", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["valid"] and data["backend"] == "k8s" and data["target"] == "lws"
    # The same objects `render` writes: one YAML file each.
    res = run("render", GB200, "--backend", "k8s", "--k8s-target", "lws", "-o", str(tmp_path / "w"))
    assert len(list((tmp_path / "w").glob("*.yaml"))) == data["objects"]


def test_every_short_option_means_one_long_option():
    """`-o` is --output and `-n` is --lines on every command that has them."""
    meaning: dict[str, set[str]] = {}
    for _, cmd in _commands():
        for p in cmd.params:
            for short in (o for o in p.opts if not o.startswith("--")):
                meaning.setdefault(short, set()).add(long_name(p))
    assert all(len(longs) == 1 for longs in meaning.values()), meaning
    assert meaning["-o"] == {"--output"} and meaning["-n"] == {"--lines"}
