"""The probes of engines that run in a container, run in their image.

An engine with a docker/podman ``container:`` runs the image's Python, vLLM, NIXL and UCX and
opens the model through the container's mounts; the host may have none of them. So every
probe marked ``inside`` (:attr:`pdlaunch.check.probes.Probe.inside`) runs, for those
engines, in a one-shot ``<runtime> run --rm`` of their image with the flags `up` gives them
(:func:`pdlaunch.plan.containers.probe_argv`): one container per distinct (image, flags) on
a host, running its jobs as the host batch does (batch.py), framed by a boundary of its own
inside the host batch's. The rows keep the host as their target (the cross-host version
comparison reads them there) and say the image and the processes in their message.

What stays on the host, and why: the device tools and sysfs (nvidia-smi, hl-smi, npu-smi,
hccn_tool, /sys/class/infiniband) describe the node's hardware, which the device flags hand
into the container unchanged; free ports and reachability are the host's, as every engine
container runs with --net=host; the core count is the host's, as `up` gives the container no
cpuset of its own (only an ``extra_args`` --cpuset-cpus would, and the engine's own
binding still runs inside it).
"""

from __future__ import annotations

import shlex
import uuid
from dataclasses import replace

from pdlaunch.check.batch import Job, batch_script, judge_outputs, parse_batch, probe_job
from pdlaunch.check.probes import CommandOutput, Probe
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.check.targets import HostTarget, host_facts, in_container, python_of
from pdlaunch.plan.build import Plan, Process
from pdlaunch.plan.containers import ContainerSpec, probe_argv

#: seconds a container may take to start on top of its slowest probe (a GPU image with
#: --privileged and many device nodes, a cold overlay)
START_S = 60.0
WHERE = "in the image"


def _flags_key(c: ContainerSpec) -> str:
    """Processes whose containers differ only in name, labels and cidfile share a probe
    run: what is inside is the same."""
    return c.model_dump_json(exclude={"name", "labels", "cid_path"})


def image_groups(t: HostTarget) -> list[list[Process]]:
    """The host's engines in docker/podman containers, grouped by image and flags, in plan
    order (the router has no probe of its software)."""
    groups: dict[str, list[Process]] = {}
    for proc in t.engines:
        if in_container(proc):
            assert proc.container is not None
            groups.setdefault(_flags_key(proc.container), []).append(proc)
    return list(groups.values())


def image_jobs(plan: Plan, t: HostTarget, probes: list[Probe]) -> list[Job]:
    """One container job per image group of host ``t``, running the calls of ``probes``
    (those marked inside) that the group's processes need."""
    out: list[Job] = []
    for procs in image_groups(t):
        facts = replace(host_facts(plan, t, procs), python=python_of(procs, local=False))
        inner = [
            probe_job(probe, t.label, call, where=WHERE)
            for probe in probes
            for call in probe.calls(facts)
        ]
        if inner:
            out.append(container_job(plan.deployment, t.label, procs, inner))
    return out


def container_job(deployment: str, label: str, procs: list[Process], inner: list[Job]) -> Job:
    """The host-batch job that starts ``procs``' container and runs ``inner`` in it."""
    c = procs[0].container
    assert c is not None
    boundary = f"@@pdlaunch-image-{uuid.uuid4().hex}"
    name = f"pdl-{deployment}-check-{uuid.uuid4().hex[:8]}"
    where = f"in {c.image} ({', '.join(p.name for p in procs)})"
    missing = f"{boundary} no-runtime"
    # the runtime's absence told apart from the image's own rc 127 (no sh in it)
    command = (
        f"command -v {shlex.quote(c.runtime)} >/dev/null 2>&1 || "
        f"{{ echo {shlex.quote(missing)}; exit 127; }}; "
        + shlex.join(probe_argv(c, name, batch_script(inner, boundary)))
    )

    def evaluate(out: CommandOutput) -> list[CheckResult]:
        outputs = parse_batch(out.stdout, boundary, len(inner))
        if not outputs:
            return _not_started(c, label, inner, out, missing in out.stdout)
        detail = (out.stderr.strip() or out.stdout.strip())[-300:]
        rows = judge_outputs(
            inner,
            outputs,
            label,
            f"{c.runtime} rc={out.rc}: {detail}",
            "the image needs a POSIX sh, mktemp and cat",
        )
        return [_placed(r, where, c) for r in rows]

    return Job(
        command,
        max(j.timeout for j in inner) + START_S,
        evaluate,
        f"{c.runtime} run {c.image}",
        any(j.required for j in inner),
        label,
        None,
        tuple(inner),
    )


def _placed(r: CheckResult, where: str, c: ContainerSpec) -> CheckResult:
    return replace(
        r, message=f"{where}: {r.message}", data={**r.data, "image": c.image, "runtime": c.runtime}
    )


def _not_started(
    c: ContainerSpec, label: str, inner: list[Job], out: CommandOutput, no_runtime: bool
) -> list[CheckResult]:
    """Every inner probe FAILs with the runtime's own words: the image is not on the node
    (`up` never pulls), the runtime is missing, a flag or mount is refused."""
    if no_runtime:
        why, fix = f"{c.runtime} not found on host", f"install {c.runtime} on this node"
    else:
        said = (out.stderr.strip() or out.stdout.strip()).splitlines()
        why = f"{c.runtime} could not run {c.image} (rc={out.rc}): {said[-1] if said else ''}"
        fix = (
            f"load the image on this node (`{c.runtime} images` lists it; `up` never pulls), "
            "and check the container's mounts and devices exist here"
        )
    data = {"image": c.image, "runtime": c.runtime}
    return [
        CheckResult(j.name, j.target or label, Status.FAIL, why.strip(), fix, data) for j in inner
    ]
