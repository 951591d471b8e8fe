"""Issue 32, class 3, defence in depth: a job pdlaunch submitted stays cancellable by it.

`validate` refuses the sbatch options that rename or move the job (tests/spec/
test_sbatch_identity_options.py), but a line can still reach the job another way (a site's
job_submit plugin renames jobs; an option sbatch adds later). Before this change the job was
recorded as pdlaunch-<deployment> whatever squeue called it, and then the rollback and `down`
refused to cancel "a job that is not pdlaunch-...", and the scancel they suggested (by name)
could not match: the job leaked. Now the job is compared with what pdlaunch submitted right
after sbatch answers, and one that is not is cancelled by its id (squeue shows it running the
driver just submitted) and never recorded.

The stand-in Slurm (pdlaunch.testing.FakeSlurm) keeps the last of a repeated #SBATCH option,
as sbatch 22.05.8 does (tests/fixtures/slurm/sbatch-lines-22.05.8.txt)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm import jobs
from pdlaunch.plan.build import Plan
from pdlaunch.testing import FakeSlurm
from tests.support.slurm_specs import fake_spec, planned
from tests.support.sshd import free_ports

SECRET = "s3cr3t-" + os.urandom(4).hex()


def _plan(tmp_path: Path, fake_bins) -> Plan:
    ports = free_ports("prefill", "decode", "side", "router", "metrics")
    spec = fake_spec("ident", tmp_path / "work", ["n1", "n1"], fake_bins, ports)
    spec["prefill"][0]["env"]["HF_TOKEN"] = "${env:PDL_TEST_SECRET}"
    return planned(spec, tmp_path / "ident.yaml")[2]


def _driver(plan: Plan, extra_line: str | None = None) -> Path:
    """The job's files as `submit` writes them, with one more #SBATCH line after
    pdlaunch's own when given (as an option that reached the script would be)."""
    driver = jobs.write_job(
        plan, slurm.SlurmOptions(time="10"), {**os.environ, "PDL_TEST_SECRET": SECRET}
    )
    if extra_line is not None:
        # One component here: its last #SBATCH line is the script's last.
        lines = driver.read_text().splitlines(keepends=True)
        last = max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH "))
        lines.insert(last + 1, f"#SBATCH {extra_line}\n")
        driver.write_text("".join(lines))
    return driver


def test_a_renamed_job_is_cancelled_by_its_id_and_never_recorded(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, fake_bins)
    driver = _driver(plan, "--job-name=nightly")
    with pytest.raises(jobs.NotAsSubmitted) as err:
        jobs.sbatch(plan, driver)
    message = str(err.value)
    assert "'nightly'" in message and "'pdlaunch-ident'" in message and "cancelled" in message
    assert fake_slurm.jobs == {}  # gone from the controller
    assert ["scancel", "4242"] in fake_slurm.calls("scancel")  # by id: the name cannot match
    assert jobs.load_slurm("ident") is None
    secrets = [Path(p.secrets_path) for p in plan.processes if p.secret_env]
    assert secrets and not any(p.exists() for p in secrets)


def test_a_moved_job_is_cancelled_too(fake_slurm: FakeSlurm, fake_bins, tmp_path: Path) -> None:
    plan = _plan(tmp_path, fake_bins)
    with pytest.raises(jobs.NotAsSubmitted, match="in /tmp, not"):
        jobs.sbatch(plan, _driver(plan, "--chdir=/tmp"))
    assert fake_slurm.jobs == {} and jobs.load_slurm("ident") is None


def test_an_id_squeue_shows_running_another_script_is_never_cancelled(
    fake_slurm: FakeSlurm, fake_bins, tmp_path: Path
) -> None:
    """sbatch's answer names a job that squeue shows running someone else's script: that job
    is not ours to cancel, whatever the answer said."""
    plan = _plan(tmp_path, fake_bins)
    fake_slurm.add_job("77", name="other", workdir="/elsewhere", command="/other/job.sh")
    fake_slurm.update(sbatch={"answer": "77"})
    with pytest.raises(jobs.NotAsSubmitted, match="not cancelled"):
        jobs.sbatch(plan, _driver(plan))
    assert "77" in fake_slurm.jobs
    assert not [c for c in fake_slurm.calls("scancel") if c[-1] == "77" and len(c) == 2]
    assert jobs.load_slurm("ident") is None


def test_the_job_as_submitted_is_recorded(fake_slurm: FakeSlurm, fake_bins, tmp_path: Path) -> None:
    plan = _plan(tmp_path, fake_bins)
    driver = _driver(plan)
    assert jobs.sbatch(plan, driver) == "4242"
    rec = jobs.load_slurm("ident")
    assert rec is not None and rec.job_id == "4242"
    assert fake_slurm.jobs["4242"]["command"] == str(driver)
    assert any("%i|%j|%u|%Z|%o" in c for c in fake_slurm.calls("squeue"))
    assert jobs.not_ours(rec) is None  # `down` will cancel it
