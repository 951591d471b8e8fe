"""What a topology says that Slurm placement contradicts, as findings in the rules' style.

Each rule is a pure function ``(topo, plan, opts) -> list[Finding]`` (`SlurmOptions` carries
what the topology cannot know: the nodelist, the partition's GPUs and CPUs per node). They
are not in the global `RULES`: they mean nothing without Slurm input. `check` runs them all;
`validate` adds each finding's file and line, as `pdlaunch.rules.validate` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pdlaunch.backends.slurm.job import Component, SlurmOptions, components
from pdlaunch.plan.build import Plan, Process
from pdlaunch.plan.ports import all_nodes
from pdlaunch.rules.base import Finding, error, warning
from pdlaunch.spec.addresses import host_key, is_loopback, is_unspecified
from pdlaunch.spec.load import FieldPath, Source
from pdlaunch.spec.topology import Topology

HETJOB = "https://slurm.schedmd.com/heterogeneous_jobs.html"
SBATCH = "https://slurm.schedmd.com/sbatch.html"
SRUN = "https://slurm.schedmd.com/srun.html"
SLURM_CONF = "https://slurm.schedmd.com/slurm.conf.html"

SlurmRule = Callable[[Topology, Plan, SlurmOptions], list[Finding]]


def _paths(topo: Topology) -> dict[str, FieldPath]:
    """Instance name -> its topology path, e.g. ("decode", 0)."""
    return {n.instance_name: n.path for n in all_nodes(topo)}


def _host_field(topo: Topology, path: FieldPath) -> FieldPath:
    role, index = path[0], path[1]
    inst = (topo.prefill if role == "prefill" else topo.decode)[int(index)]
    return (*path, "host") if inst.host is not None else (*path, "hosts")


def slurm_nodelist(topo: Topology, plan: Plan, opts: SlurmOptions) -> list[Finding]:
    """Instances pinned to hosts the nodelist lacks; more nodes needed than it lists."""
    if opts.nodelist is None:
        return []
    listed = {host_key(n) for n in opts.nodelist}
    paths = _paths(topo)
    out: list[Finding] = []
    comps = components(plan)
    needed = sum(len(c.hosts) for c in comps)
    if needed > len(opts.nodelist):
        out.append(
            error(
                "slurm-nodelist",
                ("prefill",),
                f"the deployment needs {needed} node(s) (one per distinct host), but the "
                f"nodelist has {len(opts.nodelist)}: {', '.join(opts.nodelist)}",
                "list more nodes, or put instances on fewer hosts",
                SBATCH + "#OPT_nodelist",
            )
        )
    for c in comps:
        named = [h for h in c.hosts if host_key(h) in listed]
        if len(c.hosts) == 1 and is_loopback(c.hosts[0]) and len(opts.nodelist) == 1:
            continue  # one node, spelled as loopback in the topology: that node
        for p in c.processes:
            if host_key(p.host) in listed:
                continue
            where = _host_field(topo, paths[p.instance])
            if is_loopback(p.host):
                msg = (
                    f"{p.name} is on {p.host}, but the job spans the nodes "
                    f"{', '.join(opts.nodelist)}: a loopback host names no node"
                )
            else:
                msg = (
                    f"{p.name} is pinned to host {p.host}, which is not in the Slurm "
                    f"nodelist ({', '.join(opts.nodelist)})"
                )
            fix = "use the node names of the nodelist as hosts, or add the host to the nodelist"
            if named:
                fix += f" (component {c.index} already uses {', '.join(named)})"
            out.append(error("slurm-nodelist", where, msg, fix, SBATCH + "#OPT_nodelist"))
    return out


def slurm_bind(topo: Topology, plan: Plan, opts: SlurmOptions) -> list[Finding]:
    """Slurm decides the node, and the router, the driver and the control host dial it at
    its NodeAddr: a listener bound to one address (loopback above all) is not reachable
    there. A bind equal to a host the nodelist pins is the one exception."""
    out: list[Finding] = []
    pinned = {host_key(n) for n in opts.nodelist or ()}
    for node in all_nodes(topo):
        bind = node.instance.bind
        if is_unspecified(bind) or not node.serves_http:
            continue
        if host_key(bind) == host_key(node.host) and host_key(bind) in pinned:
            continue
        out.append(
            error(
                "slurm-bind",
                (*node.path, "bind"),
                f"{node.name} listens on {bind} only, but under Slurm it is reached at the "
                "address of whichever node Slurm gives it (its NodeAddr)",
                "bind to 0.0.0.0 (or ::)",
                SLURM_CONF + "#OPT_NodeAddr",
            )
        )
    r = topo.router
    if not is_unspecified(r.bind) and not (
        host_key(r.bind) == host_key(r.host) and host_key(r.bind) in pinned
    ):
        out.append(
            error(
                "slurm-bind",
                ("router", "bind"),
                f"the router listens on {r.bind} only, but it runs on the allocation's first "
                "node and is reached at that node's address",
                "bind the router to 0.0.0.0 (or ::)",
                SLURM_CONF + "#OPT_NodeAddr",
            )
        )
    return out


def _busiest(c: Component, kind: str) -> tuple[int, Process | None]:
    per: dict[int, list[Process]] = {}
    for p in c.processes:
        if p.device == kind:
            per.setdefault(c.node_of(p), []).append(p)
    if not per:
        return 0, None
    node = max(per, key=lambda k: sum(len(p.devices) for p in per[k]))
    return sum(len(p.devices) for p in per[node]), per[node][0]


def slurm_resources(topo: Topology, plan: Plan, opts: SlurmOptions) -> list[Finding]:
    """GPUs (or CPU cores) per node beyond what the partition offers: sbatch would refuse
    the job, or it would pend forever."""
    out: list[Finding] = []
    paths = _paths(topo)
    for c in components(plan):
        for kind, limit, what in (
            ("cuda", opts.gpus_per_node, "GPUs"),
            ("hpu", opts.gpus_per_node, "Gaudi cards"),
            ("npu", opts.gpus_per_node, "NPUs"),
            ("cpu", opts.cpus_per_node, "CPU cores"),
        ):
            need, first = _busiest(c, kind)
            if limit is None or first is None or need <= limit:
                continue
            out.append(
                error(
                    "slurm-resources",
                    (*paths[first.instance], "devices"),
                    f"component {c.index} ({', '.join(c.instances)}) needs {need} {what} on "
                    f"one node ({first.host}), but the partition offers {limit} per node",
                    "lower tp / dp.local_size, spread the instances over more hosts, or "
                    "choose a partition with larger nodes",
                    SBATCH + "#OPT_gpus-per-node",
                )
            )
    return out


def slurm_devices(topo: Topology, plan: Plan, opts: SlurmOptions) -> list[Finding]:
    """Explicit accelerator `devices:` count within what Slurm gives the component on that
    node (the node runner maps index i to the i-th device Slurm lists): an index at or
    beyond that count cannot be honoured."""
    out: list[Finding] = []
    paths = _paths(topo)
    for c in components(plan):
        for kind in ("cuda", "hpu", "npu"):
            given = c.per_node(kind)
            for p in c.processes:
                if p.device != kind or not p.devices or max(p.devices) < given:
                    continue
                role, index = paths[p.instance][0], int(paths[p.instance][1])
                inst = (topo.prefill if role == "prefill" else topo.decode)[index]
                if inst.devices is None:
                    continue
                out.append(
                    error(
                        "slurm-devices",
                        (*paths[p.instance], "devices"),
                        f"{p.name} pins devices {p.devices}, but Slurm gives its component "
                        f"{given} per node: under Slurm, device indices count within the "
                        "devices the job gets, not the node's",
                        f"use indices below {given}, or drop `devices:` and let Slurm choose",
                        SRUN + "#OPT_gpus-per-node",
                    )
                )
    return out


def slurm_placement(topo: Topology, plan: Plan, opts: SlurmOptions) -> list[Finding]:
    """Placement the topology states but Slurm decides: the router's host (it runs on the
    allocation's first node) and an explicit DP master address (the instance's first
    node is the master)."""
    out: list[Finding] = []
    comps = components(plan)
    first = comps[0].hosts[0] if comps else None
    if first is not None and host_key(topo.router.host) != host_key(first):
        out.append(
            warning(
                "slurm-placement",
                ("router", "host"),
                f"the router runs on the allocation's first node (the one standing for "
                f"{first}), not on {topo.router.host}",
                f"set router.host to {first} to say so",
                HETJOB,
            )
        )
    for role, i, inst in topo.instances():
        master = inst.dp.master_address
        if master and host_key(master) != host_key(inst.node_hosts[0]):
            out.append(
                warning(
                    "slurm-placement",
                    (role, i, "dp", "master_address"),
                    f"dp.master_address {master} is replaced by the address of the first "
                    "node Slurm gives this instance",
                    "drop dp.master_address under Slurm",
                    HETJOB,
                )
            )
    return out


SLURM_RULES: list[SlurmRule] = [
    slurm_nodelist,
    slurm_bind,
    slurm_resources,
    slurm_devices,
    slurm_placement,
]


def check(topo: Topology, plan: Plan, opts: SlurmOptions) -> list[Finding]:
    return [f for r in SLURM_RULES for f in r(topo, plan, opts)]


def validate(topo: Topology, plan: Plan, opts: SlurmOptions, source: Source) -> list[Finding]:
    """Every Slurm finding with the file and line of its field, errors first."""
    out = [replace(f, file=source.file, line=source.line(f.field)) for f in check(topo, plan, opts)]
    return sorted(out, key=lambda f: (f.severity != "error", f.line or 0))
