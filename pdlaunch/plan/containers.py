"""Engines in containers: the topology's `container:` settings resolved per process into a
typed spec (the plan carries it), and what each runtime is given from it: the `docker/podman
run` argv the process script execs, pyxis's srun flags, a pod's fields.

The engine's own argv and env are the plan's, unchanged: the run argv only wraps them, and
passes every variable the script exports by name (``--env NAME``), so values are quoted once
(in the script's `export` lines) and a secret never appears on a command line.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from pdlaunch.spec.devices import profile
from pdlaunch.spec.topology import Container, Topology

ENGINE_RUNTIMES = ("docker", "podman")  # run by the process script itself (SSH, Slurm)
DEFAULT_RUNTIME = "docker"
LABEL_DEPLOYMENT = "pdlaunch.deployment"
LABEL_PROCESS = "pdlaunch.process"
LABEL_ROLE = "pdlaunch.role"


class ContainerSpec(BaseModel):
    """How one process runs in a container: everything `run` needs besides the plan's argv
    and env."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: str
    image: str
    # pdl-<deployment>-<process>: how `status`, `down` and a person find it.
    name: str
    labels: dict[str, str]
    # Always: every port pdlaunch plans (HTTP, NIXL side channel, DP RPC, Mooncake) is a host
    # port, and peers dial the host's address.
    network_host: bool = True
    ipc_host: bool = False
    privileged: bool = False
    devices: list[str] = []
    mounts: list[str] = []
    shm_size: str | None = None
    # Plain variables the device kind needs inside (devices.py), as NAME=VALUE.
    env: dict[str, str] = {}
    # Variables of the node's own environment passed in by name.
    pass_env: list[str] = []
    extra_args: list[str] = []
    # Where `run --cidfile` writes the container's id: what `down` removes, exactly.
    cid_path: str


def _merge(base: Container | None, own: Container | None) -> Container | None:
    """``own`` over ``base``: a scalar set in ``own`` wins, lists add (each entry once)."""
    if base is None or own is None:
        return own or base
    data = base.model_dump()
    for key, value in own.model_dump(exclude_unset=True).items():
        if isinstance(value, list):
            data[key] = list(dict.fromkeys([*(data.get(key) or []), *value]))
        elif value is not None:
            data[key] = value
    return Container(**data)


def settings(topo: Topology, own: Container | None) -> Container | None:
    """The container settings that apply to an instance (or the router) whose own are ``own``;
    None: it runs on the host."""
    merged = _merge(topo.defaults.container, own)
    if merged is None or merged.enabled is False:
        return None
    return merged


def container_name(deployment: str, process: str) -> str:
    return f"pdl-{deployment}-{process}"


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def spec(
    topo: Topology, own: Container | None, device: str | None, process: str, role: str,
    run_dir: str,
) -> ContainerSpec | None:  # fmt: skip
    """The spec of process ``process`` (the router: ``device`` None), or None without an
    image setting. A missing image is the container-image rule's error, not raised here."""
    c = settings(topo, own)
    if c is None or not c.image:
        return None
    needs = profile(device).container if device and c.device_flags is not False else None
    return ContainerSpec(
        runtime=c.runtime or DEFAULT_RUNTIME,
        image=c.image,
        name=container_name(topo.deployment, process),
        labels={
            LABEL_DEPLOYMENT: topo.deployment,
            LABEL_PROCESS: process,
            LABEL_ROLE: role,
        },
        ipc_host=bool(needs and needs.ipc_host),
        privileged=bool(needs and needs.privileged),
        devices=_dedupe([*(needs.devices if needs else ()), *(c.devices or [])]),
        mounts=_dedupe([*(needs.mounts if needs else ()), *(c.mounts or [])]),
        shm_size=c.shm_size or (needs.shm_size if needs else None),
        env=dict(needs.env) if needs else {},
        pass_env=list(c.pass_env),
        extra_args=list(c.extra_args),
        cid_path=posixpath.join(run_dir, f"{process}.cid"),
    )


