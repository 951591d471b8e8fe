"""RDMA write bandwidth between a prefill host and a decode host (perftest ``ib_write_bw``;
only with ``--bandwidth``). The runner starts the server side on the decode host; this
probe is the client on the prefill host."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdlaunch.check.probes.base import (
    CommandOutput,
    Needs,
    Probe,
    ProbeContext,
    need,
    q,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.observe.bench_hops import IB_WRITE_BW_PROBE


def parse_ib_write_bw(text: str) -> dict[str, float] | None:
    """perftest report: the row under ``#bytes #iterations BW peak[...] BW average[...]``.

    Returns ``{"bytes", "peak_gbps", "avg_gbps"}``; MB/sec reports (no --report_gbits)
    are converted (x 8 / 1000).
    """
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "#bytes" in line and "BW average" in line:
            unit_mb = "MB/sec" in line
            for r in lines[i + 1 :]:
                parts = r.split()
                if len(parts) >= 4 and parts[0].isdigit():
                    peak, avg = float(parts[2]), float(parts[3])
                    if unit_mb:
                        peak, avg = peak * 8 / 1000, avg * 8 / 1000
                    return {"bytes": float(parts[0]), "peak_gbps": peak, "avg_gbps": avg}
            return None
    return None


def eval_ib_write_bw(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """Client side output; params: ``min_gbps`` (WARN below it; optional)."""
    bw = parse_ib_write_bw(out.stdout)
    if bw is None:
        if out.rc != 0:
            err = (out.stderr.strip() or out.stdout.strip()).splitlines()[-1:] or [""]
            return [
                row(
                    ctx,
                    Status.FAIL,
                    f"ib_write_bw failed (rc={out.rc}): {err[0][:160]}",
                    "check the server side started, the device/GID index and the firewall",
                )
            ]
        return [unparsed(ctx, "ib_write_bw", out)]
    minimum = ctx.params.get("min_gbps")
    msg = f"{bw['avg_gbps']:.2f} Gb/s average ({bw['peak_gbps']:.2f} peak)"
    if minimum is not None and bw["avg_gbps"] < float(minimum):
        return [
            row(
                ctx,
                Status.WARN,
                f"{msg} < expected {float(minimum):.0f} Gb/s",
                "check PCIe width, NUMA placement, MTU and the port rate",
                **bw,
            )
        ]
    return [row(ctx, Status.OK, msg, **bw)]


def _flags(params: Mapping[str, Any]) -> str:
    dev = params.get("device")
    gid = params.get("gid_index")
    return (f"-d {q(dev)} " if dev else "") + (f"-x {int(gid)} " if gid is not None else "")


def _cmd(params: Mapping[str, Any]) -> str:
    server = q(params["server"])
    return f"{need('ib_write_bw')}ib_write_bw {_flags(params)}-F -D 5 --report_gbits {server}"


def server_command(params: Mapping[str, Any], timeout_s: int = 45) -> str:
    """The other side of :data:`IB_WRITE_BW`, on the decode host: it serves one run on
    perftest's default port, then exits (``timeout`` ends it if no client comes)."""
    run = f"exec timeout {timeout_s} ib_write_bw {_flags(params)}-F -D 5 --report_gbits"
    return need("ib_write_bw") + run


IB_WRITE_BW = Probe(
    IB_WRITE_BW_PROBE,  # bench reads saved reports by it (observe/bench_hops.py)
    "RDMA write bandwidth",
    _cmd,
    eval_ib_write_bw,
    "ib_write_bw",
    tool="ib_write_bw",
    install="install perftest",
    needs=Needs(transports=frozenset({"rdma"})),
    scope="pair",
    timeout_s=60.0,
    fast=False,
    optional=True,
)

PROBES = (IB_WRITE_BW,)
