"""Huawei Ascend NPUs: health and HBM (``npu-smi info``), the NPU NICs' config and link
(``/etc/hccn.conf``, ``hccn_tool -link/-link_stat/-ip/-tls``), TLS off on every NPU, and
prefill NPU -> decode NPU pings (part of `up`'s preflight). Run where a device kind's entry
in devices.py names ``ascend``."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pdlaunch.check.probes.accelerators import Accel, eval_accelerators, inventory_calls
from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Needs,
    Probe,
    ProbeContext,
    ints,
    need,
    parse_sections,
    q,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status

if TYPE_CHECKING:
    from pdlaunch.plan.build import Process

FAMILY = "ascend"
_PATH = "PATH=$PATH:/usr/local/Ascend/driver/tools:/usr/local/bin"
_TOOLS = "install the Ascend driver tools"

# ============================================================================ npu-smi


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


def eval_npu_smi(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``need``, ``devices`` (optional indices), ``min_free_fraction``."""
    npus = parse_npu_smi_info(out.stdout)
    if not npus:
        return [unparsed(ctx, "npu-smi info", out)]
    results = []
    for n in npus:
        if n.health.upper() != "OK":
            status = Status.WARN if n.health.lower() == "warning" else Status.FAIL
            results.append(
                row(
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
    return eval_accelerators("NPU", devs, ctx) + results


# ========================================================================= hccn_tool


def parse_hccn_link(text: str) -> str | None:
    m = re.search(r"link status:\s*(\S+)", text, re.IGNORECASE)
    return m.group(1).upper() if m else None


def _npu_key(key: str) -> int | None:
    m = re.match(r"^npu\s+(\d+)", key)
    return int(m.group(1)) if m else None


def eval_hccn_link(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    results = []
    for key, body in parse_sections(out.stdout).items():
        npu = _npu_key(key)
        st = parse_hccn_link(body)
        if npu is None or st is None:
            results.append(unparsed(ctx, f"hccn_tool -link ({key})", CommandOutput(out.rc, body)))
        elif st == "UP":
            results.append(row(ctx, Status.OK, f"NPU {npu} link UP", npu=npu))
        else:
            results.append(
                row(
                    ctx,
                    Status.FAIL,
                    f"NPU {npu} link {st}",
                    "check the NPU's optical module/cable and switch port "
                    "(`hccn_tool -i N -optical -g`, `-link_stat -g`)",
                    npu=npu,
                )
            )
    return results or [unparsed(ctx, "hccn_tool -link", out)]


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


def eval_hccn_ip(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``expected`` ({npu: ip}, e.g. from /etc/hccn.conf or the plan; optional)."""
    expected = {int(k): v for k, v in (ctx.params.get("expected") or {}).items()}
    results = []
    for key, body in parse_sections(out.stdout).items():
        npu = _npu_key(key)
        ip, mask = parse_hccn_ip(body)
        if npu is None:
            continue
        if ip is None:
            results.append(
                row(
                    ctx,
                    Status.FAIL,
                    f"NPU {npu} has no device IP",
                    "configure it: hccn_tool -i N -ip -s address IP netmask MASK",
                    npu=npu,
                )
            )
        elif not _valid_ip(ip):
            results.append(unparsed(ctx, f"hccn_tool -ip (npu {npu})", CommandOutput(out.rc, body)))
        elif npu in expected and expected[npu] != ip:
            results.append(
                row(
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
                row(ctx, Status.OK, f"NPU {npu} ip {ip}/{mask}", npu=npu, ip=ip, netmask=mask)
            )
    return results or [unparsed(ctx, "hccn_tool -ip", out)]


_STAT_KV = re.compile(r"^\[devid (\d+)\]\s*([a-z ]+?)\s*:\s*(.*)$")
_STAT_REC = re.compile(r"^\[devid \d+\]\s+(\w{3} \w{3}\s+\d+ [\d:]{8} \d{4})\s+LINK (UP|DOWN)\s*$")
FLAP_WINDOW_S = 24 * 3600


def _hccn_time(text: str) -> datetime:
    # `Sun Oct  5 10:13:51 2025`: C's asctime, the day padded with a space
    return datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")


def parse_hccn_link_stat(text: str) -> dict[str, Any]:
    """``hccn_tool -i N -link_stat -g``::

        [devid 0]current time        : Tue Oct 28 21:46:46 2025
        [devid 0]link up count       : 2
        [devid 0]link down count     : 1
        [devid 0]link change records :
        [devid 0]    Sun Oct  5 10:13:51 2025    LINK UP
        [devid 0]    Sun Oct  5 10:13:50 2025    LINK DOWN

    (the HCCL troubleshooting guide's ERROR CQE section; MindCluster's GetNPULinkUpNum reads
    the same ``link up count`` line). -> ``{now, up, down, downs: [times of LINK DOWN]}``."""
    out: dict[str, Any] = {"now": None, "up": None, "down": None, "downs": []}
    for line in text.splitlines():
        rec = _STAT_REC.match(line.rstrip())
        if rec:
            if rec.group(2) == "DOWN":
                out["downs"].append(_hccn_time(rec.group(1)))
            continue
        kv = _STAT_KV.match(line.rstrip())
        if not kv:
            continue
        key, value = kv.group(2), kv.group(3).strip()
        if key == "current time":
            out["now"] = _hccn_time(value)
        elif key in ("link up count", "link down count"):
            out[key.split()[1]] = int(value)
    return out


def eval_hccn_link_stat(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """A LINK DOWN record within a day of the tool's own clock: the link flaps (the Ascend
    guide: "it's normal if there's no flapping"); older ones are reported, not failed."""
    results = []
    fix = (
        "check the NPU's optical module/cable and switch port (`hccn_tool -i N -optical -g`), "
        "then watch `hccn_tool -i N -link_stat -g` for new LINK DOWN records: a flap during a "
        "transfer surfaces as HCCL ERROR CQE"
    )
    for key, body in parse_sections(out.stdout).items():
        npu, st = _npu_key(key), parse_hccn_link_stat(body)
        if npu is None or st["up"] is None:
            results.append(unparsed(ctx, f"hccn_tool -link_stat ({key})", CommandOutput(0, body)))
            continue
        downs = sorted(st["downs"])
        n_down = max(st["down"] or 0, len(downs))
        recent = [
            t for t in downs if st["now"] and (st["now"] - t).total_seconds() <= FLAP_WINDOW_S
        ]
        data = {"npu": npu, "up": st["up"], "down": n_down}
        if recent:
            msg = (
                f"NPU {npu} link flapped: {len(recent)} LINK DOWN in the last 24 h "
                f"(last {recent[-1]})"
            )
            results.append(row(ctx, Status.FAIL, msg, fix, **data))
        elif n_down:
            last = f" (last {downs[-1]})" if downs else ""
            msg = f"NPU {npu} link went down {n_down} time(s) earlier{last}; none in the last 24 h"
            results.append(row(ctx, Status.WARN, msg, fix, **data))
        else:
            results.append(row(ctx, Status.OK, f"NPU {npu} link stable (no LINK DOWN)", **data))
    return results or [unparsed(ctx, "hccn_tool -link_stat", out)]


def parse_hccn_tls(text: str) -> dict[int, int]:
    """``hccn_tool -i N -tls -g``: ``{dev_id: switch}`` from ``dev_id:N, tls switch[V]``."""
    out = {}
    for m in re.finditer(r"dev_id:\s*(\d+),\s*tls switch\[(\d+)\]", text):
        out[int(m.group(1))] = int(m.group(2))
    return out


_TLS_FIX = (
    "disable TLS on every NPU of every node (the Ascend guide's step 3): "
    "for i in {0..7}; do hccn_tool -i $i -tls -s enable 0; done"
)


def eval_hccn_tls(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """The Ascend guide (Parameter Plane Connectivity, step 3) wants switch 0 on every NPU,
    not only the same value everywhere: "If there's a non-zero case ... configure tls to 0"."""
    tls = parse_hccn_tls(out.stdout)
    if not tls:
        return [unparsed(ctx, "hccn_tool -tls", out)]
    on = sorted(k for k, v in tls.items() if v != 0)
    if on:
        detail = ", ".join(f"{k}:{tls[k]}" for k in on)
        return [row(ctx, Status.FAIL, f"TLS switch is on for NPU(s) {detail}", _TLS_FIX, tls=tls)]
    return [
        row(ctx, Status.OK, f"TLS switch 0 on NPUs {', '.join(map(str, sorted(tls)))}", tls=tls)
    ]


TLS_CLUSTER = "ascend.tls.cluster"


def compare_ascend_tls(by_host: Mapping[str, Mapping[int, int]]) -> list[CheckResult]:
    """TLS switch must be identical on all NPUs of all nodes (else HCCL links fail or
    the service answers garbage)."""
    target = "cluster"
    values = {(h, n): v for h, m in by_host.items() for n, v in m.items()}
    if not values:
        return [CheckResult(TLS_CLUSTER, target, Status.SKIP, "no Ascend TLS data")]
    distinct = sorted(set(values.values()))
    if len(distinct) == 1:
        return [
            CheckResult(
                TLS_CLUSTER,
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
            TLS_CLUSTER,
            target,
            Status.FAIL,
            f"TLS switch differs across nodes ({detail})",
            _TLS_FIX,
            {"groups": groups},
        )
    ]


def _tls_cluster(planned: Sequence[str], results: Sequence[CheckResult]) -> list[CheckResult]:
    tls: dict[str, dict[int, int]] = {}
    for r in results:
        if isinstance(r.data.get("tls"), Mapping):
            tls[r.target] = {int(k): int(v) for k, v in r.data["tls"].items()}
    return compare_ascend_tls(tls)


def parse_hccn_ping(text: str) -> dict[str, Any]:
    m = re.search(r"(\d+) packets transmitted,\s*(\d+) received,\s*([\d.]+)% packet loss", text)
    res: dict[str, Any] = {"timeouts": len(re.findall(r"recv time out", text))}
    if m:
        res.update(sent=int(m.group(1)), received=int(m.group(2)), loss=float(m.group(3)))
    return res


def eval_hccn_ping(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """Sections ``== npu N -> IP ==``, each the output of ``hccn_tool -i N -ping -g address IP``."""
    results = []
    for key, body in parse_sections(out.stdout).items():
        p = parse_hccn_ping(body)
        if "loss" in p and p["loss"] == 0.0 and p["received"] > 0:
            results.append(row(ctx, Status.OK, f"{key}: {p['received']}/{p['sent']} replies", **p))
        elif "loss" in p or p["timeouts"]:
            loss = f"{p['loss']:.2f}% loss" if "loss" in p else f"{p['timeouts']} timeouts"
            results.append(
                row(
                    ctx,
                    Status.FAIL,
                    f"{key}: {loss}",
                    "NPU device IPs not reachable: check VLAN/route/netmask/gateway "
                    "(hccn_tool -i N -netdetect/-gateway -g) and the peer's link",
                    **p,
                )
            )
        else:
            results.append(unparsed(ctx, f"hccn_tool -ping ({key})", CommandOutput(out.rc, body)))
    return results or [unparsed(ctx, "hccn_tool -ping", out)]


def parse_hccn_conf(text: str) -> dict[int, dict[str, str]]:
    """``/etc/hccn.conf``: ``{npu: {"address": ..., "netmask": ..., ...}}``."""
    out: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([a-z_]+?)_(\d+)\s*=\s*(\S+)\s*$", line)
        if m:
            out.setdefault(int(m.group(2)), {})[m.group(1)] = m.group(3)
    return out


def eval_hccn_conf(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``npus`` (NPU indices the plan uses here; optional)."""
    if out.rc != 0:
        status = Status.FAIL if ctx.required else Status.SKIP
        return [
            row(
                ctx,
                status,
                "/etc/hccn.conf missing or unreadable",
                "configure NPU NICs with hccn_tool (it writes /etc/hccn.conf) and mount it "
                "into the container",
            )
        ]
    conf = parse_hccn_conf(out.stdout)
    if not conf:
        return [unparsed(ctx, "/etc/hccn.conf", out)]
    npus = ctx.params.get("npus") or []
    missing = [n for n in npus if "address" not in conf.get(int(n), {})]
    if missing:
        return [
            row(
                ctx,
                Status.FAIL,
                f"/etc/hccn.conf has no address_N for NPU(s) {', '.join(map(str, missing))}",
                "configure the device IPs: hccn_tool -i N -ip -s address IP netmask MASK",
                conf={k: dict(v) for k, v in conf.items()},
            )
        ]
    return [
        row(
            ctx,
            Status.OK,
            f"/etc/hccn.conf lists {len(conf)} NPU(s)",
            addresses={k: v.get("address") for k, v in conf.items()},
        )
    ]


# ------------------------------------------------------------------------- commands


def _cmd_hccn_loop(flag: str) -> Callable[[Mapping[str, Any]], str]:
    def build(params: Mapping[str, Any]) -> str:
        npus = ints(params.get("npus") or range(8))
        return (
            f'{_PATH}; {need("hccn_tool")}for i in {npus}; do echo "== npu $i =="; '
            f"hccn_tool -i $i {flag} -g 2>&1; done"
        )

    return build


def _cmd_hccn_tls(params: Mapping[str, Any]) -> str:
    npus = ints(params.get("npus") or range(8))
    return (
        f"{_PATH}; {need('hccn_tool')}for i in {npus}; do "
        "hccn_tool -i $i -tls -g 2>&1 | grep switch; done"
    )


def _cmd_hccn_ping(params: Mapping[str, Any]) -> str:
    # params["pairs"]: [(local_npu, peer_ip), ...]
    parts = [f"{_PATH}; {need('hccn_tool')}"]
    for npu, ip in params.get("pairs") or []:
        parts.append(
            f"echo {q(f'== npu {int(npu)} -> {ip} ==')}; "
            f"hccn_tool -i {int(npu)} -ping -g address {q(ip)} 2>&1; "
        )
    return "".join(parts)


# ------------------------------------------------------------------- plan -> params


def _npu_calls(facts: HostFacts) -> list[Call]:
    npus = sorted({d for x in facts.engines_of(FAMILY) for d in x.devices})
    return [Call({"npus": npus})]


def _npu_addresses(results: Sequence[CheckResult]) -> dict[int, str]:
    """Device IPs of a host's NPUs: live config (``ascend.ip``), else /etc/hccn.conf."""
    live: dict[int, str] = {}
    conf: dict[int, str] = {}
    for r in results:
        if r.status is not Status.OK:
            continue
        if r.probe == IP.id and "npu" in r.data and r.data.get("ip"):
            live[int(r.data["npu"])] = str(r.data["ip"])
        elif r.probe == HCCN_CONF.id and isinstance(r.data.get("addresses"), Mapping):
            conf.update({int(k): str(v) for k, v in r.data["addresses"].items() if v})
    return {**conf, **live}


def _ping_call(
    prefill: Process, decode: Process, decode_host: str, decode_results: Sequence[CheckResult]
) -> Call | str:
    """Rank k of prefill pings rank k of decode (the smaller side wraps around), at the
    device IPs the decode host reported in this check."""
    addrs = _npu_addresses(decode_results)
    todo = []
    if prefill.devices and decode.devices:
        for k in range(max(len(prefill.devices), len(decode.devices))):
            dn = decode.devices[k % len(decode.devices)]
            if dn in addrs:
                todo.append((prefill.devices[k % len(prefill.devices)], addrs[dn]))
    if not todo:
        return f"device IPs of {decode.name}'s NPUs unknown (see {IP.id} on {decode_host})"
    return Call({"pairs": todo})


# ---------------------------------------------------------------------------- probes

_ASCEND = Needs(device=True)

NPU_SMI = Probe(
    "ascend.npu_smi",
    "NPUs, health and HBM",
    f"{_PATH}; {need('npu-smi')}npu-smi info",
    eval_npu_smi,
    "npu-smi info",
    tool="npu-smi",
    install="install the Ascend driver (npu-smi)",
    needs=_ASCEND,
    calls=inventory_calls(FAMILY),
)
HCCN_CONF = Probe(
    "ascend.hccn_conf",
    "/etc/hccn.conf",
    "cat /etc/hccn.conf",
    eval_hccn_conf,
    "/etc/hccn.conf",
    needs=_ASCEND,
    calls=_npu_calls,
)
LINK = Probe(
    "ascend.link",
    "NPU NIC link",
    _cmd_hccn_loop("-link"),
    eval_hccn_link,
    "hccn_tool -link",
    tool="hccn_tool",
    install=_TOOLS,
    needs=_ASCEND,
    calls=_npu_calls,
)
LINK_STAT = Probe(
    "ascend.link_stat",
    "NPU NIC link flapping",
    _cmd_hccn_loop("-link_stat"),
    eval_hccn_link_stat,
    "hccn_tool -link_stat",
    tool="hccn_tool",
    install=_TOOLS,
    needs=_ASCEND,
    calls=_npu_calls,
)
IP = Probe(
    "ascend.ip",
    "NPU NIC address",
    _cmd_hccn_loop("-ip"),
    eval_hccn_ip,
    "hccn_tool -ip",
    tool="hccn_tool",
    install=_TOOLS,
    needs=_ASCEND,
    calls=_npu_calls,
)
TLS = Probe(
    "ascend.tls",
    "NPU TLS switch",
    _cmd_hccn_tls,
    eval_hccn_tls,
    "hccn_tool -tls",
    tool="hccn_tool",
    install=_TOOLS,
    needs=_ASCEND,
    calls=_npu_calls,
    cluster=_tls_cluster,
)
PING = Probe(
    "ascend.ping",
    "prefill NPU -> decode NPU ping",
    _cmd_hccn_ping,
    eval_hccn_ping,
    "hccn_tool -ping",
    tool="hccn_tool",
    install=_TOOLS,
    needs=_ASCEND,
    scope="pair",
    timeout_s=120.0,
    # The Ascend guide makes the device-IP ping part of bringing PD up (Parameter Plane
    # Connectivity, step 5): `up`'s preflight runs it too.
    fast=True,
    pair_call=_ping_call,
)

PROBES = (NPU_SMI, HCCN_CONF, LINK, LINK_STAT, IP, TLS, PING)
