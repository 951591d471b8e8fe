"""Findings print as a compiler prints them: `FILE:LINE: severity [rule] field` (the line an
editor or a pre-commit hook jumps from), then the message and the fix, wrapped to the terminal;
never a table that folds a path mid-word."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.example_text import local_cpu_warning_text

ROOT = Path(__file__).resolve().parents[2]
NAME = "topologies/local-cpu.yaml"


def example(tmp_path: Path) -> Path:
    """local-cpu.yaml less its accepted warning, at the same relative name (cpu-budget fires)."""
    path = tmp_path / NAME
    path.parent.mkdir(exist_ok=True)
    path.write_text(local_cpu_warning_text())
    return path


def validate(name: str, columns: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pdlaunch", "validate", name],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=60,
    )  # fmt: skip


def test_a_warning_is_one_jumpable_line_then_its_message_and_fix(tmp_path):
    path = example(tmp_path)
    res = validate(NAME, 80, tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    head = re.compile(r"^topologies/local-cpu\.yaml:(\d+): warning \[cpu-budget\] "
                      r"hosts\.127\.0\.0\.1\.cpus$")  # fmt: skip
    m = next(filter(None, map(head.match, lines)), None)
    assert m, res.stderr
    # `hosts:` is absent from the file, so the line is where the field would go: in the file.
    assert 1 <= int(m.group(1)) <= len(path.read_text().splitlines())
    body = lines[lines.index(m.group(0)) + 1 :]
    assert body[0].startswith("  2 NIXL CPU engines on 127.0.0.1")
    assert any(ln.startswith("  fix: one CPU engine per host") for ln in body)


def test_findings_fit_80_and_120_columns_without_breaking_a_path(tmp_path):
    example(tmp_path)
    for columns in (80, 120):
        res = validate(NAME, columns, tmp_path)
        assert res.returncode == 0, res.stderr
        assert f"{NAME}:" in res.stderr
        for line in res.stderr.splitlines():
            # The head line carries the path whole, however long; the wrapped text fits.
            if not line.startswith("topologies/"):
                assert len(line) <= columns, (columns, line)


def test_an_error_says_how_many_and_that_nothing_started(tmp_path):
    bad = tmp_path / "bad.yaml"
    text = (ROOT / NAME).read_text()
    bad.write_text(text.replace("port: 8200", "port: 8100", 1))  # two engines, one port
    res = validate(str(bad), 80, ROOT)
    assert res.returncode == 1, res.stdout + res.stderr
    assert re.search(rf"^{re.escape(str(bad))}:\d+: error \[", res.stderr, re.M), res.stderr
    assert "error(s); nothing was started or written." in res.stderr
