"""What the user says about a Slurm cluster (``--backend slurm``'s flags, the topology's
``slurm:`` block, ``--backend-config``), each value checked as sbatch will read it. Data the
schema (:mod:`.backend_settings`) and the Slurm backend (:mod:`pdlaunch.backends.slurm`)
share, so both name a bad value the same way: the schema with its file and line, the backend
for flags typed on the command line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pdlaunch.spec import slurm_args

# What may appear in an `#SBATCH` line: sbatch splits those lines itself (no shell), so a
# space, quote or newline in a value would change the options, not only their value.
SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.,:=@%+/\[\]-]+")
# sbatch's --time forms (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) and --mem's
# (a number, default unit MB, or K/M/G/T): checked here so a typo fails at render, not at
# submit on the cluster.
_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
_MEM = re.compile(r"\d+[KMGT]?", re.IGNORECASE)


# How a step whose instance has a `container:` (runtime pyxis) runs in it: pyxis's SPANK plugin
# (srun --container-image=IMAGE, github.com/NVIDIA/pyxis), or Slurm's own OCI support (srun
# --container=BUNDLE, Slurm 21.08+, slurm.schedmd.com/containers.html "Requesting container
# jobs or steps"), which runs an OCI bundle directory already on the node, never an image
# name; "auto": pyxis where srun offers its flags, else Slurm's own (docs/slurm-containers.md).
CONTAINER_SUPPORT = ("pyxis", "oci", "auto")
# An OCI bundle path goes on an srun line of the driver (quoted there): absolute, and no
# character that a site's oci.conf pattern (%b, handed to a shell by some RunTimeRun
# wrappers) could read as more than a path.
_BUNDLE = re.compile(r"/[A-Za-z0-9_.,:=@+/-]*")


class SlurmError(ValueError):
    """A Slurm option or plan this backend cannot turn into a job; the message is for users."""


@dataclass(frozen=True)
class SlurmOptions:
    """What the user says about the cluster (none of it is in the topology).

    ``nodelist``: the nodes the job may use (``--nodelist`` per component, each component
    given its own topology hosts); None lets Slurm pick. ``role_partitions``: a partition per
    role (a component holding both roles uses ``partition``). ``gpus_per_node`` /
    ``cpus_per_node``: what the partition offers, when known (the rules compare the plan with
    it; `slurm_client.partition_limits` reads it from ``sinfo``). ``gres``: the GRES name per
    non-CUDA accelerator kind (Gaudi and Ascend sites name theirs). ``start_timeout``: seconds
    the driver waits for each process's health before it ends the job.
    """

    partition: str | None = None
    role_partitions: Mapping[str, str] = field(default_factory=dict)
    nodelist: tuple[str, ...] | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    exclusive: bool = False
    mem: str | None = None
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    gres: Mapping[str, str] = field(default_factory=lambda: {"hpu": "hpu", "npu": "npu"})
    extra_sbatch: tuple[str, ...] = ()
    start_timeout: int = 1800
    # CONTAINER_SUPPORT; oci_bundles: image (as the topology names it) -> the absolute path
    # of its OCI bundle (config.json + rootfs) on storage every node sees.
    container_support: str = "pyxis"
    oci_bundles: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        named = {
            "partition": self.partition,
            "account": self.account,
            "qos": self.qos,
            "time": self.time,
            "mem": self.mem,
            **{f"role_partitions.{k}": v for k, v in self.role_partitions.items()},
            **{f"gres.{k}": v for k, v in self.gres.items()},
            **{f"nodelist[{i}]": n for i, n in enumerate(self.nodelist or ())},
        }
        for what, value in named.items():
            if value is not None and not SBATCH_VALUE.fullmatch(value):
                raise SlurmError(
                    f"slurm {what} {value!r}: use letters, digits and _.,:=@%+/[]- only "
                    "(it goes into an #SBATCH line, which sbatch splits itself)"
                )
        # Identity first: `-J x` is then refused for what it does, not for its spelling.
        why = slurm_args.sbatch_refusal(self.extra_sbatch)
        if why:
            raise SlurmError(why)
        for opt in self.extra_sbatch:
            if not opt.startswith("--") or not SBATCH_VALUE.fullmatch(opt):
                raise SlurmError(
                    f"extra sbatch option {opt!r}: give one --option[=value] without spaces "
                    "or quotes"
                )
        if self.time is not None and not _TIME.fullmatch(self.time):
            raise SlurmError(
                f"slurm time {self.time!r}: give minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                "D-HH:MM:SS or UNLIMITED (sbatch --time)"
            )
        if self.mem is not None and not _MEM.fullmatch(self.mem):
            raise SlurmError(
                f"slurm mem {self.mem!r}: give a size per node such as 64G, 500M or 0 (all of "
                "the node's memory; sbatch --mem)"
            )
        if self.nodelist is not None and not self.nodelist:
            raise SlurmError("slurm nodelist is empty: give at least one node, or none at all")
        for what, n in (
            ("cpus_per_task", self.cpus_per_task),
            ("gpus_per_node", self.gpus_per_node),
            ("cpus_per_node", self.cpus_per_node),
        ):
            if n is not None and n < 1:
                raise SlurmError(f"slurm {what} must be at least 1, not {n}")
        if self.start_timeout < 1:
            raise SlurmError(f"slurm start_timeout must be at least 1 s, not {self.start_timeout}")
        self._check_containers()

    def _check_containers(self) -> None:
        if self.container_support not in CONTAINER_SUPPORT:
            raise SlurmError(
                f"slurm container_support {self.container_support!r}: give "
                f"{', '.join(CONTAINER_SUPPORT)}"
            )
        for image, bundle in self.oci_bundles.items():
            if not _BUNDLE.fullmatch(bundle) or "/../" in f"{bundle}/":
                raise SlurmError(
                    f"slurm oci_bundles[{image!r}] {bundle!r}: give the absolute path of the OCI "
                    "bundle directory (config.json + rootfs) on storage every node sees, of "
                    "letters, digits and _.,:=@+/- without '..' (srun --container=PATH)"
                )
