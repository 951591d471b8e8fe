"""RDMA ports: one judgement over three sources (sysfs, ``ibv_devinfo``, ``rdma link``).

The sysfs probe is the primary (no tool to install); the other two are alternatives that
report the same facts. Formats: ``tests/fixtures/check/SOURCES.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Needs,
    Probe,
    ProbeContext,
    need,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status

if TYPE_CHECKING:
    from pdlaunch.plan.build import Process


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    state: str  # ACTIVE / DOWN / INIT / ARMED / ACTIVE_DEFER / NOP / UNKNOWN
    phys_state: str | None = None  # LINK_UP / DISABLED / POLLING / ... (None: not reported)
    link_layer: str | None = None  # InfiniBand / Ethernet (None: not reported)
    netdev: str | None = None

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"


# kernel drivers/infiniband/core/sysfs.c phys_state_to_str() and ib_port_phys_state
_PHYS_BY_CODE = {
    1: "SLEEP",
    2: "POLLING",
    3: "DISABLED",
    4: "PORT_CONFIGURATION_TRAINING",
    5: "LINK_UP",
    6: "LINK_ERROR_RECOVERY",
    7: "PHY_TEST",
}
_STATE_BY_CODE = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}


def _norm_state(text: str) -> str:
    t = text.strip()
    m = re.match(r"^(\d+):\s*(\S+)", t)  # sysfs "4: ACTIVE"
    if m:
        return _STATE_BY_CODE.get(int(m.group(1)), m.group(2).upper())
    m = re.match(r"^(\S+)\s*\((\d+)\)", t)  # ibv_devinfo "PORT_ACTIVE (4)"
    if m:
        return _STATE_BY_CODE.get(int(m.group(2)), m.group(1).upper())
    word = t.split()[0].upper() if t else "UNKNOWN"
    return word.removeprefix("PORT_")


def _norm_phys(text: str) -> str:
    t = text.strip()
    m = re.match(r"^(\d+):", t) or re.search(r"\((\d+)\)\s*$", t)
    if m and int(m.group(1)) in _PHYS_BY_CODE:
        return _PHYS_BY_CODE[int(m.group(1))]
    word = re.sub(r"\(.*\)", "", t).strip()
    # "LinkUp" -> "LINK_UP", "Phy Test" -> "PHY_TEST", "LINK_UP" stays
    word = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", word).replace(" ", "_").upper()
    return word or "UNKNOWN"


def _norm_link_layer(text: str) -> str:
    t = text.strip()
    low = t.lower()
    if low in ("ib", "infiniband"):
        return "InfiniBand"
    if low in ("eth", "ethernet"):
        return "Ethernet"
    return t


def parse_ibv_devinfo(text: str) -> list[RdmaPort]:
    """``ibv_devinfo`` (optionally ``-v``/``-vv``): one RdmaPort per ``port:`` block."""
    ports: list[RdmaPort] = []
    dev: str | None = None
    cur: dict[str, Any] | None = None

    def flush() -> None:
        if cur is not None and dev is not None and "state" in cur:
            ports.append(
                RdmaPort(
                    dev,
                    cur["port"],
                    _norm_state(cur["state"]),
                    _norm_phys(cur["phys_state"]) if "phys_state" in cur else None,
                    _norm_link_layer(cur["link_layer"]) if "link_layer" in cur else None,
                )
            )

    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"^hca_id:\s*(\S+)", line)
        if m:
            flush()
            dev, cur = m.group(1), None
            continue
        m = re.match(r"^port:\s*(\d+)$", line)
        if m:
            flush()
            cur = {"port": int(m.group(1))}
            continue
        if cur is None:
            continue
        m = re.match(r"^(state|phys_state|link_layer):\s*(.+)$", line)
        if m:
            cur[m.group(1)] = m.group(2)
    flush()
    return ports


_SYSFS_RE = re.compile(
    r"^/sys/class/infiniband/(?P<dev>[^/]+)/ports/(?P<port>\d+)/"
    r"(?P<attr>state|phys_state|link_layer):(?P<val>.*)$"
)


def parse_sysfs_ports(text: str) -> list[RdmaPort]:
    """``grep -H . /sys/class/infiniband/*/ports/*/{state,phys_state,link_layer}``."""
    acc: dict[tuple[str, int], dict[str, str]] = {}
    for line in text.splitlines():
        m = _SYSFS_RE.match(line.strip())
        if m:
            acc.setdefault((m["dev"], int(m["port"])), {})[m["attr"]] = m["val"]
    ports = []
    for (dev, port), attrs in sorted(acc.items()):
        ports.append(
            RdmaPort(
                dev,
                port,
                _norm_state(attrs["state"]) if "state" in attrs else "UNKNOWN",
                _norm_phys(attrs["phys_state"]) if "phys_state" in attrs else None,
                _norm_link_layer(attrs["link_layer"]) if "link_layer" in attrs else None,
            )
        )
    return ports


_RDMA_LINK_RE = re.compile(r"^link\s+(?P<dev>[^/\s]+)/(?P<port>\d+)\s+(?P<rest>.*)$")


def parse_rdma_link(text: str) -> list[RdmaPort]:
    """iproute2 ``rdma link [show]``: ``link DEV/PORT ... state S physical_state P [netdev N]``."""
    ports = []
    for line in text.splitlines():
        m = _RDMA_LINK_RE.match(line.strip())
        if not m:
            continue
        rest = m["rest"]
        st = re.search(r"\bstate\s+(\S+)", rest)
        ph = re.search(r"\bphysical_state\s+(\S+)", rest)
        nd = re.search(r"\bnetdev\s+(\S+)", rest)
        ports.append(
            RdmaPort(
                m["dev"],
                int(m["port"]),
                st.group(1).upper() if st else "UNKNOWN",
                ph.group(1).upper() if ph else None,
                # IB ports carry lid/sm_lid, RoCE ports a netdev; the tool prints no link layer
                None,
                nd.group(1) if nd else None,
            )
        )
    return ports


def _wanted(devices: Sequence[str] | None) -> set[tuple[str, int | None]] | None:
    if not devices:
        return None
    out: set[tuple[str, int | None]] = set()
    for d in devices:
        name, _, port = str(d).partition(":")
        out.add((name, int(port) if port else None))
    return out


def eval_rdma_ports(ports: list[RdmaPort], ctx: ProbeContext) -> list[CheckResult]:
    """Judge RDMA ports.

    params: ``devices`` (list like ``["mlx5_0", "mlx5_1:1"]``, the HCAs the plan
    uses; default: all), ``link_layer`` (``"InfiniBand"``/``"Ethernet"``, optional).
    """
    want = _wanted(ctx.params.get("devices"))
    layer = ctx.params.get("link_layer")
    layer = _norm_link_layer(layer) if layer else None
    results: list[CheckResult] = []
    fix_down = (
        "check cable/switch port and subnet manager (IB) or netdev link (RoCE); "
        "`ibstat`, `rdma link`, `ip link`"
    )
    if not ports:
        if ctx.required:
            return [
                row(
                    ctx,
                    Status.FAIL,
                    "no RDMA devices found",
                    "load the HCA driver (mlx5_ib) / install rdma-core, or plan TCP transports",
                )
            ]
        return [row(ctx, Status.SKIP, "no RDMA devices (not needed by the plan here)")]

    selected = ports
    if want is not None:
        selected = [p for p in ports if (p.device, p.port) in want or (p.device, None) in want]
        for name, port in sorted(want, key=lambda w: (w[0], w[1] or 0)):
            if not any(p.device == name and (port is None or p.port == port) for p in ports):
                label = f"{name}:{port}" if port else name
                results.append(
                    row(
                        ctx,
                        Status.FAIL,
                        f"planned RDMA device {label} not present",
                        f"fix UCX_NET_DEVICES / the plan's device list; present: "
                        f"{', '.join(sorted({p.name for p in ports}))}",
                    )
                )

    any_active = False
    for p in selected:
        phys_ok = p.phys_state in (None, "LINK_UP")
        data = {
            "device": p.device,
            "port": p.port,
            "state": p.state,
            "phys_state": p.phys_state,
            "link_layer": p.link_layer,
        }
        desc = (
            f"{p.name} state {p.state}"
            + (f", phys {p.phys_state}" if p.phys_state else "")
            + (f", {p.link_layer}" if p.link_layer else "")
        )
        if p.state == "ACTIVE" and phys_ok:
            any_active = True
            if layer and p.link_layer and p.link_layer != layer:
                results.append(
                    row(
                        ctx,
                        Status.FAIL,
                        f"{desc}: expected link layer {layer}",
                        "the plan's fabric does not match this port (IB vs RoCE); "
                        "fix the topology or the device list",
                        **data,
                    )
                )
            else:
                results.append(row(ctx, Status.OK, desc, **data))
        else:
            # a down port the plan explicitly uses is fatal; an unused one is a warning
            status = Status.FAIL if want is not None else Status.WARN
            results.append(row(ctx, status, desc, fix_down, **data))
    if want is None and not any_active:
        results.append(row(ctx, Status.FAIL, "no RDMA port is ACTIVE/LinkUp", fix_down))
    return results


def eval_rdma_sysfs(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    ports = parse_sysfs_ports(out.stdout)
    if not ports and out.rc != 0 and "No such file" not in out.stderr:
        return [unparsed(ctx, "sysfs", out)]
    return eval_rdma_ports(ports, ctx)


def eval_ibv_devinfo(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    ports = parse_ibv_devinfo(out.stdout)
    if not ports and "No IB devices found" not in (out.stdout + out.stderr) and out.stdout.strip():
        return [unparsed(ctx, "ibv_devinfo", out)]
    return eval_rdma_ports(ports, ctx)


def eval_rdma_link(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    ports = parse_rdma_link(out.stdout)
    if not ports and out.rc != 0:
        if "NETLINK_RDMA" in out.stderr:
            # kernel without the RDMA netlink family: no RDMA stack at all
            return eval_rdma_ports([], ctx)
        return [unparsed(ctx, "rdma link", out)]
    return eval_rdma_ports(ports, ctx)


# ------------------------------------------------------------------- plan -> params


def planned_hcas(processes: Iterable[Process]) -> list[str]:
    """HCAs (``mlx5_0`` or ``mlx5_0:1``) the processes' UCX is told to use, in plan order."""
    out: list[str] = []
    for proc in processes:
        for d in (proc.ucx_net_devices or "").split(","):
            d = d.strip()
            if d and d != "all" and d not in out:
                out.append(d)
    return out


