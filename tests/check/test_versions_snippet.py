"""The versions probe's snippet reads dist-info/egg-info itself (importing importlib.metadata
cost ~45 ms of CPU per host): it must find what importlib.metadata finds, run for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from pdlaunch.check.probes.versions import SNIPPET

NAMES_LINE = next(line for line in SNIPPET.splitlines() if line.startswith("names="))


def run(names: list[str], pythonpath: list[Path] | None = None) -> dict:
    """The snippet, asking for ``names``; with ``pythonpath``: on those dirs only (-S)."""
    code = SNIPPET.replace(NAMES_LINE, f"names={tuple(names)!r}")
    argv = [sys.executable, "-c", code]
    env = dict(os.environ)
    if pythonpath is not None:
        argv.insert(1, "-S")
        env["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out)


def reference(names: list[str], pythonpath: list[Path] | None = None) -> dict:
    """importlib.metadata's answer in the same interpreter setup."""
    code = (
        "import json\nfrom importlib import metadata as md\n"
        "def v(n):\n    try:\n        return md.version(n)\n"
        "    except md.PackageNotFoundError:\n        return None\n"
        f"print(json.dumps({{n: v(n) for n in {tuple(names)!r}}}))"
    )
    argv = [sys.executable, "-c", code]
    env = dict(os.environ)
    if pythonpath is not None:
        argv.insert(1, "-S")
        env["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    return json.loads(
        subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    )


def test_same_versions_as_importlib_metadata_for_every_installed_distribution():
    names = sorted({d.metadata["Name"] for d in metadata.distributions()})
    assert len(names) > 20  # the venv's own packages: a real sample
    names += ["no-such-dist-pdlaunch", "VLLM", "nixl_cu12"]  # absent; other spellings
    got = run(names)
    assert got["packages"] == reference(names)
    assert got["python"] == ".".join(map(str, sys.version_info[:3]))
    assert got["executable"] == sys.executable


def _dist(root: Path, entry: str, version: str, *, file: str = "METADATA") -> None:
    d = root / entry
    d.mkdir(parents=True)
    (d / file).write_text(f"Metadata-Version: 2.1\nName: x\nVersion: {version}\n\nbody\n")


def test_first_on_the_path_wins_and_egg_info_counts(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    _dist(first, "vllm-0.32.0+cpu.dist-info", "0.32.0+cpu")
    _dist(second, "vllm-0.31.0.dist-info", "0.31.0")
    _dist(second, "nixl_cu12-1.5.1.dist-info", "1.5.1")
    _dist(second, "torch-2.9.0.egg-info", "2.9.0", file="PKG-INFO")
    (first / "vllm_gaudi-1.0-py3.11.egg-info").write_text("Name: vllm-gaudi\nVersion: 1.0\n")
    names = ["vllm", "nixl-cu12", "torch", "vllm-gaudi", "nixl"]
    got = run(names, [first, second])
    assert got["packages"] == {
        "vllm": "0.32.0+cpu",
        "nixl-cu12": "1.5.1",
        "torch": "2.9.0",
        "vllm-gaudi": "1.0",
        "nixl": None,
    }
    assert got["packages"] == reference(names, [first, second])
