"""Issue 32, class 3, at the command line: an sbatch option that renames or moves the job is
refused by `validate --backend slurm` from each place sbatch options come from (the topology's
`slurm:` block, a `--backend-config` file, `--sbatch-opt`), exit 2 with one line naming where
it was given and why, never a traceback; `render` writes no job with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
BLOCK = {"partition": "gpu", "gpus_per_node": 4, "cpus_per_node": 144}


def run(*args: object):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def topology(tmp_path: Path, sbatch_opt: list[str] | None = None) -> Path:
    spec = yaml.safe_load((ROOT / "topologies" / "gb200-xpyd.yaml").read_text())
    spec["slurm"] = {**BLOCK, **({"sbatch_opt": sbatch_opt} if sbatch_opt else {})}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


SPELLINGS = [["--job-name=nightly"], ["--job-name", "nightly"], ["-J", "nightly"], ["-Jnightly"]]


@pytest.mark.parametrize("opts", SPELLINGS, ids=" ".join)
def test_the_slurm_block(opts: list[str], tmp_path: Path) -> None:
    path = topology(tmp_path, opts)
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "sbatch_opt" in t)
    res = run("validate", path, "--backend", "slurm")
    assert res.exit_code == 2, res.output
    [said] = [ln for ln in res.output.splitlines() if "sbatch_opt" in ln]
    assert f"{path}:{line}" in said and "sets --job-name" in said, res.output


@pytest.mark.parametrize("opts", SPELLINGS, ids=" ".join)
def test_a_backend_config_file(opts: list[str], tmp_path: Path) -> None:
    config = tmp_path / "site.yaml"
    config.write_text(yaml.safe_dump({"slurm": {"sbatch_opt": opts}}))
    res = run("validate", topology(tmp_path), "--backend", "slurm", "--backend-config", config)
    assert res.exit_code == 2, res.output
    assert f"{config}:" in res.output and "sets --job-name" in res.output, res.output


@pytest.mark.parametrize("opts", SPELLINGS, ids=" ".join)
def test_the_sbatch_opt_flag(opts: list[str], tmp_path: Path) -> None:
    flags = [f"--sbatch-opt={o}" for o in opts]
    res = run("validate", topology(tmp_path), "--backend", "slurm", *flags)
    assert res.exit_code == 2, res.output
    assert "sets --job-name" in res.output, res.output
    out = tmp_path / "out"
    res = run("render", topology(tmp_path), "-o", out, "--backend", "slurm", *flags)
    assert res.exit_code == 2 and not (out / "slurm-job.sh").exists(), res.output
