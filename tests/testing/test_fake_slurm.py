"""pdlaunch.testing.FakeSlurm through pdlaunch's own Slurm client (backends/slurm_client.py,
backends/slurm/jobs.py): what the client reads from it is what it reads from a real
controller for the same jobs (tests/system/slurm/ checks the client against a real slurmctld)."""

from __future__ import annotations

import os

import pytest

from pdlaunch.backends.slurm import client as slurm_client
from pdlaunch.backends.slurm.record import SlurmRunError
from pdlaunch.testing import FakeSlurm


@pytest.fixture
def slurm(tmp_path):
    fake = FakeSlurm.install(tmp_path / "slurm")
    with fake.activated():
        yield fake


def test_a_submitted_job_is_seen_and_cancelled_by_the_client(slurm, tmp_path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --job-name=pd-demo\n#SBATCH --chdir=/srv/pd\n")
    slurm.update(sbatch={"job_id": "77", "nodes": "n1,n2"})
    assert slurm_client.slurm_output(["sbatch", "--parsable", str(script)]).strip() == "77"
    assert slurm.jobs["77"]["name"] == "pd-demo" and slurm.jobs["77"]["workdir"] == "/srv/pd"

    info = slurm_client.job_info("77")
    assert info.running and info.source == "squeue"
    assert info.components[0].nodes == ("n1", "n2")

    slurm.set_state("77", "COMPLETING")
    assert slurm_client.job_info("77").state == "COMPLETING"
    # scancel with another job name leaves it (the client's guard against a reused id)
    slurm_client.run_slurm(["scancel", "--name=other", "77"])
    assert "77" in slurm.jobs
    slurm_client.run_slurm(["scancel", "--name=pd-demo", f"--user={slurm.user}", "77"])
    assert slurm.jobs == {}
    assert slurm_client.job_info("77").state == slurm_client.GONE
    assert len(slurm.calls("sbatch")) == 1 and len(slurm.calls("scancel")) == 2


def test_sbatch_refusing_the_job_is_the_clients_error(slurm, tmp_path) -> None:
    slurm.update(sbatch={"rc": 1, "stderr": "sbatch: error: invalid partition specified"})
    with pytest.raises(SlurmRunError, match="invalid partition specified"):
        slurm_client.slurm_output(["sbatch", str(tmp_path / "job.sh")])
    assert slurm.jobs == {} and len(slurm.calls("sbatch")) == 1


def test_activated_puts_the_environment_back(tmp_path) -> None:
    fake = FakeSlurm.install(tmp_path / "slurm")
    before = os.environ.get("PATH")
    with fake.activated():
        assert os.environ["PATH"].startswith(str(fake.bin_dir))
    assert os.environ.get("PATH") == before and "PDL_FAKE_SLURM_STATE" not in os.environ
