"""The real slurmctld judges the jobs the Slurm backend renders (`sbatch --test-only`, which
queues nothing): it accepts the local-cpu job and a two-component het job, and refuses one
that asks for GPUs this cluster does not have. The scripts themselves:
tests/backends/test_slurm_batch_script.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm import jobs
from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import load
from tests.support.slurm_specs import REPO, fake_spec, planned

LOCAL = REPO / "topologies" / "local-cpu.yaml"
GB200 = REPO / "topologies" / "gb200-xpyd.yaml"
PORTS = {"prefill": 18100, "decode": 18200, "side": 15600, "router": 18123, "metrics": 19123}


def _plan(path: Path):
    return build_plan(load(path)[0])


def _bins(tmp_path: Path) -> dict[str, Path]:
    return {"vllm": tmp_path / "bin" / "vllm", "router": tmp_path / "bin" / "router"}


@pytest.mark.slurm
def test_sbatch_test_only_accepts_the_rendered_jobs(slurm_cluster, tmp_path: Path) -> None:
    before = set(slurm_cluster.jobs())
    msg = jobs.sbatch_test_only(_plan(LOCAL), slurm.SlurmOptions(), tmp_path / "local")
    assert "to start at" in msg and slurm_cluster.nodes[0] in msg
    spec = fake_spec("het", tmp_path / "w", slurm_cluster.nodes, _bins(tmp_path), PORTS)
    _, _, plan = planned(spec, tmp_path / "het.yaml")
    opts = slurm.SlurmOptions(nodelist=tuple(slurm_cluster.nodes), time="5")
    msg = jobs.sbatch_test_only(plan, opts, tmp_path / "het")
    assert "to start at" in msg
    assert set(slurm_cluster.jobs()) <= before  # --test-only queues nothing


@pytest.mark.slurm
def test_sbatch_test_only_refuses_what_the_cluster_cannot_give(slurm_cluster, tmp_path) -> None:
    """The same check fails for a job this cluster cannot run (GPUs it does not have)."""
    with pytest.raises(jobs.SlurmRunError, match="refused"):
        jobs.sbatch_test_only(_plan(GB200), slurm.SlurmOptions(), tmp_path / "gb200")