def _calls(facts: HostFacts) -> list[Call]:
    devs = planned_hcas(facts.engines)
    return [Call({"devices": devs} if devs else {})]


# ---------------------------------------------------------------------------- probes

_RDMA = Needs(transports=frozenset({"rdma"}))

SYSFS = Probe(
    "rdma.sysfs",
    "RDMA ports (sysfs)",
    "grep -H . /sys/class/infiniband/*/ports/*/state "
    "/sys/class/infiniband/*/ports/*/phys_state "
    "/sys/class/infiniband/*/ports/*/link_layer",
    eval_rdma_sysfs,
    "sysfs",
    needs=_RDMA,
    calls=_calls,
)
IBV_DEVINFO = Probe(
    "rdma.ibv_devinfo",
    "RDMA ports (ibv_devinfo)",
    need("ibv_devinfo") + "ibv_devinfo -v",
    eval_ibv_devinfo,
    "ibv_devinfo",
    tool="ibv_devinfo",
    install="install rdma-core (ibverbs-utils / libibverbs-utils)",
    needs=_RDMA,
    alternative_to=SYSFS,
    calls=_calls,
)
LINK = Probe(
    "rdma.link",
    "RDMA ports (rdma link)",
    need("rdma") + "rdma link show",
    eval_rdma_link,
    "rdma link",
    tool="rdma (iproute2)",
    install="install iproute2",
    needs=_RDMA,
    alternative_to=SYSFS,
    calls=_calls,
)

PROBES = (SYSFS, IBV_DEVINFO, LINK)
