"""Shared fixtures: each is defined in tests/support/ and imported here, so every test directory
sees the same one (one sshd cluster, one namespace cluster, one Slurm cluster per session).

* sshd (tests/support/sshd_fixtures.py, tests marked ``ssh``): ``sshd_cluster``, ``sshd_host``,
  ``sshd_hosts(n, fresh=False)``, ``ssh_client_config``, ``ssh_settings(h)``,
  ``ssh_connect(h, ...)``: real sshd "hosts" on loopback.
* network namespaces (tests/support/netns_fixtures.py, tests marked ``netns``):
  ``netns_cluster``, ``netns``.
* Slurm (tests/support/slurm_fixtures.py, tests marked ``slurm``): ``slurm_cluster``, a real
  two-node cluster; ``fake_slurm`` (tests/support/fake_slurm.py): stand-in Slurm commands.
* ``fake_bins`` (tests/support/fake_bins.py): the stand-in engine and router as executables
  (``{"vllm": path, "router": path}``), for the launch, runtime and Slurm tests.

Where the machine lacks what a fixture starts (OpenSSH's server, Slurm/MUNGE, root), the
fixture FAILS (not skips) with an install hint.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # make `tests.support` importable however pytest was started
    sys.path.insert(0, str(ROOT))

# `.venv/bin/python -m pytest` without activating the venv: rendered scripts and tests exec
# `vllm`, `vllm-router`, `pdlaunch` by name, as an activated node environment would.
_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

from tests.support.check_over_ssh import model_dir  # noqa: E402, F401 - fixture
from tests.support.fake_bins import fake_bins  # noqa: E402, F401 - fixture
from tests.support.fake_slurm import fake_slurm  # noqa: E402, F401 - fixture
from tests.support.netns_fixtures import netns, netns_cluster  # noqa: E402, F401 - fixtures
from tests.support.slurm_fixtures import slurm_cluster  # noqa: E402, F401 - fixture
from tests.support.sshd_fixtures import (  # noqa: E402, F401 - fixtures
    ssh_client_config,
    ssh_connect,
    ssh_settings,
    sshd_cluster,
    sshd_host,
    sshd_hosts,
)
