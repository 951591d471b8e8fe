"""Engine pods of the Kubernetes export (pdlaunch.backends.k8s.manifests): each process's container,
its argv and env with what names one machine replaced by what Kubernetes gives the pod
(docs/k8s-export.md), its ports, probes and pod template."""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from pdlaunch.backends.k8s.model import (
    CLUSTER_DOMAIN,
    LWS_LEADER_ADDRESS,
    LWS_WORKER_INDEX,
    Context,
    EnvRef,
    ExportError,
    Manifest,
    PodDns,
    Token,
    WorkerRank,
)
from pdlaunch.kv import progress
from pdlaunch.plan.build import Process
from pdlaunch.plan.containers import ContainerSpec
from pdlaunch.plan.env import VISIBLE_DEVICE_VARS
from pdlaunch.plan.ports import PortKind
from pdlaunch.spec import facts
from pdlaunch.spec.addresses import is_unspecified
from pdlaunch.spec.devices import device_kinds, profile

# Extended resources the vendors' device plugins advertise, one unit per device (devices.py
# ContainerNeeds.k8s_resource: NVIDIA k8s-device-plugin, the Intel Gaudi device plugin, the
# Ascend device plugin). A CPU instance asks for none: its cores are the kubelet's to give.
DEVICE_RESOURCES: dict[str, str | None] = {
    kind: profile(kind).container.k8s_resource for kind in device_kinds()
}


@dataclass(frozen=True)
class _PluginGives:
    """What a device kind's device plugin, with the container runtime it drives, gives a pod
    by itself: the kind's own `docker run` equivalents (devices.py ContainerNeeds) are left
    out of the pod, as keeping them would hand it every device of its node."""

    devices: frozenset[str] = frozenset()
    mounts: frozenset[str] = frozenset()
    env: frozenset[str] = frozenset()
    unprivileged: bool = False  # privileged would lift the device cgroup the runtime sets
    why: str = ""


_ASCEND = profile("npu").container
_PLUGIN_GIVES: dict[str, _PluginGives] = {
    # Ascend Device Plugin passes the NPUs the scheduler chose to Ascend Docker Runtime in an
    # environment variable (hiascend.com MindCluster 7.0.RC1 clustersched/dlug/mxdlug_005:
    # "component functions"); the runtime mounts those davinci devices with davinci_manager,
    # devmm_svm, hisi_hdc, the driver, dcmi and npu-smi, and limits the container's device
    # cgroup to them (mindx-dl 5.0.0 dockerruntime/dlruntime_ug_013, toolboxug_000101).
    "npu": _PluginGives(
        devices=frozenset(_ASCEND.devices),
        mounts=frozenset(m for m in _ASCEND.mounts if m.split(":")[0] != "/usr/local/sbin"),
        unprivileged=True,
        why="the Ascend Device Plugin and Ascend Docker Runtime mount the pod's own NPUs, "
        "their management devices and the driver, so the guide's device nodes, /dev, driver "
        "mounts and --privileged (which would show every NPU of the node) are left out",
    ),
    # habana-container-runtime mounts every Gaudi of the node when HABANA_VISIBLE_DEVICES is
    # "all" (cmd/habana-container-runtime/specs.go filterDevicesByENV); the device plugin
    # names the pod's own.
    "hpu": _PluginGives(
        env=frozenset({"HABANA_VISIBLE_DEVICES"}),
        why="HABANA_VISIBLE_DEVICES=all is not set in pods: habana-container-runtime would "
        "mount every Gaudi of the node; the device plugin names the pod's own",
    ),
}


def pod_container_spec(proc: Process, notes: dict[str, None]) -> ContainerSpec | None:
    """The process's topology `container:` as a pod runs it: without what the device plugin
    gives the pod itself (_PLUGIN_GIVES)."""
    spec = proc.container
    gives = _PLUGIN_GIVES.get(proc.device or "cpu")
    if spec is None or gives is None:
        return spec
    update = {
        "devices": [d for d in spec.devices if d not in gives.devices],
        "mounts": [m for m in spec.mounts if m not in gives.mounts],
        "env": {k: v for k, v in spec.env.items() if k not in gives.env},
        "privileged": spec.privileged and not gives.unprivileged,
    }
    out = spec.model_copy(update=update)
    if out != spec:
        notes[f"{proc.role}: {gives.why}"] = None
    return out


