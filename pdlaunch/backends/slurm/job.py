"""A Slurm heterogeneous job for the deployment a `Plan` describes (`--backend slurm`).

Pure functions from the plan (already judged by the rules, and by `rules` for what
Slurm placement contradicts) to text: one sbatch script, plus the plan's own process scripts.

* **Components.** Engine instances that share a host in the topology run in one het component
  (one component per role and node group): backfill reserves whole nodes for a pending job, so
  two components of one het job never share a node (seen on Slurm 22.05: the second component
  stays pending for "Resources" on a node the first leaves half free). Node *k* of a component
  is the component's *k*-th topology host. Each component asks for its node count,
  ``--ntasks-per-node=1``, and per node the GPUs (``--gpus-per-node``) or CPU cores
  (``--cpus-per-task``) of the processes it holds. One component makes a plain job.
* **Driver.** The batch script runs on the allocation's first node. It learns each node's
  address from Slurm (``scontrol show hostnames $SLURM_JOB_NODELIST_HET_GROUP_<n>``, then the
  node's ``NodeAddr``), starts every engine with ``srun --het-group=<n> --nodelist=<node>`` in
  the background, waits for each engine's health, starts the router on the first node of the
  allocation, waits for it, then waits for the steps: the job ends when any process does.
* **Scripts.** Each process's script is the one `pdlaunch render` writes, rendered by the same
  template, except for what Slurm decides at run time; those values become shell variables the
  driver sets (`RUNTIME`): the node's address (NIXL side-channel host), the nodes' addresses
  (router URLs, DP master address), the devices Slurm gave the step (visible-devices variable)
  and the CPUs it may use (CPU OpenMP binding).

Everything that reaches a shell goes through `pdlaunch.plan.render.shquote` / `command`; the
driver's own shell code is constant text, in templates/slurm/*.j2.
"""

from __future__ import annotations

import functools
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from pdlaunch import __version__
from pdlaunch.backends.slurm.oci import oci_flags, uses_oci
from pdlaunch.hosts.shell import EXEC_OWNED
from pdlaunch.plan.build import Plan, Process
from pdlaunch.plan.containers import pyxis_flags
from pdlaunch.plan.node_addr import NODE_ADDR, SIDE_CHANNEL_HOST
from pdlaunch.plan.node_addr import PLACEHOLDER as NODE_ADDR_PLACEHOLDER
from pdlaunch.plan.render import RenderedFile, render_plan, shquote, template_environment
from pdlaunch.spec.addresses import host_key
from pdlaunch.spec.devices import profile
from pdlaunch.spec.slurm_options import SBATCH_VALUE as _SBATCH_VALUE
from pdlaunch.spec.slurm_options import SlurmError, SlurmOptions

CPU_BIND = "VLLM_CPU_OMP_THREADS_BIND"
DRIVER_NAME = "slurm-job.sh"
# Variables the driver and node runner set on the node, read by the process scripts (the
# node's address: the same variable an SSH script resolves itself, plan/node_addr.py).
DEVICES = "PDLAUNCH_DEVICES"
CPUS = "PDLAUNCH_CPU_BIND"

_PLACEHOLDER = re.compile(r"\{pdlaunch:([A-Z][A-Z0-9_]*)\}")
_PLACEHOLDER_MARK = "{pdlaunch:"


@dataclass(frozen=True)
class Component:
    """One het component: engine processes whose instances share hosts."""

    index: int
    hosts: tuple[str, ...]  # node k of the component stands for hosts[k]
    processes: tuple[Process, ...]

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.role for p in self.processes))

    @property
    def instances(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.instance for p in self.processes))

    def node_of(self, p: Process) -> int:
        key = host_key(p.host)
        return next(k for k, h in enumerate(self.hosts) if host_key(h) == key)

    def per_node(self, kind: str) -> int:
        """Devices of one kind the busiest node needs (each process pins its own)."""
        totals = [0] * len(self.hosts)
        for p in self.processes:
            if p.device == kind:
                totals[self.node_of(p)] += len(p.devices)
        return max(totals, default=0)


