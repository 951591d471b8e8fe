"""The Slurm backend's record view: what the record store (pdlaunch.runtime.record_store)
asks, through pdlaunch.runtime.registry, about a record only Slurm understands: its working
view (:class:`~pdlaunch.backends.slurm.record.SlurmRecord`, checked on read), a format-1
``slurm.json``, what to do by hand, and where the job's processes run now."""

from __future__ import annotations

from pdlaunch.backends.slurm import jobs
from pdlaunch.backends.slurm.record import SlurmRecord, by_hand, from_slurm, to_slurm
from pdlaunch.runtime.record import Record

__all__ = ["by_hand", "from_native", "parse_legacy", "place", "to_native"]


def to_native(rec: Record) -> SlurmRecord:
    return to_slurm(rec)


def from_native(native: SlurmRecord, source: str = "") -> Record:
    return from_slurm(native, source=source)


def parse_legacy(text: str, deployment: str) -> SlurmRecord:
    """A format-1 ``slurm.json``."""
    return SlurmRecord.parse(text, deployment)


def place(rec: Record) -> Record:
    """``rec`` with each process where Slurm runs it now (asked from Slurm)."""
    srec = rec.native
    placed, state, detail = jobs.placement(srec)
    return from_slurm(srec, placed, state, detail, rec.source)
