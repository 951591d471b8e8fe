"""`--help` reads like a good command line at 80 and 120 columns: one line per command in
the list, each command's description reflowed to the terminal (never broken where the
docstring's lines happened to end), value columns a person reads (FLOAT, PATH, ssh|slurm;
nothing for a flag), no line wider than the terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pdlaunch.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (80, 120)
TYPER_LABELS = re.compile(r"<(bool|str|int|float|path)[^>]*>|range>")


def help_text(args: list[str], width: int) -> str:
    env = {**os.environ, "COLUMNS": str(width), "TERM": "dumb", "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pdlaunch", *args, "--help"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def description(text: str) -> list[list[str]]:
    """The paragraphs between the usage line and the first panel, as lists of lines."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("Usage:")) + 1
    heading = re.compile(r"[A-Z][A-Za-z ()]*:$")
    end = next((i for i, ln in enumerate(lines) if heading.match(ln)), len(lines))
    paragraphs: list[list[str]] = [[]]
    for ln in lines[start:end]:
        if ln.strip():
            paragraphs[-1].append(ln.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


@pytest.mark.parametrize("width", WIDTHS)
def test_the_command_list_has_one_line_per_command(width: int) -> None:
    text = help_text([], width)
    assert all(len(ln) <= width for ln in text.splitlines()), text
    rows: list[str] = []  # a command's row, its wrapped continuation lines joined to it
    for ln in text[text.index("Commands:") :].splitlines()[1:]:
        if re.match(r"  [a-z]+ ", ln):
            rows.append(ln.strip())
        elif ln.strip() and rows:
            rows[-1] += " " + ln.strip()
    assert [r.split()[0] for r in rows] == list(COMMANDS), text
    for name, (_, line) in COMMANDS.items():  # each command's one-line summary, whole
        assert f"{name} " in rows[list(COMMANDS).index(name)]
        assert " ".join(rows[list(COMMANDS).index(name)].split()[1:]) == line, text


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "export"] + ["export k8s"])
def test_each_command_help_reads_cleanly(command: str, width: int) -> None:
    text = help_text(command.split(), width)
    assert all(len(ln) <= width for ln in text.splitlines()), text
    assert not TYPER_LABELS.search(text), TYPER_LABELS.search(text)
    # Reflowed: inside a paragraph every line but the last fills the help's width (click's:
    # the terminal's, at most 80); a line ending where the docstring's line ended would not.
    fill = min(width, 80)
    for paragraph in description(text):
        for line in paragraph[:-1]:
            assert len(line) >= fill - 25, (command, width, paragraph)


def test_the_guard_sees_a_broken_paragraph() -> None:
    # Negative control for the reflow check above: a description broken at 60 columns.
    text = "Usage: x\n\n  short line that ends early\n  and goes on\n\nOptions:\n  --json"
    paragraphs = description(text)
    assert paragraphs == [["short line that ends early", "and goes on"]]
    assert len(paragraphs[0][0]) < 80 - 25


def test_the_command_list_is_whole_when_help_comes_before_a_command() -> None:
    # `pdlaunch --help up` prints the group's help: every command must be in it, not only the
    # ones whose module the console script loaded for `up`.
    text = help_text(["up"], 120).replace("Usage:", "")  # `up --help`: up's own help
    assert "Commands:" not in text
    env = {**os.environ, "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, "-m", "pdlaunch", "--help", "up"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    listed = [ln.split()[0] for ln in proc.stdout[proc.stdout.index("Commands:") :].splitlines()[1:]
              if ln.startswith("  ") and not ln.startswith("   ")]  # fmt: skip
    assert listed == list(COMMANDS), proc.stdout