def components(plan: Plan) -> list[Component]:
    """Engine instances grouped by shared hosts, in plan order (union of overlapping host
    sets: an instance on hosts a and b joins every instance on a or b)."""
    groups: list[tuple[list[str], list[Process]]] = []
    for inst in dict.fromkeys(p.instance for p in plan.processes if p.role != "router"):
        procs = [p for p in plan.processes if p.instance == inst and p.role != "router"]
        keys = {host_key(p.host) for p in procs}
        touching = [g for g in groups if keys & {host_key(h) for h in g[0]}]
        hosts = [h for g in touching for h in g[0]]
        members = [p for g in touching for p in g[1]]
        for p in procs:
            if host_key(p.host) not in {host_key(h) for h in hosts}:
                hosts.append(p.host)
        merged = (hosts, members + procs)
        groups = [g for g in groups if all(g is not t for t in touching)]
        groups.append(merged)
    order = {p.name: i for i, p in enumerate(plan.processes)}
    groups.sort(key=lambda g: min(order[p.name] for p in g[1]))
    return [
        Component(i, tuple(h), tuple(sorted(ps, key=lambda p: order[p.name])))
        for i, (h, ps) in enumerate(groups)
    ]


def addr_var(component: int, node: int) -> str:
    """The driver's variable holding node ``node`` of component ``component``'s address."""
    return f"PDLAUNCH_ADDR_{component}_{node}"


def _url_host(value: str) -> str:
    return f"[{value}]" if ":" in value else value


def _placeholder(var: str) -> str:
    return "{pdlaunch:" + var + "}"


def _engine_url(components_: list[Component], p: Process) -> str:
    c = next(c for c in components_ if p in c.processes)
    port = urlsplit(p.health_url or "").port
    return f"http://{_placeholder(addr_var(c.index, c.node_of(p)))}:{port}"


def _runtime_router_argv(plan: Plan, comps: list[Component]) -> list[str]:
    """The router's argv with each engine URL (or host, for the toy proxy) taken from the
    node Slurm gave that engine, position by position (the plan lists the URLs in plan
    order: prefill then decode, each instance's serving nodes)."""
    argv = list(plan.router.argv)
    serving = {
        role: [p for p in plan.by_role(role) if p.health_url]  # type: ignore[arg-type]
        for role in ("prefill", "decode")
    }
    seen = {"prefill": 0, "decode": 0}
    i = 0
    while i < len(argv):
        flag = argv[i]
        role = {"--prefill": "prefill", "--decode": "decode"}.get(flag)
        hosts_role = {"--prefiller-hosts": "prefill", "--decoder-hosts": "decode"}.get(flag)
        if role and i + 1 < len(argv) and seen[role] < len(serving[role]):
            p = serving[role][seen[role]]
            expected = p.health_url.rsplit("/", 1)[0] if p.health_url else ""
            if argv[i + 1] != expected:
                raise SlurmError(
                    f"router argument {flag} {argv[i + 1]!r} is not {p.name}'s URL "
                    f"{expected!r}; cannot place it under Slurm"
                )
            argv[i + 1] = _engine_url(comps, p)
            seen[role] += 1
            i += 2
            continue
        if hosts_role:
            for p in serving[hosts_role]:
                i += 1
                c = next(c for c in comps if p in c.processes)
                argv[i] = _placeholder(addr_var(c.index, c.node_of(p)))
        i += 1
    return argv


def _runtime_engine(p: Process, comps: list[Component]) -> Process:
    env = dict(p.env)
    if SIDE_CHANNEL_HOST in env:
        env[SIDE_CHANNEL_HOST] = _placeholder(NODE_ADDR)
    var = profile(p.device).visible_devices_var if p.device else None
    if var and var in env:
        env[var] = _placeholder(DEVICES)
    if CPU_BIND in env:
        env[CPU_BIND] = _placeholder(CPUS)
    argv = list(p.argv)
    if "--data-parallel-address" in argv:
        c = next(c for c in comps if p in c.processes)
        master = next(q for q in c.processes if q.instance == p.instance and q.node_index == 0)
        argv[argv.index("--data-parallel-address") + 1] = _placeholder(
            addr_var(c.index, c.node_of(master))
        )
    # The driver sets NODE_ADDR from Slurm's NodeAddr: the script resolves nothing itself.
    return p.model_copy(update={"env": env, "argv": argv, "node_addr": None})


def _in_step(p: Process) -> Process:
    """A process whose srun step already runs in its pyxis container execs its argv there
    (its script is the same as without a container)."""
    if p.container is not None and p.container.runtime == "pyxis":
        return p.model_copy(update={"container": None})
    return p


