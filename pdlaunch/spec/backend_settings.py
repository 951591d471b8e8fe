"""Backend settings in one place: the topology's ``slurm:`` block and ``--backend-config
FILE`` (a YAML file with the same ``slurm:`` block), the keys those of the Slurm flags
(``--sbatch-opt`` is ``sbatch_opt``, ``--time`` is ``time``...). Precedence, lowest first: the
topology's block, the file, the flags typed (``sbatch_opt`` adds to the lists before it:
sbatch keeps the last of a repeated option, so a flag still wins).

Each value is checked here, as the schema reads it, with the messages `SlurmOptions` gives
the flags, so a bad value is named with its file, line and key.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from pdlaunch.spec.slurm_options import SlurmError, SlurmOptions

# SlurmOptions' keyword for each checked key (their own messages name the problem).
_CHECKED = {
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "time": "time",
    "mem": "mem",
    "sbatch_opt": "extra_sbatch",
}


class SlurmSettings(BaseModel):
    """What `--backend slurm` submits with: the same settings as its flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = Field(None, description="Partition to submit to (--partition)")
    nodelist: str | list[str] | None = Field(
        None,
        description="Nodes the job may use: node,node or node[1-4], or a list (--nodelist)",
    )
    account: str | None = Field(None, description="Account to charge (--account)")
    qos: str | None = Field(None, description="Quality of service (--qos)")
    time: str | int | None = Field(
        None, description="Time limit: minutes, HH:MM:SS, D-HH:MM:SS or UNLIMITED (--time)"
    )
    exclusive: bool | None = Field(None, description="Share no node with other jobs")
    mem: str | int | None = Field(None, description="Memory per node, e.g. 64G (--mem)")
    sbatch_opt: list[str] = Field(
        default_factory=list,
        description="More sbatch options, --name=value, for every component (--sbatch-opt)",
    )
    start_timeout: int | None = Field(
        None, ge=1, description="Seconds the job waits for each process's health"
    )
    gpus_per_node: int | None = Field(
        None, ge=1, description="GPUs per node the partition offers (default: from sinfo)"
    )
    cpus_per_node: int | None = Field(
        None, ge=1, description="CPU cores per node the partition offers (default: from sinfo)"
    )
    container_support: Literal["pyxis", "oci", "auto"] | None = Field(
        None,
        description="How a step runs in its instance's container: pyxis (srun "
        "--container-image, the default), oci (Slurm's own: srun --container=BUNDLE, "
        "bundles from oci_bundles), auto (pyxis where srun offers it, else oci)",
    )
    oci_bundles: dict[str, str] | None = Field(
        None,
        description="Under container_support oci: each image the topology names -> the "
        "absolute path of its OCI bundle directory on storage every node sees",
    )

    @field_validator("oci_bundles", mode="after")
    @classmethod
    def _bundles(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v:
            try:
                SlurmOptions(oci_bundles=v)
            except SlurmError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("time", "mem", mode="after")
    @classmethod
    def _as_text(cls, v: str | int | None) -> str | None:
        return None if v is None else str(v)  # `time: 30` is 30 minutes, `mem: 0` all of it

    @field_validator(*_CHECKED, mode="after")
    @classmethod
    def _sbatch_value(cls, v: Any, info: ValidationInfo) -> Any:
        if v is None or v == []:
            return v
        value = tuple(v) if isinstance(v, list) else str(v)
        try:
            SlurmOptions(**{_CHECKED[info.field_name or ""]: value})
        except SlurmError as exc:
            raise ValueError(str(exc)) from None
        return v

    def given(self) -> dict[str, Any]:
        """The keys set (a key left out takes the next source's value)."""
        return {k: v for k, v in self.model_dump(exclude_unset=True).items() if v is not None}


class BackendConfig(BaseModel):
    """A `--backend-config` file: the backends' blocks, as in a topology."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="pdlaunch backend config")

    slurm: SlurmSettings | None = None


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``layers`` (lowest precedence first); ``sbatch_opt`` lists add up."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "sbatch_opt":
                out[key] = [*out.get(key, []), *value]
            elif value is not None:
                out[key] = value
    return out
