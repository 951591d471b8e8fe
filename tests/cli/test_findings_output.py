"""Findings print as a compiler prints them: `FILE:LINE: severity [rule] field` (the line an
editor or a pre-commit hook jumps from), then the message and the fix, wrapped to the terminal;
never a table that folds a path mid-word."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def validate(path: Path, columns: int) -> subprocess.CompletedProcess[str]:
    env = {"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pdlaunch", "validate", str(path)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )  # fmt: skip


def test_a_warning_is_one_jumpable_line_then_its_message_and_fix():
    res = validate(Path("topologies/local-cpu.yaml"), 80)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    head = re.compile(r"^topologies/local-cpu\.yaml:(\d+): warning \[cpu-budget\] "
                      r"hosts\.127\.0\.0\.1\.cpus$")  # fmt: skip
    m = next(filter(None, map(head.match, lines)), None)
    assert m, res.stderr
    # `hosts:` is absent from the file, so the line is where the field would go: in the file.
    text = (ROOT / "topologies" / "local-cpu.yaml").read_text().splitlines()
    assert 1 <= int(m.group(1)) <= len(text)
    body = lines[lines.index(m.group(0)) + 1 :]
    assert body[0].startswith("  2 NIXL CPU engines on 127.0.0.1")
    assert any(ln.startswith("  fix: one CPU engine per host") for ln in body)


def test_findings_fit_80_and_120_columns_without_breaking_a_path():
    for columns in (80, 120):
        res = validate(Path("topologies/local-cpu.yaml"), columns)
        assert res.returncode == 0, res.stderr
        for line in res.stderr.splitlines():
            # The head line carries the path whole, however long; the wrapped text fits.
            if not line.startswith("topologies/"):
                assert len(line) <= min(columns, 100), (columns, line)
        assert "topologies/local-cpu.yaml:" in res.stderr


def test_an_error_says_how_many_and_that_nothing_started(tmp_path):
    bad = tmp_path / "bad.yaml"
    text = (ROOT / "topologies" / "local-cpu.yaml").read_text()
    bad.write_text(text.replace("port: 8200", "port: 8100", 1))  # two engines, one port
    res = validate(bad, 80)
    assert res.returncode == 1, res.stdout + res.stderr
    assert re.search(rf"^{re.escape(str(bad))}:\d+: error \[", res.stderr, re.M), res.stderr
    assert "error(s); nothing was started or written." in res.stderr