def _without_node_addr(p: Process) -> Process:
    if p.node_addr is None:
        return p
    env = dict(p.env)
    if env.get(SIDE_CHANNEL_HOST) == NODE_ADDR_PLACEHOLDER:
        del env[SIDE_CHANNEL_HOST]
    return p.model_copy(update={"env": env})


def runtime_plan(plan: Plan) -> Plan:
    """The plan with every value Slurm decides at run time replaced by a placeholder."""
    # The plan's own placeholder (a side-channel host the node resolves at start) is the
    # one this backend fills with the node's address too; any other is the user's text.
    text = plan.model_copy(
        update={"processes": [_without_node_addr(p) for p in plan.processes]}
    ).model_dump_json()
    if _PLACEHOLDER_MARK in text:
        raise SlurmError(
            f"the plan contains the text {_PLACEHOLDER_MARK!r}, which the Slurm backend "
            "reserves for values decided at run time; remove it from the topology"
        )
    comps = components(plan)
    procs = []
    for p in map(_in_step, plan.processes):
        if p.role == "router":
            procs.append(p.model_copy(update={"argv": _runtime_router_argv(plan, comps)}))
        else:
            procs.append(_runtime_engine(p, comps))
    return plan.model_copy(update={"processes": procs})


def _fill(text: str, name: str) -> str:
    """Placeholders -> shell variable references. Every placeholder sits in a value that
    `shquote` single-quoted (``{`` is never left bare), so closing the quote, expanding the
    variable in double quotes and reopening it is the whole substitution."""
    for line in text.splitlines():
        if line.startswith("#") and _PLACEHOLDER_MARK in line:
            raise SlurmError(f"{name}: a run-time value reached a comment line: {line!r}")
    return _PLACEHOLDER.sub(lambda m: "'\"${" + m.group(1) + "}\"'", text)


def process_scripts(plan: Plan) -> list[RenderedFile]:
    """Each process's script as `pdlaunch render` writes it (same template, same quoting),
    with the run-time values read from the variables the driver sets."""
    files = render_plan(runtime_plan(plan))
    return [
        RenderedFile(f.name, _fill(f.content, f.name), f.executable)
        for f in files
        if f.name.endswith(".sh")
    ]


# -- the driver -----------------------------------------------------------------------------------
# The shell lives in templates/slurm/: the job script (job.sh.j2), the node runner each step
# starts and the HTTP readiness probe, rendered by the same Jinja environment as every script.


@functools.cache
def node_runner() -> str:
    """The node runner each step starts (templates/slurm/node-runner.sh.j2): constant shell,
    with the owned-script guard shared with SSH (`EXEC_OWNED`)."""
    return (
        template_environment().get_template("slurm/node-runner.sh.j2").render(exec_owned=EXEC_OWNED)
    )


@functools.cache
def http_probe() -> str:
    """``$1`` host, ``$2`` port, ``$3`` path: exit 0 on HTTP 200 (templates/slurm)."""
    return template_environment().get_template("slurm/http-probe.sh.j2").render()


def job_name(deployment: str) -> str:
    """The name of every component of the deployment's job: `down` checks it before scancel."""
    return f"pdlaunch-{deployment}"


def _component_options(c: Component, plan: Plan, opts: SlurmOptions) -> list[str]:
    out = [f"--job-name={job_name(plan.deployment)}"]
    roles = c.roles
    partition = opts.role_partitions.get(roles[0]) if len(roles) == 1 else None
    partition = partition or opts.partition
    if partition:
        out.append(f"--partition={partition}")
    if opts.account:
        out.append(f"--account={opts.account}")
    if opts.qos:
        out.append(f"--qos={opts.qos}")
    if opts.time:
        out.append(f"--time={opts.time}")
    out += [f"--nodes={len(c.hosts)}", "--ntasks-per-node=1"]
    if opts.nodelist is not None:
        out.append("--nodelist=" + ",".join(_nodes_for(c, opts.nodelist)))
    gpus = c.per_node("cuda")
    if gpus:
        out.append(f"--gpus-per-node={gpus}")
    for kind in ("hpu", "npu"):
        n = c.per_node(kind)
        if n:
            out.append(f"--gres={opts.gres.get(kind, kind)}:{n}")
    cores = c.per_node("cpu")
    if cores:
        out.append(f"--cpus-per-task={max(cores, opts.cpus_per_task or 0)}")
    elif opts.cpus_per_task:
        out.append(f"--cpus-per-task={opts.cpus_per_task}")
    if opts.mem:
        out.append(f"--mem={opts.mem}")
    if opts.exclusive:
        out.append("--exclusive")
    out += list(opts.extra_sbatch)
    for o in out:
        if not _SBATCH_VALUE.fullmatch(o):
            raise SlurmError(f"sbatch option {o!r} would not survive an #SBATCH line")
    return out


