"""The machines of a check: the plan's processes grouped by host (address + how to reach it),
with what each one needs probed and which interpreter runs its Python probes.

Which Python interpreter runs the version/reachability probes on a host, first match wins:

1. ``PDLAUNCH_PYTHON`` in the planned env of a process on that host (topology ``defaults.env``,
   ``hosts.<host>.env``, an instance's or the router's ``env``): check's own setting;
2. the ``python`` next to an instance's ``vllm_bin`` when that is a path
   (``/opt/venv/bin/vllm`` -> ``/opt/venv/bin/python``: the venv vLLM runs in);
3. ``python3`` on the host's PATH.

The same rule, over the processes of one image, picks the interpreter inside a container
(check/inside.py); the host's own excludes the processes that run in a container, whose
``vllm_bin`` is a path in their image.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from typing import Any

from pdlaunch.check.probes import HostFacts, families_of
from pdlaunch.check.probes.ucx import uses_rdma
from pdlaunch.hosts.pool import host_key
from pdlaunch.plan.build import Plan, Process
from pdlaunch.plan.containers import ENGINE_RUNTIMES

PYTHON_ENV = "PDLAUNCH_PYTHON"


@dataclass
class HostTarget:
    """One machine of the plan, as the check sees it."""

    label: str  # target name in results
    address: str
    local: bool
    ssh: dict[str, Any]
    processes: list[Process]
    device_kinds: set[str] = field(default_factory=set)  # topology kinds of its engines
    families: set[str] = field(default_factory=set)  # probe families those kinds name
    transports: set[str] = field(default_factory=set)
    reachable: bool | None = None
    error: str = ""

    @property
    def key(self) -> tuple:
        return host_key(self.address, self.local, self.ssh)

    @property
    def engines(self) -> list[Process]:
        return [x for x in self.processes if x.role != "router"]

    @property
    def on_host(self) -> list[Process]:
        """Its processes that run on the host itself, not in a docker/podman container."""
        return [x for x in self.processes if not in_container(x)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.label,
            "address": self.address,
            "local": self.local,
            "ssh_port": None if self.local else self.ssh.get("port"),
            "processes": [x.name for x in self.processes],
            "devices": sorted(self.device_kinds),
            "probe_families": sorted(self.families),
            "transports": sorted(self.transports),
            "reachable": self.reachable,
            "error": self.error,
        }


def group_hosts(plan: Plan) -> list[HostTarget]:
    """The plan's machines in plan order. Two entries share an address only when they are
    reached differently (e.g. simulated hosts: one sshd port each); their labels then carry
    the SSH port."""
    targets: dict[tuple, HostTarget] = {}
    for proc in plan.processes:
        ssh = proc.ssh.model_dump()
        key = host_key(proc.host, proc.local, ssh)
        t = targets.get(key)
        if t is None:
            t = targets[key] = HostTarget(proc.host, proc.host, proc.local, ssh, [])
        t.processes.append(proc)
    per_address: dict[str, int] = {}
    for t in targets.values():
        per_address[t.address] = per_address.get(t.address, 0) + 1
    for t in targets.values():
        if per_address[t.address] > 1:
            t.label = f"{t.address} (local)" if t.local else f"{t.address}:ssh{t.ssh.get('port')}"
        t.device_kinds = {x.device for x in t.engines if x.device}
        t.families = families_of(t.device_kinds)
        t.transports = _transports(plan, t)
    return list(targets.values())


def _transports(plan: Plan, t: HostTarget) -> set[str]:
    """Transport features the host's engines use: UCX under NIXL, and RDMA where their
    UCX_TLS puts traffic on an RDMA port."""
    if plan.kv_connector != "nixl" or not t.engines:
        return set()
    if any(uses_rdma(x.ucx_tls) for x in t.engines):
        return {"ucx", "rdma"}
    return {"ucx"}


def in_container(proc: Process) -> bool:
    """The process runs in a container the host's docker/podman starts (pyxis runs the
    step in its image under Slurm, which a check over SSH cannot enter)."""
    return proc.container is not None and proc.container.runtime in ENGINE_RUNTIMES


def probe_python(t: HostTarget) -> str:
    """The interpreter that runs the host's Python probes (see the module docstring)."""
    return python_of(t.on_host, t.local)


def python_of(processes: list[Process], local: bool) -> str:
    """The interpreter the module docstring's rule picks among ``processes``."""
    for proc in processes:
        if proc.env.get(PYTHON_ENV):
            return _login_path(proc.env[PYTHON_ENV], local)
    for proc in processes:
        if proc.role != "router" and proc.vllm_bin and "/" in proc.vllm_bin:
            return _login_path(posixpath.join(posixpath.dirname(proc.vllm_bin), "python"), local)
    return "python3"


def _login_path(path: str, local: bool) -> str:
    """Probe commands quote their interpreter, so ``~`` would not expand: on a local host
    expand it here, on an SSH host make it relative to the login directory (home)."""
    if path.startswith("~/"):
        return os.path.expanduser(path) if local else path[2:]
    return path


def host_facts(plan: Plan, t: HostTarget, processes: list[Process] | None = None) -> HostFacts:
    """The plan's facts on host ``t``; ``processes``: only these of its processes."""
    procs = t.processes if processes is None else processes
    return HostFacts(t.label, tuple(procs), plan.kv_connector, plan.vllm_version, probe_python(t))
