"""The Slurm record is data too (issue 32, class 2): a process name that is absolute or holds
``..`` used to pass the path check (the work dir joined with the name, compared as strings),
so `down` would delete a ``*.secrets.env`` and `logs` read a file outside the job's work dirs.
Refused when the record is read, naming the field; a record pdlaunch wrote still reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pdlaunch.backends.slurm import record as slurm_record
from pdlaunch.runtime import record_store
from pdlaunch.runtime.record import RecordError
from tests.support.slurm_specs import fake_spec, planned

PORTS = {"prefill": 18201, "decode": 18202, "side": 18203, "router": 18204, "metrics": 18205}


def _srec(tmp_path: Path, name: str) -> slurm_record.SlurmRecord:
    bins = {"vllm": Path("/opt/vllm/bin/vllm"), "router": Path("/opt/router/bin/vllm-router")}
    spec = fake_spec(name, tmp_path / "work", ["pd-a", "pd-b"], bins, PORTS)
    return slurm_record.record_of(planned(spec, tmp_path / f"{name}.yaml")[2], "31")


@pytest.mark.parametrize("escape", ["absolute", "dotdot"])
def test_a_slurm_process_name_never_leads_a_path_out(tmp_path: Path, escape: str) -> None:
    srec = _srec(tmp_path, "sl-names")
    p = srec.process("decode-0")
    assert p is not None
    name = str(tmp_path / "outside" / "evil") if escape == "absolute" else "../../outside/evil"
    p.name = name
    p.script_path = os.path.join(p.work_dir, f"{name}.sh")
    p.log_path = os.path.join(p.work_dir, "logs", f"{name}.log")
    p.secrets_path = os.path.join(p.work_dir, "run", f"{name}.secrets.env")
    slurm_record.save_slurm(srec)
    with pytest.raises(RecordError, match=r"processes\[\d+\]\.name .* not a name"):
        record_store.find("sl-names", place=False)


def test_a_slurm_record_pdlaunch_wrote_still_reads(tmp_path: Path) -> None:
    srec = _srec(tmp_path, "sl-fine")
    slurm_record.save_slurm(srec)
    rec = record_store.find("sl-fine", place=False)
    assert rec is not None and rec.native == srec