def _nodes_for(c: Component, nodelist: tuple[str, ...]) -> list[str]:
    """The nodes a component asks for by name: its topology hosts that are in the nodelist;
    loopback or unknown hosts (the rules refuse a mix) take nodes in nodelist order."""
    listed = {host_key(n): n for n in nodelist}
    named = [listed[host_key(h)] for h in c.hosts if host_key(h) in listed]
    if len(named) == len(c.hosts):
        return named
    return list(nodelist[: len(c.hosts)])


@dataclass(frozen=True)
class _Step:
    name: str
    role: str
    component: int
    node: int
    het: str
    addr: str
    work_dir: str
    script: str
    log: str
    output: str  # the log as srun's --output filename pattern
    port: str
    path: str
    var: str = "-"
    devs: str = "-"
    bind: str = "-"
    # srun's container flags when the process runs in a Slurm step container: pyxis's
    # (containers.py), or Slurm's own --container=BUNDLE (oci.py, slurm.container_support).
    container: tuple[str, ...] = ()


def _step(p: Process, c: Component, node: int, het: bool, opts: SlurmOptions) -> _Step:
    url = urlsplit(p.health_url) if p.health_url else None
    var = profile(p.device).visible_devices_var if p.device else None
    return _Step(
        name=p.name,
        role=p.role,
        component=c.index,
        node=node,
        het=f" --het-group={c.index}" if het else "",
        addr=addr_var(c.index, node),
        work_dir=p.work_dir,
        script=p.script_path,
        log=p.log_path,
        output=output_pattern(p.log_path),
        port=str(url.port) if url else "",
        path=url.path if url else "",
        var=var if var and var in p.env else "-",
        devs=",".join(str(d) for d in p.devices) if var and var in p.env else "-",
        bind=p.env.get(CPU_BIND, "-"),
        container=oci_flags(p, opts) if uses_oci(p, opts) else _pyxis(p),
    )


def _pyxis(p: Process) -> tuple[str, ...]:
    """srun flags of a process in a pyxis container: the image's, plus the work dir mounted
    at its own path (the step's scripts and logs are there) and entered."""
    c = p.container
    if c is None or c.runtime != "pyxis":
        return ()
    if "," in p.work_dir:
        # pyxis splits --container-mounts at commas (rule container-pyxis-mounts says why).
        raise SlurmError(
            f"{p.name}: the work dir {p.work_dir!r} holds a comma, which pyxis would read as "
            "two mounts (--container-mounts); use a work dir without one"
        )
    work = f"{p.work_dir}:{p.work_dir}"
    spec = c.model_copy(update={"mounts": list(dict.fromkeys([work, *c.mounts]))})
    return (*pyxis_flags(spec), f"--container-workdir={p.work_dir}")


def output_pattern(path: str) -> str:
    """``path`` as an sbatch/srun ``--output`` value, which Slurm reads as a filename pattern:
    a ``%`` there is escaped (``%%``) so the file lands at ``path``. A backslash would turn
    every pattern off and is dropped by Slurm, so it is refused."""
    if "\\" in path:
        raise SlurmError(
            f"{path!r}: a backslash in a log path is not kept by Slurm (--output); use a work "
            "dir without one"
        )
    return path.replace("%", "%%")


def job_dir(plan: Plan) -> str:
    """Where the driver script and its own log live: the router's work dir."""
    return plan.router.work_dir


def driver_log(plan: Plan, job_id: str | None = None) -> str:
    """The batch script's output: the job's file once ``job_id`` is known, else the
    ``--output`` pattern (``%j``: Slurm puts the job id there; the rest escaped)."""
    if job_id is not None:
        return f"{job_dir(plan)}/logs/slurm-{job_id}.log"
    return f"{output_pattern(job_dir(plan))}/logs/slurm-%j.log"


def check_paths(plan: Plan) -> None:
    """Every path the job uses is absolute (each node must find it at the same place; a
    relative one would be relative to wherever sbatch and srun start)."""
    for p in plan.processes:
        for path in (p.work_dir, p.script_path, p.log_path, p.secrets_path):
            if not posixpath.isabs(path):
                raise SlurmError(
                    f"{p.name}: {path!r} is not an absolute path: under Slurm every node must "
                    "find the work dir at the same path (set work_dir to one, e.g. on a shared "
                    "file system)"
                )


