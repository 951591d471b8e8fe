"""The topology file and `--backend-config` are read bounded (issue 32): a FIFO, /dev/zero, a
sparse 1 GiB file or YAML nested 100,000 deep is one line of bad input (exit 2) naming the
file, what kind of file pdlaunch expected there and the bound, read without blocking and
without reading it whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app
from tests.support import hostile_files

ROOT = Path(__file__).resolve().parents[2]
CASES = [
    ("fifo", "is not a regular file (a FIFO)"),
    ("dev-zero", "is not a regular file (a character device)"),
    ("sparse-1gib", "at most 4,194,304 are read"),
    ("deep", "exceeded maximum nesting depth"),  # the YAML parser's own bound
]


def _invoke(*args: object):
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output
    assert isinstance(res.exception, SystemExit), res.exception
    return res


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize(("kind", "says"), CASES)
def test_a_hostile_backend_config_is_one_line_naming_it(
    tmp_path: Path, kind: str, says: str
) -> None:
    topo = yaml.safe_load((ROOT / "topologies" / "gb200-xpyd.yaml").read_text())
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topo))
    config = hostile_files.make(tmp_path, "site.yaml", kind)
    res, peak = hostile_files.bounded_call(
        lambda: _invoke("validate", path, "--backend", "slurm", "--backend-config", config)
    )
    assert res.exit_code == 2, res.output
    [line] = [ln for ln in _error_lines(res.output) if str(config) in ln]
    assert says in line, res.output
    # The file is not called a topology file; what was expected there is said with the bound.
    assert "topology" not in line, line
    assert kind == "deep" or "backend config" in line, line
    assert peak < 64 << 20, f"{peak:,} bytes allocated reading {kind}"


@pytest.mark.parametrize(("kind", "says"), CASES)
def test_a_hostile_topology_file_is_one_line_naming_it(
    tmp_path: Path, kind: str, says: str
) -> None:
    path = hostile_files.make(tmp_path, "t.yaml", kind)
    res, peak = hostile_files.bounded_call(lambda: _invoke("validate", path))
    assert res.exit_code == 2, res.output
    [line] = [ln for ln in _error_lines(res.output) if str(path) in ln]
    assert says in line and (kind == "deep" or "topology file" in line), res.output
    assert peak < 64 << 20, f"{peak:,} bytes allocated reading {kind}"


def test_the_size_bound_is_said_for_a_real_file_just_over_it(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("# " + "x" * (4 << 20) + "\n")
    res = _invoke("validate", path)
    assert res.exit_code == 2 and "at most 4,194,304 are read" in res.output, res.output
