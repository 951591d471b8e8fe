"""Slurm's client commands, as the control host runs them: one command with a timeout
(``run_slurm``), node names and addresses (``scontrol``), partition limits (``sinfo``) and
a job's state over its het components (``squeue``, else ``sacct``)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from pdlaunch.backends.slurm.record import SlurmRunError

# Job states in which the job still holds (or waits for) its nodes.
ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)
GONE = "GONE"  # neither squeue nor sacct knows the job any more


# -- Slurm commands -------------------------------------------------------------------------------
def run_slurm(argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """One Slurm client command; a missing command or a hang is a SlurmRunError."""
    try:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError:
        raise SlurmRunError(
            f"{argv[0]} not found: install the Slurm client commands (Debian: slurm-client) "
            "on this host"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmRunError(f"{' '.join(argv)} did not answer within {timeout:g}s") from None


def slurm_output(argv: Sequence[str], timeout: float = 30.0) -> str:
    """Its stdout; a non-zero exit is a SlurmRunError saying why."""
    res = run_slurm(argv, timeout)
    if res.returncode != 0:
        why = res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}"
        raise SlurmRunError(f"{' '.join(argv)} failed: {why}")
    return res.stdout


def expand_hostlist(nodelist: str) -> list[str]:
    """``node[1-3],gpu7`` -> its node names, in Slurm's order (the driver's order too)."""
    if not nodelist or nodelist in ("(null)", "None assigned"):
        return []
    return slurm_output(["scontrol", "show", "hostnames", nodelist]).split()


def node_address(node: str) -> str:
    """The address Slurm reaches ``node`` at (NodeAddr; the name when it has none)."""
    text = slurm_output(["scontrol", "show", "node", "-o", node])
    for word in text.split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1] or node
    return node


def pyxis_loaded() -> bool:
    """Whether srun here offers pyxis's options: a SPANK plugin's options are listed under
    "Options provided by plugins:" in ``srun --help`` (Slurm src/common/spank.c,
    spank_print_options), and pyxis registers ``container-image`` (github.com/NVIDIA/pyxis,
    README "Usage"). Sites with pyxis should have no oci.conf (slurm.schedmd.com/
    containers.html, "Container support via Plugin"), so its absence means Slurm's own."""
    return "--container-image" in slurm_output(["srun", "--help"])


def partition_limits(partition: str | None = None) -> tuple[int | None, int | None]:
    """(GPUs, CPUs) per node of the partition's smallest node, from sinfo, for
    `SlurmOptions.gpus_per_node` / ``cpus_per_node``; None where sinfo does not say."""
    argv = ["sinfo", "-h", "-N", "-o", "%c|%G"]
    if partition:
        argv += ["-p", partition]
    gpus: list[int] = []
    cpus: list[int] = []
    for line in slurm_output(argv).splitlines():
        c, _, gres = line.partition("|")
        if c.strip().isdigit():
            cpus.append(int(c))
        gpus.append(gpus_in_gres(gres))
    return (min(gpus) if gpus else None), (min(cpus) if cpus else None)


def gpus_in_gres(gres: str) -> int:
    """``gpu:h100:8(S:0-1),shard:4`` -> 8: the GPU count in sinfo's %G."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


# -- the job --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobComponent:
    job_id: str  # "123+1" for a het component, "123" otherwise
    state: str
    nodes: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # RUNNING, PENDING, ... of every component alike, else the least advanced; GONE
    components: tuple[JobComponent, ...]
    source: str  # squeue | sacct | none
    detail: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def running(self) -> bool:
        return bool(self.components) and all(c.state == "RUNNING" for c in self.components)


def _offset(job_id: str) -> int:
    return int(job_id.split("+", 1)[1]) if "+" in job_id else 0


def _aggregate(states: list[str]) -> str:
    for s in ("PENDING", "CONFIGURING", "COMPLETING", "RUNNING"):
        if s in states:
            return s
    return states[0] if states else GONE


def job_info(job_id: str) -> JobInfo:
    """The job as squeue sees it (every het component), else as sacct remembers it."""
    res = run_slurm(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%N|%r"])
    comps = []
    if res.returncode == 0:
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 4:
                continue
            jid, state, nodes, reason = parts
            comps.append(JobComponent(jid, state, tuple(expand_hostlist(nodes)), reason))
    if comps:
        comps.sort(key=lambda c: _offset(c.job_id))
        return JobInfo(job_id, _aggregate([c.state for c in comps]), tuple(comps), "squeue")
    # squeue forgets a finished job after MinJobAge; accounting (if any) remembers it.
    acct = run_slurm(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,NodeList"])
    if acct.returncode == 0:
        for line in acct.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0].split("+")[0] == job_id:
                state = parts[1].split()[0] if parts[1] else "UNKNOWN"
                comps.append(JobComponent(parts[0], state, ()))
    if comps:
        comps.sort(key=lambda c: _offset(c.job_id))
        return JobInfo(job_id, _aggregate([c.state for c in comps]), tuple(comps), "sacct")
    why = (acct.stderr.strip() or "no record").splitlines()[0] if acct.returncode else "no record"
    return JobInfo(job_id, GONE, (), "none", f"unknown to squeue; sacct: {why}")
