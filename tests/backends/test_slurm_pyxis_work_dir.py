"""Issue 32, class 5: the Slurm job mounts each pyxis process's work dir into its container
(``--container-mounts=<work>:<work>,...``); pyxis splits that value at commas, so a work dir
holding one would become two mounts. The job is refused with the reason, not rendered."""

from __future__ import annotations

import pytest
import yaml

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import load_text

BASE = """
deployment: ctr
model: {name: /models/tiny, served_name: tiny, dtype: float32, max_model_len: 1024}
defaults:
  work_dir: /shared/pd
  container: {image: "nvcr.io#nvidia/vllm:25.09", runtime: pyxis, mounts: ["/models:/models"]}
prefill: [{host: n1, device: cpu, port: 8100, block_size: 32}]
decode: [{host: n1, device: cpu, port: 8200, block_size: 32}]
router: {host: n1, port: 8123, prometheus_port: 29123, container: {enabled: false}}
"""


def _plan(work_dir: str):
    data = yaml.safe_load(BASE)
    data["defaults"]["work_dir"] = work_dir
    return build_plan(load_text(yaml.safe_dump(data), "t.yaml")[0])


def test_a_work_dir_with_a_comma_is_refused_under_pyxis():
    with pytest.raises(slurm.SlurmError, match=r"comma.*two mounts"):
        slurm.render_job(_plan("/shared/a,/etc"), slurm.SlurmOptions())


def test_a_plain_work_dir_is_mounted_whole():
    plan = _plan("/shared/pd")
    job = {f.name: f.content for f in slurm.render_job(plan, slurm.SlurmOptions())}
    work = plan.by_role("prefill")[0].work_dir
    assert f"--container-mounts={work}:{work},/models:/models" in job[slurm.DRIVER_NAME]