# The variables the plan derives for one machine's devices, cores or interfaces. In a pod the
# device plugin exposes only the pod's own devices (renumbered from 0) and the kubelet owns
# the cores, so the host's values would point at the wrong ones.
_HOST_BOUND_ENV: dict[str, str] = {
    **{var: "the device plugin exposes only the pod's own devices" for var in VISIBLE_DEVICE_VARS},
    "VLLM_CPU_OMP_THREADS_BIND": "the kubelet assigns a pod's cores; vLLM binds within them",
    # The shim's directory is a path on the machine that planned it, not in the image.
    progress.ENV_VAR: "the NIXL progress shim is not in the image (docs/cpu-pd-recipe.md, "
    "gotcha 7); NIXL's progress thread spins a core per pod",
}
# nodeenv.py pins UCX to loopback for instances that share one machine; pods talk over the
# pod network.
_LOOPBACK_UCX = ("UCX_NET_DEVICES", "lo")
# Where the NIXL side channel listens and what decode dials (nixl/base_scheduler.py:348).
_SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
# Downward-API values a container can be given as variables.
_NAMESPACE = "POD_NAMESPACE"
_FIELD_REFS = {"POD_IP": "status.podIP", _NAMESPACE: "metadata.namespace"}

PORT_NAMES: dict[PortKind, str] = {
    "http": "http",
    "nixl_side_channel": "nixl",
    "dp_rpc": "dp-rpc",
    "mooncake_kv": "mooncake",
    "router_http": "http",
    "router_metrics": "metrics",
}
# IANA service name: what a container port's name must be (15 characters at most).
_PORT_NAME = re.compile(r"(?=.*[a-z])(?!.*--)[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?")

# vLLM, PyTorch and NCCL share tensors between processes through /dev/shm, which container
# runtimes cap at 64 MiB.
_SHM_VOLUME = {"name": "dshm", "emptyDir": {"medium": "Memory"}}
_SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


# -- argv and env ----------------------------------------------------------------------------


def literal(value: str) -> str:
    # The kubelet expands $(VAR) in command, args and env values, and reads $$ as $
    # (kubernetes third_party/forked/golang/expansion/expand.go): a plan value passes as is.
    return value.replace("$", "$$")


def substitute(
    argv: list[str], args: list[facts.Arg], new: Mapping[str, Token], drop: frozenset[str]
) -> list[Token]:
    """`argv` with the values of the options in `new` replaced and those in `drop` removed."""
    at = {a.index: a for a in args if a.dest in new or a.dest in drop}
    out: list[Token] = []
    i = 0
    while i < len(argv):
        a = at.get(i)
        if a is None:
            out.append(argv[i])
            i += 1
            continue
        inline = "=" in argv[i]
        if a.dest in new:
            out += [a.spelling, new[a.dest or ""]]
        i += 1 if inline else 1 + len(a.values)
    return out


def bind_to_pod_ip(proc: Process, bind: str, notes: dict[str, None]) -> EnvRef:
    # One address of its own machine: in a pod, that is the pod's IP (loopback would keep the
    # router and the probes out).
    notes[f"{proc.role}: --host {bind} becomes the pod's IP"] = None
    return EnvRef("POD_IP")


def _engine_argv(proc: Process, ctx: Context, notes: dict[str, None]) -> list[Token]:
    args, _ = facts.scan(proc.argv, ctx.vllm[proc.name], start=1)
    opt = {a.dest: a for a in args if a.dest and a.values}
    new: dict[str, Token] = {}
    if "port" in opt and ctx.http_port is not None:
        new["port"] = str(ctx.http_port)
    if "host" in opt and not is_unspecified(opt["host"].values[0]):
        new["host"] = bind_to_pod_ip(proc, opt["host"].values[0], notes)
    if "data_parallel_address" in opt:
        new["data_parallel_address"] = EnvRef(LWS_LEADER_ADDRESS)
    if "data_parallel_start_rank" in opt:
        per_node = int(opt["data_parallel_size_local"].values[0])
        if int(opt["data_parallel_start_rank"].values[0]) != proc.node_index * per_node:
            raise ExportError(
                f"{proc.name}: --data-parallel-start-rank is not node index x "
                f"--data-parallel-size-local, which an LWS worker template cannot express"
            )
        new["data_parallel_start_rank"] = WorkerRank(per_node)
    return substitute(proc.argv, args, new, frozenset())


