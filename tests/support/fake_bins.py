"""The launch tests' stand-ins for `vllm serve` and vllm-router (tests/support/fake_vllm.py,
tests/support/fake_router.py) as executables, for the launch and Slurm tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parent  # fake_vllm.py, fake_router.py


def install_fake(src: Path, dest: Path) -> Path:
    """``src`` as an executable ``dest`` with this interpreter in its shebang: a fast start, and
    no PATH lookup where the venv is not on PATH (an sshd login's shell, a Slurm step)."""
    body = src.read_text().split("\n", 1)[1]
    dest.write_text(f"#!{sys.executable} -S\n{body}")  # -S: no site-packages, faster
    dest.chmod(0o755)
    return dest


@pytest.fixture(scope="session")
def fake_bins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fake-bin")
    return {
        "vllm": install_fake(FAKES / "fake_vllm.py", d / "fake-vllm"),
        "router": install_fake(FAKES / "fake_router.py", d / "fake-router"),
    }


# A stand-in `docker`/`podman` for processes rendered to run in a container: `container
# inspect` finds no earlier container; `run` execs the command after the image with only what
# a container gets: the variables passed by --env plus ``image_env`` (a Python dict
# expression evaluated inside the stand-in: the image's own PATH, LD_LIBRARY_PATH, ...).
CONTAINER_RUNTIME_STANDIN = """#!{python}
import os, sys
args = sys.argv[1:]
if args[:1] == ["container"]:
    sys.exit(1)  # no earlier container
assert args[0] == "run", args
VALUED = {{"--name", "--cidfile", "--label", "--shm-size", "--device", "-v", "--env", "-e",
          "--entrypoint"}}
env = {image_env}
entry = []
i = 1
while args[i].startswith("-"):
    if args[i] == "--entrypoint":
        entry = [args[i + 1]]
    if args[i] in VALUED:
        if args[i] in ("--env", "-e"):
            name, eq, val = args[i + 1].partition("=")
            if eq:
                env[name] = val
            elif name in os.environ:
                env[name] = os.environ[name]
        i += 2
    else:
        i += 1
argv = entry + args[i + 1:]
os.execvpe(argv[0], argv, env)
"""


def container_runtime_standin(image_env: str) -> str:
    """The stand-in's script text for this interpreter (see CONTAINER_RUNTIME_STANDIN)."""
    return CONTAINER_RUNTIME_STANDIN.format(python=sys.executable, image_env=image_env)
