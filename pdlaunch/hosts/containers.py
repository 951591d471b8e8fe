"""Containers on a host (topology `container:`, runtime docker or podman): is the image there,
is a process's container running, and removing exactly the containers pdlaunch started.

A process's container is known by the id its `run --cidfile` wrote (containers.py), and, as
a fallback for a start cut short before the id was written, by its name *and* pdlaunch's
labels for that deployment and process: a container of the same name that someone else
started carries neither, and is never touched. `down` also sweeps each host for the
deployment's containers by those labels alone (:func:`sweep`): one whose record or cid file
was lost is still found. One command per call, sh only: the scripts ``sh/containers.sh``
(shared functions), ``sh/container-remove.sh``, ``sh/container-sweep.sh``,
``sh/container-list.sh`` and ``sh/container-state.sh``, with the values set as quoted
variables before them.

The runtime is executed on the host, so it must be one pdlaunch knows (``ENGINE_RUNTIMES``):
a record naming any other program is refused before anything runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdlaunch.hosts.errors import HostError
from pdlaunch.hosts.host import Host
from pdlaunch.hosts.shell import script, sh_quote_path
from pdlaunch.plan.containers import ENGINE_RUNTIMES, LABEL_DEPLOYMENT, LABEL_PROCESS

if TYPE_CHECKING:  # the hosts layer does not import the plan at run time
    from pdlaunch.plan.build import Process


@dataclass(frozen=True)
class ContainerRef:
    """What the record keeps of a process's container (never a value of its env)."""

    runtime: str
    name: str
    cid_path: str
    deployment: str
    process: str

    def to_json(self) -> dict[str, str]:
        return {
            "runtime": self.runtime,
            "name": self.name,
            "cid_path": self.cid_path,
            "deployment": self.deployment,
            "process": self.process,
        }

    @classmethod
    def from_json(cls, data: dict[str, str]) -> ContainerRef:
        return cls(**{k: str(data[k]) for k in ("runtime", "name", "cid_path",
                                                 "deployment", "process")})  # fmt: skip


def _known_runtime(host: Host, runtime: str) -> None:
    if runtime not in ENGINE_RUNTIMES:
        raise HostError(
            f"{host.name}: container runtime {runtime[:80]!r} is not one of "
            f"{', '.join(ENGINE_RUNTIMES)}; not run",
            host=host.name,
        )


def _prelude(ref: ContainerRef, grace: float = 10.0) -> str:
    """The container scripts' variables, quoted, and their shared functions."""
    q = shlex.quote
    return (
        f"RT={q(ref.runtime)}; NAME={q(ref.name)}; CIDF={sh_quote_path(ref.cid_path)}; "
        f"DEP={q(ref.deployment)}; PROC={q(ref.process)}; LD={q(LABEL_DEPLOYMENT)}; "
        f"LP={q(LABEL_PROCESS)}; GRACE={int(max(0, grace))}\n" + script("containers.sh") + "\n"
    )


def remove(host: Host, ref: ContainerRef, grace: float = 10.0, timeout: float = 120.0) -> list[str]:
    """Stop (SIGTERM, ``grace`` s, SIGKILL) and remove the process's container(s), then prove
    each gone. Returns the ids removed (none: nothing of ours was there). HostError when one
    survives or the runtime cannot say."""
    _known_runtime(host, ref.runtime)
    res = host.run(_prelude(ref, grace) + script("container-remove.sh"), timeout=grace + timeout)
    out = res.stdout.strip()
    if res.rc != 0 or not out.startswith("removed"):
        why = res.stderr.strip() or out or f"rc={res.rc}"
        raise HostError(f"{host.name}: cannot remove container {ref.name}: {why}", host=host.name)
    return out.split()[1:]


def state(host: Host, ref: ContainerRef, timeout: float = 60.0) -> str:
    """The runtime's status of the process's container (running, exited, created, ...), or
    ``none``. HostError when the runtime cannot say."""
    _known_runtime(host, ref.runtime)
    res = host.run(_prelude(ref) + script("container-state.sh"), timeout=timeout)
    out = res.stdout.strip()
    if res.rc != 0 or not out:
        why = res.stderr.strip() or f"rc={res.rc}"
        raise HostError(f"{host.name}: cannot ask {ref.runtime} about {ref.name}: {why}")
    return out.splitlines()[-1]


