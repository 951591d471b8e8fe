"""A Slurm job recorded by the pdlaunch before format 2 (``slurm.json``, format 1) is found,
status'd and cancelled by this one, against the test cluster (tests/slurm/conftest.py).

The record is tests/fixtures/record/slurm-format1.json.tmpl, as the old `sbatch` record
writer wrote it (see its README), with this run's work dir, ports and job id put in."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm import jobs
from pdlaunch.runtime import record_store
from pdlaunch.runtime.state import deployment_dir
from tests.support import slurm_lifecycle as slurm_rt
from tests.support.slurm_specs import REPO, fake_spec, planned
from tests.support.sshd import free_ports

pytestmark = pytest.mark.slurm

TEMPLATE = Path(__file__).resolve().parents[2] / "fixtures" / "record" / "slurm-format1.json.tmpl"
NAME = "legacy-slurm"  # the fixture's deployment


def _pdl(*args: object) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "pdlaunch", *map(str, args)],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    assert "Traceback" not in res.stdout + res.stderr, res
    return res


def test_a_format_1_slurm_job_is_found_statused_and_cancelled(
    slurm_cluster, fake_bins, tmp_path: Path
) -> None:
    ports = free_ports("prefill", "decode", "side", "router", "metrics")
    work = tmp_path / "work"
    spec = fake_spec(NAME, work, ["pd-a", "pd-b"], fake_bins, ports)
    _, _, plan = planned(spec, tmp_path / "legacy.yaml")
    up = slurm_rt.up(plan, slurm.SlurmOptions(time="10", start_timeout=120), timeout=120,
                     canary=False)  # fmt: skip
    try:
        assert up.ok, f"{up.message}\n{up.logs}"
        # What the old pdlaunch would have left for this job: slurm.json only.
        values = {"@WORK@": str(work), "@JOB@": str(up.job_id)}
        values |= {f"@PORT:{k}@": str(v) for k, v in ports.items()}
        old = re.sub(r"@[A-Za-z0-9_:.-]+@", lambda m: values[m.group(0)], TEMPLATE.read_text())
        assert json.loads(old)["format"] == 1
        (deployment_dir(NAME) / "record.json").unlink()
        legacy = deployment_dir(NAME) / "slurm.json"
        legacy.write_text(old)

        res = _pdl("status", NAME, "--json")  # no --backend: the old file says Slurm
        assert res.returncode == 0, res
        data = json.loads(res.stdout)
        assert data["backend"] == "slurm" and data["job"]["id"] == up.job_id
        assert data["job"]["state"] == "RUNNING" and data["healthy"] is True, data
        nodes = {r["process"]: r["host"] for r in data["processes"]}
        assert {nodes["prefill-0"], nodes["decode-0"]} == set(slurm_cluster.nodes), nodes
        assert legacy.read_text() == old  # reading changes nothing

        res = _pdl("down", NAME, "--json")
        assert res.returncode == 0, res
        assert json.loads(res.stdout)["job_id"] == up.job_id
        assert not jobs.job_info(up.job_id).active
        assert not legacy.exists() and record_store.list_deployments() == []
    finally:
        if record_store.list_deployments():
            slurm_rt.down(NAME)