def container_command(
    argv: list[Token], path_prepend: Mapping[str, list[str]]
) -> tuple[list[str], list[str]]:
    """(command, args): the argv itself where the kubelet can resolve every reference, else
    a POSIX shell line (arithmetic for the start rank, prepending to an inherited path)."""
    if not path_prepend and not any(isinstance(t, WorkerRank) for t in argv):
        words = [_kubelet_word(t) for t in argv]
        return words[:1], words[1:]
    lines = [
        # Same form as templates/process.sh.j2: the image's own value stays after ours.
        f'export {var}={shlex.quote(":".join(dirs))}"${{{var}:+:${var}}}"'
        for var, dirs in path_prepend.items()
    ]
    # One option (with its value) per line, as render.command writes scripts for people.
    words: list[list[str]] = [[]]
    for i, t in enumerate(argv):
        if isinstance(t, str):
            if i > 0 and t.startswith("-") and words[-1]:
                words.append([])
            words[-1].append(shlex.quote(t))
        elif isinstance(t, EnvRef):
            words[-1].append(f'"${{{t.name}:?}}"')
        elif isinstance(t, PodDns):
            words[-1].append(f'{t.pod}.{t.service}."${{{_NAMESPACE}:?}}".svc.{CLUSTER_DOMAIN}')
        else:
            words[-1].append(f'"$(( ${{{LWS_WORKER_INDEX}:?}} * {t.per_node} ))"')
    lines.append("exec " + " \\\n    ".join(" ".join(w) for w in words))
    return ["/bin/sh", "-c"], [literal("\n".join(lines) + "\n")]


def _kubelet_word(t: Token) -> str:
    if isinstance(t, str):
        return literal(t)
    if isinstance(t, EnvRef):
        return f"$({t.name})"
    if isinstance(t, PodDns):
        return f"{t.pod}.{t.service}.$({_NAMESPACE}).svc.{CLUSTER_DOMAIN}"
    raise TypeError(t)  # a WorkerRank needs the shell (container_command checks)


def _env_refs(argv: list[Token]) -> set[str]:
    refs = {t.name for t in argv if isinstance(t, EnvRef)}
    if any(isinstance(t, PodDns) for t in argv):
        refs.add(_NAMESPACE)
    return refs


def _field_ref(var: str) -> Manifest:
    return {"name": var, "valueFrom": {"fieldRef": {"fieldPath": _FIELD_REFS[var]}}}


