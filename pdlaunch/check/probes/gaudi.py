"""Intel Gaudi HPUs: inventory and free memory (``hl-smi -Q``), scale-out port links
(``hl-smi -n link``). Run where a device kind's entry in devices.py names ``gaudi``."""

from __future__ import annotations

import re

from pdlaunch.check.probes.accelerators import eval_accelerators, inventory_calls, parse_smi_csv
from pdlaunch.check.probes.base import (
    CommandOutput,
    Needs,
    Probe,
    ProbeContext,
    need,
    parse_sections,
    row,
    unparsed,
)
from pdlaunch.check.results import CheckResult, Status

FAMILY = "gaudi"
_INSTALL = "install the Intel Gaudi driver (habanalabs)"


def eval_hl_smi(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
    devs = parse_smi_csv(out.stdout)
    if not devs:
        return [unparsed(ctx, "hl-smi -Q", out)]
    return eval_accelerators("HPU", devs, ctx)


def parse_hl_link(text: str) -> dict[int, str]:
    """``hl-smi -n link -i BUS``: ``{port: "UP"|"DOWN"|...}``."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*port\s+(\d+)\s*:\s*(\S+)", line)
        if m:
            out[int(m.group(1))] = m.group(2).upper()
    return out


def eval_hl_links(out: CommandOutput, ctx: ProbeContext) -> list[CheckResult]:
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
                row(
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
        return [unparsed(ctx, "hl-smi -n link", out)]
    return results or [row(ctx, Status.OK, f"{seen} Gaudi port(s) UP")]


DEVICES = Probe(
    "gaudi.devices",
    "HPUs and free memory",
    need("hl-smi") + "hl-smi -Q index,name,memory.total,memory.free -f csv,noheader,nounits",
    eval_hl_smi,
    "hl-smi -Q",
    tool="hl-smi",
    install=_INSTALL,
    needs=Needs(device=True),
    calls=inventory_calls(FAMILY),
)
LINKS = Probe(
    "gaudi.links",
    "Gaudi port link state",
    need("hl-smi") + "for b in $(hl-smi -Q bus_id -f csv,noheader); do "
    'echo "== $b =="; hl-smi -n link -i "$b"; done',
    eval_hl_links,
    "hl-smi -n link",
    tool="hl-smi",
    install=_INSTALL,
    needs=Needs(device=True),
    timeout_s=60.0,
)

PROBES = (DEVICES, LINKS)
