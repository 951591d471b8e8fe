"""Backend settings in one place (pdlaunch/spec/backend_settings.py): the topology's `slurm:` block,
`--backend-config FILE` over it, the flags typed over both; a bad value named with its file,
line and key (exit 2); the block over SSH said to be unused (a validate warning), the file
refused there (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
# gpus/cpus per node in the block: no sinfo is asked (the rules compare the plan with them)
BLOCK = {"partition": "blockpart", "time": 30, "sbatch_opt": ["--comment=block"],
         "gpus_per_node": 4, "cpus_per_node": 144, "exclusive": True}  # fmt: skip


def run(*args: object):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def topology(tmp_path: Path, block: dict | None = BLOCK) -> Path:
    spec = yaml.safe_load((ROOT / "topologies" / "gb200-xpyd.yaml").read_text())
    if block is not None:
        spec["slurm"] = block
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def sbatch_lines(out: Path) -> list[str]:
    """The first component's #SBATCH lines of the rendered job."""
    text = (out / "slurm-job.sh").read_text()
    first = text.split("#SBATCH hetjob", 1)[0]
    return [line.split(" ", 1)[1] for line in first.splitlines() if line.startswith("#SBATCH ")]


def test_the_topologys_block_is_what_sbatch_gets(tmp_path: Path) -> None:
    res = run("render", topology(tmp_path), "-o", tmp_path / "out", "--backend", "slurm")
    assert res.exit_code == 0, res.output
    lines = sbatch_lines(tmp_path / "out")
    for want in ("--partition=blockpart", "--time=30", "--comment=block", "--exclusive"):
        assert want in lines, lines


def test_the_file_overrides_the_block_and_the_flags_override_both(tmp_path: Path) -> None:
    config = tmp_path / "site.yaml"
    config.write_text(yaml.safe_dump({"slurm": {"partition": "filepart", "qos": "fileqos",
                                                "sbatch_opt": ["--comment=file"]}}))  # fmt: skip
    path = topology(tmp_path)
    res = run("render", path, "-o", tmp_path / "a", "--backend", "slurm",
              "--backend-config", config)  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = sbatch_lines(tmp_path / "a")
    assert "--partition=filepart" in lines and "--qos=fileqos" in lines, lines
    assert "--time=30" in lines  # a key the file leaves out keeps the block's value
    res = run("render", path, "-o", tmp_path / "b", "--backend", "slurm", "--backend-config",
              config, "--partition", "flagpart", "--no-exclusive", "--sbatch-opt",
              "--comment=flag")  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = sbatch_lines(tmp_path / "b")
    assert "--partition=flagpart" in lines and "--exclusive" not in lines, lines
    # the lists add up, in precedence order: sbatch keeps the last, the flag's
    comments = [x for x in lines if x.startswith("--comment=")]
    assert comments == ["--comment=block", "--comment=file", "--comment=flag"], lines


@pytest.mark.parametrize(
    "block, key, message",
    [
        ({"time": "1 hour"}, "slurm.time", "slurm time '1 hour'"),
        ({"mem": "lots"}, "slurm.mem", "slurm mem 'lots'"),
        ({"partition": "a b"}, "slurm.partition", "#SBATCH line"),
        ({"sbatch_opt": ["comment=x"]}, "slurm.sbatch_opt", "extra sbatch option"),
        ({"gpus_per_node": 0}, "slurm.gpus_per_node", "greater than or equal to 1"),
        ({"partiton": "gpu"}, "slurm.partiton", "unknown key"),  # a typo is not ignored
    ],
)
def test_a_bad_block_value_is_named_with_its_line(block, key, message, tmp_path: Path) -> None:
    path = topology(tmp_path, block)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                if text.startswith(f"  {key.split('.')[1]}:"))  # fmt: skip
    for argv in (["validate", path], ["validate", path, "--backend", "slurm"]):
        res = run(*argv, "--json")
        assert res.exit_code == 2, res.output
        [problem] = json.loads(res.output)["input_errors"]
        assert problem["field"] == key and problem["line"] == line, problem
        assert message in problem["message"], problem


def test_a_bad_backend_config_file_is_named_with_its_line(tmp_path: Path) -> None:
    config = tmp_path / "site.yaml"
    config.write_text("slurm:\n  partition: gpu\n  time: soon\n")
    res = run("validate", topology(tmp_path), "--backend", "slurm", "--backend-config", config)
    assert res.exit_code == 2, res.output
    assert f"{config}:3" in res.output and "slurm.time" in res.output, res.output
    config.write_text("slurm:\n  partition: gpu\nk8s: {}\n")
    res = run("validate", topology(tmp_path), "--backend", "slurm", "--backend-config", config)
    assert res.exit_code == 2 and f"{config}:3" in res.output, res.output
    res = run("validate", topology(tmp_path), "--backend", "slurm", "--backend-config",
              tmp_path / "missing.yaml")  # fmt: skip
    assert res.exit_code == 2 and "no such file" in res.output, res.output


def test_over_ssh_the_block_is_a_warning_and_the_file_is_refused(tmp_path: Path) -> None:
    path = topology(tmp_path)
    res = run("validate", path, "--json")
    assert res.exit_code == 0, res.output
    findings = json.loads(res.output)["findings"]
    [unused] = [f for f in findings if f["rule"] == "unused-backend-block"]
    assert unused["severity"] == "warning" and unused["field"] == "slurm", unused
    res = run("validate", path, "--backend", "slurm", "--json")
    assert res.exit_code == 0, res.output
    assert all(f["rule"] != "unused-backend-block" for f in json.loads(res.output)["findings"])
    config = tmp_path / "site.yaml"
    config.write_text("slurm:\n  partition: gpu\n")
    res = run("validate", path, "--backend-config", config)
    assert res.exit_code == 2, res.output
    assert "--backend-config: Slurm option(s), not read with --backend ssh" in res.output