def container_env(
    proc: Process, argv: list[Token], secret: str, notes: dict[str, None]
) -> list[Manifest]:
    refs = _env_refs(argv)
    out = [_field_ref(var) for var in _FIELD_REFS if var in refs]
    for var, value in proc.env.items():
        if var in _HOST_BOUND_ENV:
            notes[f"{var} is not set in pods: {_HOST_BOUND_ENV[var]}"] = None
        elif (var, value) == _LOOPBACK_UCX:
            notes[
                f"{var}={value} is not set in pods: pods reach each other over the pod network"
            ] = None
        elif var == _SIDE_CHANNEL_HOST:
            out.append({"name": var, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        else:
            out.append({"name": var, "value": literal(value)})
    for var, source in proc.secret_env.items():
        out.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": source}}})
    return out


def container_ports(proc: Process, ctx: Context, side_channels: bool) -> list[Manifest]:
    kept = [p for p in proc.ports if side_channels or p.kind != "nixl_side_channel"]
    count = Counter(p.kind for p in kept)
    seen: Counter[str] = Counter()
    out = []
    for p in kept:
        name = PORT_NAMES[p.kind]
        if count[p.kind] > 1:
            name = f"{name}-{seen[p.kind]}"
            seen[p.kind] += 1
        if not _PORT_NAME.fullmatch(name):
            raise ExportError(f"{proc.name}: {name!r} is not a valid container port name")
        port = ctx.http_port if p.kind == "http" and ctx.http_port is not None else p.port
        out.append({"name": name, "containerPort": port, "protocol": "TCP"})
    return out


def probes(health_url: str, startup: bool) -> Manifest:
    get = {"path": urlsplit(health_url).path or "/", "port": "http"}
    out: Manifest = {}
    if startup:
        # Loading weights (and compiling) takes minutes to an hour; liveness starts after it.
        out["startupProbe"] = {"httpGet": get, "periodSeconds": 10, "failureThreshold": 360}
    out["readinessProbe"] = {"httpGet": get, "periodSeconds": 10, "failureThreshold": 3}
    # A busy engine answers /health late; restart only after two minutes without an answer.
    out["livenessProbe"] = {
        "httpGet": get,
        "periodSeconds": 30,
        "timeoutSeconds": 10,
        "failureThreshold": 4,
    }
    return out


def engine_container(
    proc: Process, ctx: Context, image: str, side_channels: bool, notes: dict[str, None]
) -> Manifest:
    argv = _engine_argv(proc, ctx, notes)
    shim = str(progress.SHIM_DIR)
    prepend = {k: [d for d in v if d != shim] for k, v in proc.path_prepend.items()}
    command, args = container_command(argv, {k: v for k, v in prepend.items() if v})
    container: Manifest = {
        "name": "vllm",
        "image": image,
        "command": command,
        "args": args,
        "env": container_env(proc, argv, ctx.secret, notes),
        "ports": container_ports(proc, ctx, side_channels),
    }
    resource = DEVICE_RESOURCES[proc.device or "cpu"]
    if resource:
        container["resources"] = {"limits": {resource: len(proc.devices)}}
    if proc.health_url:
        container.update(probes(proc.health_url, startup=True))
    container["volumeMounts"] = [_SHM_MOUNT]
    spec = pod_container_spec(proc, notes)
    if spec is not None:
        apply_container_spec(container, spec)
    return container


def _volume_name(i: int) -> str:
    return f"host-{i}"


def _host_paths(spec: ContainerSpec) -> list[tuple[str, str, bool]]:
    """(host path, container path, read-only) of each mount and device node."""
    out = []
    for m in spec.mounts:
        parts = m.split(":")
        out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    for d in spec.devices:
        parts = d.split(":")
        out.append(
            (parts[0], parts[1] if len(parts) > 1 and parts[1].startswith("/") else parts[0], False)
        )
    return out


def apply_container_spec(container: Manifest, spec: ContainerSpec) -> None:
    """The topology's `container:` as container fields: its mounts and device nodes mounted
    from hostPath volumes (pod_template adds them), --privileged as the security context,
    the device kind's variables. The pod keeps its own network (pods dial each other's
    address)."""
    for i, (_, dst, ro) in enumerate(_host_paths(spec)):
        mount: Manifest = {"name": _volume_name(i), "mountPath": dst}
        if ro:
            mount["readOnly"] = True
        container["volumeMounts"].append(mount)
    if spec.privileged:
        container["securityContext"] = {"privileged": True}
    if spec.env:
        extra = [{"name": k, "value": literal(v)} for k, v in spec.env.items()]
        container["env"] = [*container["env"], *extra]


def _k8s_quantity(size: str) -> str:
    # docker's 500g is Kubernetes' 500Gi (docker sizes are binary multiples).
    unit = size[-1].lower()
    if not unit.isalpha():
        return size
    return size[:-1] + {"b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[unit]


def host_path_volumes(spec: ContainerSpec) -> list[Manifest]:
    """The hostPath volumes :func:`apply_container_spec`'s mounts name."""
    return [
        {"name": _volume_name(i), "hostPath": {"path": src}}
        for i, (src, _, _) in enumerate(_host_paths(spec))
    ]


def pod_template(
    container: Manifest, pod_labels: dict[str, str], spec: ContainerSpec | None = None
) -> Manifest:
    """A pod of ``container``; ``spec``: its topology `container:` (hostPath volumes, the
    size of /dev/shm)."""
    shm: Manifest = {"name": _SHM_VOLUME["name"], "emptyDir": dict(_SHM_VOLUME["emptyDir"])}
    if spec is not None and spec.shm_size:
        shm["emptyDir"]["sizeLimit"] = _k8s_quantity(spec.shm_size)
    volumes: list[Manifest] = [shm]
    if spec is not None:
        volumes += host_path_volumes(spec)
    return {
        "metadata": {"labels": dict(pod_labels)},
        "spec": {"containers": [container], "volumes": volumes},
    }
