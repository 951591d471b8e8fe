"""A host named by DNS without ``hosts.<h>.address``: the name resolves, on the node, to one of
the node's own addresses, and not to loopback while peers on other machines dial it.

The engines' scripts resolve the name at start with the same shell function
(plan/node_addr.py ``RESOLVE_SH``, run here verbatim), so what this probe finds is what they
will export as VLLM_NIXL_SIDE_CHANNEL_HOST; the reachability probe then dials that address
from the peers (runner: ``resolved_reaches``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from ipaddress import ip_address
from typing import Any

from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Needs,
    Probe,
    ProbeContext,
    need,
    parse_sections,
    q,
    row,
)
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.plan.node_addr import RESOLVE_SH

IP_SECTION = "ip -o addr"
NO_IP = "pdlaunch: ip not found"
# A host's answer is input: names and addresses beyond these sizes are not a real host's.
MAX_ADDRESSES = 4096
_MAX_TEXT = 64

# iproute2 `ip -o addr show` (ip/ipaddress.c print_addrinfo, one line per address with -o):
# "4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\       valid_lft ..."
_ADDRESS = re.compile(r"[0-9A-Fa-f.:]+")
_IP_LINE = re.compile(r"^\d+:\s+(\S+)\s+inet6?\s+([0-9A-Fa-f.:]+)(?:/\d+)?(?:\s|$)")


def _section(name: str) -> str:
    return f"resolve {name}"


def command(params: Mapping[str, Any]) -> str:
    """params: ``names`` {host name: peers on other machines}."""
    lines = [need("getent") + "true", RESOLVE_SH]
    for name in params.get("names", {}):
        lines.append(f"echo {q('== ' + _section(name) + ' ==')}; pdl_resolve {q(name)} || true")
    lines.append(f"echo {q('== ' + IP_SECTION + ' ==')}")
    lines.append(
        f"if command -v ip >/dev/null 2>&1; then ip -o addr show; else echo {q(NO_IP)}; fi"
    )
    return "\n".join(lines)


def parse_ip_addr(text: str) -> dict[str, str] | None:
    """``ip -o addr show``: {address (canonical): interface}; None when the text lists no
    address (ip absent, or not its output). ValueError past :data:`MAX_ADDRESSES`."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _IP_LINE.match(line.strip())
        if not m:
            continue
        try:
            addr = str(ip_address(m.group(2)))
        except ValueError:
            continue
        out.setdefault(addr, m.group(1).rstrip(":")[:_MAX_TEXT])
        if len(out) > MAX_ADDRESSES:
            raise ValueError(f"more than {MAX_ADDRESSES} addresses")
    return out or None


def parse_resolved(text: str) -> str | None:
    """The one line ``pdl_resolve`` printed: an IP address (canonical), else None (nothing,
    or anything that is not a single address)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # What pdl_resolve's awk takes for an address, no more (no %scope, no brackets).
    if len(lines) != 1 or len(lines[0]) > _MAX_TEXT or not _ADDRESS.fullmatch(lines[0]):
        return None
    try:
        return str(ip_address(lines[0]))
    except ValueError:
        return None


def is_loopback_ip(addr: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped 127.x (Python < 3.13 calls that not loopback)."""
    ip = ip_address(addr)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _shown(text: str) -> str:
    return repr(text.strip()[:_MAX_TEXT])


def eval_node_addr(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    """params: ``names`` {host name: peers on other machines}, ``engines`` {name: [engine]}."""
    names: Mapping[str, bool] = ctx.params.get("names", {})
    if not names:
        return [row(ctx, Status.SKIP, "no host here is a name its node resolves")]
    sections = parse_sections(out.stdout)
    try:
        ips = parse_ip_addr(sections.get(IP_SECTION, ""))
    except ValueError:
        ips = None  # judged as a listing that could not be read
    engines: Mapping[str, Sequence[str]] = ctx.params.get("engines", {})
    rows = []
    for name, elsewhere in names.items():
        who = ", ".join(engines.get(name, [])) or "the engines"
        fix = (
            f"make {name} resolve on this node to its IP on the KV network (DNS or "
            f"/etc/hosts), or set hosts.{name}.address in the topology"
        )
        raw = sections.get(_section(name))
        addr = parse_resolved(raw or "")
        if raw is None or (raw.strip() and addr is None):
            rows.append(
                row(
                    ctx,
                    Status.WARN,
                    f"could not read how {name} resolves here (got {_shown(raw or out.stderr)})",
                    "run the probe command by hand on the host",
                    name=name,
                )
            )
            continue
        if addr is None:
            rows.append(
                row(
                    ctx,
                    Status.FAIL,
                    f"{name} does not resolve on this node (getent ahosts): "
                    f"{who} would stop at start",
                    fix,
                    name=name,
                )
            )
            continue
        data = {"name": name, "address": addr}
        if is_loopback_ip(addr):
            if elsewhere:
                rows.append(
                    row(
                        ctx,
                        Status.FAIL,
                        f"{name} resolves to the loopback address {addr} "
                        f"here, but engines on other hosts dial {who}'s side channel",
                        fix,
                        **data,
                    )
                )
            else:
                rows.append(
                    row(
                        ctx,
                        Status.OK,
                        f"{name} resolves to {addr} here (loopback: every "
                        "engine runs on this machine)",
                        **data,
                    )
                )
            continue
        if ips is None:
            rows.append(
                row(
                    ctx,
                    Status.WARN,
                    f"{name} resolves to {addr} here; this node's own addresses could not "
                    f"be listed (ip -o addr: {_shown(sections.get(IP_SECTION, ''))})",
                    "install iproute2 on the node (the script checks the address with it too)",
                    **data,
                )
            )
        elif addr not in ips:
            rows.append(
                row(
                    ctx,
                    Status.FAIL,
                    f"{name} resolves to {addr} here, which is none of this "
                    f"node's addresses ({', '.join(sorted(ips)[:8])}): {who} would stop at "
                    "start",
                    fix,
                    **data,
                )
            )
        else:
            rows.append(
                row(
                    ctx,
                    Status.OK,
                    f"{name} resolves to {addr} here ({ips[addr]}); {who} "
                    "advertise it as the NIXL side channel",
                    **data,
                )
            )
    return rows


def _calls(facts: HostFacts) -> list[Call]:
    names: dict[str, bool] = {}
    engines: dict[str, list[str]] = {}
    for p in facts.engines:
        if p.node_addr is None:
            continue
        names[p.node_addr.name] = names.get(p.node_addr.name, False) or p.node_addr.peers_elsewhere
        engines.setdefault(p.node_addr.name, []).append(p.name)
    return [Call({"names": names, "engines": engines})] if names else []


RESOLVE = Probe(
    "node_addr.resolve",
    "side-channel address resolved on the node",
    command,
    eval_node_addr,
    "getent ahosts / ip -o addr",
    tool="getent",
    install="install glibc's getent (Debian: libc-bin) on the node",
    # Only NIXL plans have a side channel (its hosts use UCX: check/targets.py).
    needs=Needs(transports=frozenset({"ucx"})),
    calls=_calls,
)

PROBES = (RESOLVE,)


def resolved_addresses(results: Sequence[CheckResult]) -> dict[tuple[str, str], str]:
    """{(host label, name): the address the node resolved} from this probe's rows."""
    out = {}
    for r in results:
        if r.probe == RESOLVE.id and "address" in r.data and "name" in r.data:
            out[(r.target, str(r.data["name"]))] = str(r.data["address"])
    return out