def run_argv(c: ContainerSpec, env_names: Iterable[str]) -> list[str]:
    """`docker run` / `podman run` in the foreground (the script's pid stays the process
    pdlaunch tracks; the runtime forwards SIGTERM to the engine), removed when it exits,
    never pulling (`up` checked the image is on the node). ``env_names``: the variables the
    script exports, passed by name."""
    argv = [
        c.runtime, "run", "--rm", "--pull=never",
        "--name", c.name, "--cidfile", c.cid_path,
    ]  # fmt: skip
    for key, value in c.labels.items():
        argv += ["--label", f"{key}={value}"]
    return [*argv, *_run_flags(c, env_names), c.image]


def probe_argv(c: ContainerSpec, name: str, script: str) -> list[str]:
    """A one-shot `run` of ``c``'s image for `check`: the flags `up` gives the process
    (network, IPC, privileges, shm, devices, mounts, the device kind's variables, pass_env,
    extra_args), so a probe inside sees what the engine will; its own ``name`` and none of
    pdlaunch's labels or cidfile, so `status` and `down` never take it for the process. Its
    command is ``sh -c SCRIPT`` whatever the image's ENTRYPOINT (vllm/vllm-openai's is
    `vllm serve`): the probes need a shell, not the engine."""
    argv = [c.runtime, "run", "--rm", "--pull=never", "--name", name]
    return [*argv, *_run_flags(c, ()), "--entrypoint", "sh", c.image, "-c", script]


def _run_flags(c: ContainerSpec, env_names: Iterable[str]) -> list[str]:
    # one list for `up` and `check`: a flag added for the engine reaches the probes too
    argv: list[str] = []
    if c.network_host:
        argv.append("--net=host")
    if c.ipc_host:
        argv.append("--ipc=host")
    if c.privileged:
        argv.append("--privileged")
    if c.shm_size:
        argv += ["--shm-size", c.shm_size]
    for dev in c.devices:
        argv += ["--device", dev]
    for mount in c.mounts:
        argv += ["-v", mount]
    for key, value in c.env.items():
        argv += ["--env", f"{key}={value}"]
    for name in _dedupe([*env_names, *c.pass_env]):
        if name not in c.env:
            argv += ["--env", name]
    return [*argv, *c.extra_args]


def pyxis_flags(c: ContainerSpec) -> list[str]:
    """srun flags of the pyxis SPANK plugin (github.com/NVIDIA/pyxis, README "Usage"): the step
    itself runs in the image; host networking and IPC are enroot's defaults. Device nodes are
    the node's own (enroot keeps /dev)."""
    flags = [f"--container-image={c.image}", f"--container-name={c.name}"]
    mounts = [m for m in c.mounts if not m.startswith("/dev:")]
    if mounts:
        flags.append("--container-mounts=" + ",".join(mounts))
    # The process script runs inside and exports the plan's variables itself; only the
    # node's own variables named in pass_env must win over the image's.
    if c.pass_env:
        flags.append("--container-env=" + ",".join(c.pass_env))
    return flags + list(c.extra_args)


def env_names(env: Iterable[str], secret_env: Iterable[str], prepend: Iterable[str]) -> list[str]:
    """The variables a process script exports, in its order."""
    return _dedupe([*env, *prepend, *secret_env])


PREPEND_PREFIX = "PDLAUNCH_PREPEND_"


def prepend_var(key: str) -> str:
    """The variable that carries what the plan prepends to ``key`` (LD_LIBRARY_PATH) into a
    container, where it is prepended to the image's own value."""
    return PREPEND_PREFIX + key


def in_container_argv(argv: list[str], prepend_keys: list[str]) -> list[str]:
    """``argv`` as the container runs it: with path-like variables to prepend to, a `sh` in
    the image does it first (the image's value is only known inside), then execs argv."""
    if not prepend_keys:
        return list(argv)
    sets = "".join(
        f'export {k}="${{{prepend_var(k)}}}${{{k}:+:${k}}}"; unset {prepend_var(k)}; '
        for k in prepend_keys
    )
    return ["sh", "-c", sets + 'exec "$@"', "pdlaunch-env", *argv]