def sweep(
    host: Host, runtime: str, deployment: str, grace: float = 10.0, timeout: float = 120.0
) -> list[str]:
    """Stop and remove every container of ``deployment`` on ``host`` that ``runtime`` holds:
    those with pdlaunch's deployment label and pdlaunch's name for the process their process
    label names, whether or not any record, cid file or `run` client still points at them
    (a client killed, a host rebooted into a running container, a record lost). Proves each
    gone; returns the ids removed. HostError when one survives or the runtime cannot say."""
    _known_runtime(host, runtime)
    ref = ContainerRef(runtime, "", "/dev/null", deployment, "")
    res = host.run(_prelude(ref, grace) + script("container-sweep.sh"), timeout=grace + timeout)
    out = res.stdout.strip()
    if res.rc != 0 or not out.startswith("removed"):
        why = (res.stderr.strip() or out or f"rc={res.rc}")[:500]
        raise HostError(
            f"{host.name}: cannot remove the containers of {deployment}: {why}", host=host.name
        )
    return out.split()[1:]


def of_deployment(
    host: Host, runtime: str, deployment: str, timeout: float = 60.0
) -> list[tuple[str, str, str]]:
    """Every container of ``deployment`` that ``runtime`` holds on ``host``, found as
    :func:`sweep` finds them: (id, process, status). HostError when the runtime cannot say."""
    _known_runtime(host, runtime)
    ref = ContainerRef(runtime, "", "/dev/null", deployment, "")
    res = host.run(_prelude(ref) + script("container-list.sh"), timeout=timeout)
    lines = res.stdout.splitlines()
    if res.rc != 0 or not lines or lines[-1] != "end":
        why = (res.stderr.strip() or f"rc={res.rc}")[:500]
        raise HostError(f"{host.name}: cannot ask {runtime} about {deployment}: {why}",
                        host=host.name)  # fmt: skip
    out = []
    for line in lines[:-1]:
        parts = line.split()
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
    return out


def missing_images(host: Host, wanted: list[tuple[str, str]], timeout: float = 60.0) -> list[str]:
    """Of ``wanted`` (runtime, image) pairs, one message per image the node's runtime does not
    have (or a runtime that is missing or does not answer), in one command."""
    if not wanted:
        return []
    checks = [f"_missing_image {shlex.quote(rt)} {shlex.quote(img)}" for rt, img in wanted]
    res = host.run("\n".join([script("containers.sh"), *checks, "true"]), timeout=timeout)
    if res.rc != 0:
        raise HostError(f"{host.name}: cannot check images: {res.stderr.strip()}", host=host.name)
    out = []
    for line in res.stdout.splitlines():
        rt, img, why = [*line.split("\t", 2), "", ""][:3]
        out.append(f"image {img} is not on {host.name} ({rt}: {why.strip() or 'not found'})")
    return out


def plan_images(
    procs: Sequence[Process], host_of: Callable[[Process], Host]
) -> list[tuple[str, str]]:
    """(host, message) for each image a node lacks, for the processes ``procs`` (the plan's
    Process objects) that run in a docker/podman container; ``host_of(process)`` gives the
    connected Host. One command per node, nodes in turn (a handful of nodes: no pool)."""
    by_host: dict[str, tuple[Host, list[tuple[str, str]]]] = {}
    for p in procs:
        c = p.container
        if c is None or c.runtime not in ENGINE_RUNTIMES:
            continue
        host = host_of(p)
        entry = by_host.setdefault(p.host, (host, []))
        if (c.runtime, c.image) not in entry[1]:
            entry[1].append((c.runtime, c.image))
    out: list[tuple[str, str]] = []
    for name, (host, wanted) in by_host.items():
        try:
            out += [(name, msg) for msg in missing_images(host, wanted)]
        except HostError as exc:
            out.append((name, str(exc)))
    return out
