"""NVIDIA GPUs: inventory and free memory (``nvidia-smi``), GPUDirect RDMA module (``lsmod``).

Run where a device kind's entry in devices.py names the family ``nvidia``."""

from __future__ import annotations

from pdlaunch.check.probes.accelerators import eval_accelerators, inventory_calls, parse_smi_csv
from pdlaunch.check.probes.base import (
    CommandOutput,
    Needs,
    Probe,
    ProbeContext,
    need,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status

FAMILY = "nvidia"


def eval_nvidia_smi(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    text = out.stdout + out.stderr
    if "couldn't communicate with the NVIDIA driver" in text:
        return [
            row(
                ctx,
                Status.FAIL,
                "nvidia-smi cannot talk to the NVIDIA driver",
                "load/reinstall the driver (dkms status, `modprobe nvidia`), reboot after "
                "a kernel update",
            )
        ]
    if "No devices were found" in text:
        return [
            row(
                ctx,
                Status.FAIL,
                "nvidia-smi: no devices were found",
                "check the GPUs are visible (lspci, container --gpus)",
            )
        ]
    devs = parse_smi_csv(out.stdout)
    if not devs:
        return [unparsed(ctx, "nvidia-smi", out)]
    return eval_accelerators("GPU", devs, ctx)


def parse_lsmod(text: str) -> set[str]:
    """``lsmod`` (with or without header, or grep-filtered): loaded module names."""
    mods = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1].isdigit():
            mods.add(parts[0])
    return mods


def eval_peermem(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """GPUDirect RDMA: ``nvidia_peermem`` (or legacy ``nv_peer_mem``) loaded."""
    mods = parse_lsmod(out.stdout)
    if not mods:
        return [unparsed(ctx, "lsmod", out)]
    for m in ("nvidia_peermem", "nv_peer_mem"):
        if m in mods:
            return [row(ctx, Status.OK, f"{m} loaded (GPUDirect RDMA)", module=m)]
    status = Status.FAIL if ctx.required else Status.WARN
    return [
        row(
            ctx,
            status,
            "neither nvidia_peermem nor nv_peer_mem is loaded: GPU memory cannot be "
            "registered with the HCA (no GPUDirect RDMA)",
            "sudo modprobe nvidia_peermem (and add it to /etc/modules-load.d/)",
            gdrdrv="gdrdrv" in mods,
        )
    ]


SMI = Probe(
    "nvidia.smi",
    "GPUs and free memory",
    need("nvidia-smi") + "nvidia-smi --query-gpu=index,name,memory.total,memory.free "
    "--format=csv,noheader,nounits",
    eval_nvidia_smi,
    "nvidia-smi",
    tool="nvidia-smi",
    install="install the NVIDIA driver",
    needs=Needs(device=True),
    calls=inventory_calls(FAMILY),
)
PEERMEM = Probe(
    "nvidia.peermem",
    "GPUDirect RDMA module",
    need("lsmod") + "lsmod",
    eval_peermem,
    "lsmod",
    tool="lsmod",
    install="install kmod",
    needs=Needs(device=True, transports=frozenset({"rdma"})),
)

PROBES = (SMI, PEERMEM)