def sbatch_script(plan: Plan, opts: SlurmOptions) -> str:
    """The sbatch script (driver) of the deployment: same plan and options, same bytes."""
    comps = components(plan)
    if not comps:
        raise SlurmError("the plan has no prefill or decode process to place")
    check_paths(plan)
    het = len(comps) > 1
    sbatch = [_component_options(c, plan, opts) for c in comps]
    sbatch[0] += [f"--output={driver_log(plan)}", f"--chdir={job_dir(plan)}"]
    for o in sbatch[0][-2:]:
        if not _SBATCH_VALUE.fullmatch(o):
            raise SlurmError(
                f"the work dir in {o!r} cannot be written into an #SBATCH line: use a path of "
                "letters, digits and _.,:=@%+/- only"
            )
    steps = [_step(p, c, c.node_of(p), het, opts) for c in comps for p in c.processes]
    r = plan.router
    router = _step(r, comps[0], 0, het, opts)

    def nodelist_var(index: int) -> str:
        return f"SLURM_JOB_NODELIST_HET_GROUP_{index}" if het else "SLURM_JOB_NODELIST"

    return (
        template_environment()
        .get_template("slurm/job.sh.j2")
        .render(
            version=__version__,
            plan=plan,
            comps=comps,
            sbatch=sbatch,
            start_timeout=int(opts.start_timeout),
            node_runner=node_runner(),
            http_probe=http_probe(),
            engine_steps=steps,
            router=router,
            addr=addr_var,
            nodes=lambda index: f"pdl_nodes_{index}",
            nodelist_var=nodelist_var,
            node_addr=NODE_ADDR,
        )
    )


def render_job(plan: Plan, opts: SlurmOptions) -> list[RenderedFile]:
    """Every file the job needs: the process scripts and the driver (`DRIVER_NAME`)."""
    return [*process_scripts(plan), RenderedFile(DRIVER_NAME, sbatch_script(plan, opts), True)]


def job_index(plan: Plan) -> RenderedFile:
    """``index.md`` of `pdlaunch render --backend slurm`: where the job expects each file
    (the driver runs every script from its plan path, not from the render directory), and
    the commands that put them there and submit it."""
    driver = f"{job_dir(plan)}/{DRIVER_NAME}"
    dirs = {posixpath.dirname(driver_log(plan)) or "."}
    for p in plan.processes:
        dirs |= set(p.dirs)
    rows = [f"| {p.name} | {p.role} | {p.name}.sh | `{p.script_path}` |" for p in plan.processes]
    installs = [
        f"install -m 0755 {shquote(p.name + '.sh')} {shquote(p.script_path)}"
        for p in plan.processes
    ]
    secrets = [p for p in plan.processes if p.secret_env]
    lines = [
        f"# {plan.deployment}: Slurm job rendered by pdlaunch {__version__}",
        "",
        f"`{DRIVER_NAME}` is the sbatch script: one het component per node group, each process",
        "started with `srun`, the router last, on the allocation's first node. It runs each",
        "script from the path below, which every node must see at that path (a shared file",
        "system); logs go next to them.",
        "",
        "| process | role | file here | path the job runs it from |",
        "|---|---|---|---|",
        *rows,
        f"| (driver) | | {DRIVER_NAME} | `{driver}` |",
        "",
        "Submitting it yourself, from this directory:",
        "",
        "```bash",
        "mkdir -p -m 0700 " + " ".join(shquote(d) for d in sorted(dirs)),
        *installs,
        f"install -m 0755 {DRIVER_NAME} {shquote(driver)}",
        f"sbatch {shquote(driver)}",
        "```",
        "",
    ]
    if secrets:
        lines += [
            "Secrets are not rendered: before submitting, write each of these mode-0600 files",
            "with `NAME='value'` lines for the variables named:",
            "",
            *[f"* `{p.secrets_path}`: {', '.join(p.secret_env)}" for p in secrets],
            "",
        ]
    lines += [
        "`pdlaunch up FILE --backend slurm` does all of this, waits for every process's",
        "health, sends the PD canary, and records the job for `status`, `logs` and `down`.",
        "",
    ]
    return RenderedFile("index.md", "\n".join(lines), False)
