"""Every `pdlaunch check` probe, one module per tool family.

A module holds, side by side, its probes' commands, parsers, evaluators and parameter
builders (see :mod:`.base`); this package only collects them. Device families (nvidia,
gaudi, ascend) run where a device kind's entry in ``pdlaunch/spec/devices.py`` names them, so a
new accelerator is one entry there (plus a module here if its tools are new).

A runner only has to::

    for probe in select_probes(families, transports, scope="host"):
        for call in probe.calls(host_facts):
            cmd = probe.render(call.params)
            out = CommandOutput(*run(host, cmd, timeout=probe.timeout_s))
            results += probe.judge(out, ProbeContext(host, call.required, call.params))
"""

from __future__ import annotations

from collections.abc import Iterable

from pdlaunch.check.probes import (
    ascend,
    bandwidth,
    cpu,
    gaudi,
    model,
    nixl,
    node_addr,
    nvidia,
    ports,
    rdma,
    ucx,
    versions,
    vllm,
)
from pdlaunch.check.probes.base import (
    Call,
    CommandOutput,
    HostFacts,
    Needs,
    Probe,
    ProbeContext,
    Scope,
    families_of,
)

#: the modules in report order (fabric, accelerators, every host, optional)
MODULES = (
    rdma,
    ucx,
    nvidia,
    gaudi,
    ascend,
    cpu,
    node_addr,
    ports,
    versions,
    nixl,
    model,
    vllm,
    bandwidth,
)
PROBES: tuple[Probe, ...] = tuple(p for m in MODULES for p in m.PROBES)


def select_probes(
    families: Iterable[str],
    transports: Iterable[str],
    *,
    scope: Scope = "host",
    fast_only: bool = False,
    optional: bool = False,
    alternatives: bool = False,
) -> list[Probe]:
    """Probes relevant to a host (or pair) whose device kinds name these probe families
    (:func:`families_of`) and whose plan uses these transports. ``optional``: also the
    probes only an explicit flag asks for (``--bandwidth``)."""
    families, transports = set(families), set(transports)
    out = []
    for pr in PROBES:
        if pr.scope != scope or not pr.needs.matches(pr.family, families, transports):
            continue
        if pr.optional and not optional:
            continue
        if fast_only and not pr.fast:
            continue
        if pr.alternative_to is not None and not alternatives:
            continue
        out.append(pr)
    return out


__all__ = [
    "MODULES",
    "PROBES",
    "Call",
    "CommandOutput",
    "HostFacts",
    "Needs",
    "Probe",
    "ProbeContext",
    "families_of",
    "select_probes",
]
