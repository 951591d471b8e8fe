"""Import paths from before the regrouping (issue 33) still import, as the module at its new
place, with a DeprecationWarning that names the new path (pdlaunch/moved.py)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from pdlaunch import moved


@pytest.mark.parametrize("old", sorted(moved.MODULES))
def test_an_old_module_path_is_the_new_module(old: str) -> None:
    new = importlib.import_module(moved.MODULES[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {moved.MODULES[old]}"):
        aliased = importlib.import_module(old)
    assert aliased is new


def test_old_names_of_modules_that_are_packages_now_forward_their_attributes() -> None:
    from pdlaunch.backends.k8s import manifests
    from pdlaunch.backends.slurm import job
    from pdlaunch.plan import build

    cases = [
        ("pdlaunch.plan", "build_plan", build.build_plan),
        ("pdlaunch.backends.slurm", "SlurmOptions", job.SlurmOptions),
        ("pdlaunch.backends.k8s", "build", manifests.build),
    ]
    for package, attr, expected in cases:
        with pytest.warns(DeprecationWarning, match=f"{package}.{attr} moved"):
            assert getattr(importlib.import_module(package), attr) is expected
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        importlib.import_module("pdlaunch.plan").nothing_here  # noqa: B018


def test_a_submodule_import_warns_nothing_and_loads_nothing_else() -> None:
    # `from pdlaunch.plan import ports` must not import the old module's code (build) first.
    code = (
        "import sys, warnings; warnings.simplefilter('error');"
        "from pdlaunch.plan import ports;"
        "assert 'pdlaunch.plan.build' not in sys.modules, 'build was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_docs_python_example_imports() -> None:
    # docs/slurm.md's example, as it was written before the move.
    code = (
        "from pdlaunch.load import load\n"
        "from pdlaunch.plan import build_plan\n"
        "from pdlaunch.backends import slurm, slurm_rules\n"
        "from pdlaunch.backends.slurm_client import partition_limits\n"
        "from pdlaunch.runtime.slurm import SlurmRuntime, jobs\n"
        "assert slurm.SlurmOptions and slurm_rules.slurm_placement and jobs.job_info\n"
    )
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
