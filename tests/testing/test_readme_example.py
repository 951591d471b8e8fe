"""README's "Testing your automation" example runs as written (in a process of its own: it
sets PDLAUNCH_STATE_DIR itself, as a user's test would)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Testing your automation", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    assert "FakeRuntime" in code and "rolled_back" in code
    res = subprocess.run(
        [sys.executable, "-c", code + "\nprint('example ok')"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0 and "example ok" in res.stdout, res.stderr
