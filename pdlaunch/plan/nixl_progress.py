"""The poll delay NIXL's progress thread gets on an instance (kv_connector.progress_delay_us).

One answer for the env (the variable and the shim on PYTHONPATH), the CPU budget (a thread
that sleeps is no busy thread) and the rules that explain it. Pure.
"""

from __future__ import annotations

from pdlaunch.spec.devices import profile
from pdlaunch.spec.topology import Instance, Topology, instance_name


def progress_delay_us(topo: Topology, inst: Instance) -> int:
    """Microseconds; 0: none (NIXL's own busy poll, and nothing rendered). Only NIXL has
    the thread; "auto" is the device kind's default (devices.py, progress_delay_us)."""
    if topo.kv_connector.kind != "nixl":
        return 0
    delay = topo.kv_connector.progress_delay_us
    return profile(inst.device).progress_delay_us if delay == "auto" else delay


#: where the value NIXL would otherwise use is set (the fact the shim exists for)
HARDCODED_AT = "nixl 1.5.1: nixl_cu12/_api.py:226 (nixl_agent.__init__: pthrDelay = 0)"


def explain(topo: Topology) -> list[str]:
    """What `validate` and `plan` say about the delay: one line per value, the instances
    that get it, and why. Empty when the topology has no NIXL instance."""
    if topo.kv_connector.kind != "nixl":
        return []
    by_delay: dict[int, list[str]] = {}
    for role, insts in (("prefill", topo.prefill), ("decode", topo.decode)):
        for i, inst in enumerate(insts):
            name = instance_name(role, i, inst)
            by_delay.setdefault(progress_delay_us(topo, inst), []).append(name)
    setting = topo.kv_connector.progress_delay_us
    how = "auto: on for CPU instances" if setting == "auto" else f"{setting}"
    lines = []
    for delay, names in sorted(by_delay.items()):
        who = ", ".join(names)
        if delay:
            lines.append(
                f"NIXL progress thread {who}: waits up to {delay} us in poll() instead of "
                f"spinning a core (kv_connector.progress_delay_us {how}; {HARDCODED_AT}); "
                "the start-up shim pdlaunch/kv/nixl_progress is first on PYTHONPATH"
            )
        else:
            lines.append(
                f"NIXL progress thread {who}: NIXL's own busy poll, one core per engine "
                f"(kv_connector.progress_delay_us {how})"
            )
    return lines
