"""Rules about `container:` settings: an image is named, the `run` flags pdlaunch manages are
not given twice, and what a device kind needs in a container (devices.py ContainerNeeds) is not
switched off or contradicted."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

from pdlaunch.plan.containers import DEFAULT_RUNTIME, settings
from pdlaunch.rules.base import SEED_ASCEND, SEED_HETERO, Finding, error, rule, warning
from pdlaunch.spec import run_flags, slurm_args
from pdlaunch.spec.devices import RDMA_DEVICES, profile
from pdlaunch.spec.load import FieldPath
from pdlaunch.spec.topology import Container, Instance, Topology

SOURCE = "pdlaunch render (containers.py run_argv)"
SRUN_SOURCE = "man srun (Slurm 22.05.8), pyxis args.c; pdlaunch/spec/slurm_args.py"
RUN_FLAGS = "docker 28.2.2 / podman 4.3.1 `run --help` (pflag), pdlaunch/spec/run_flags.py"
# Flags the rendered `run` sets itself: giving them again would break what `down` relies on
# (--name, --cidfile, foreground) or contradict the planned host ports. Keyed by long name:
# every spelling (-d, -dit, -d=true, --detach=true) is read as its flag first (run_flags).
MANAGED = {
    "--name": "the container is named pdl-<deployment>-<process> so status/down find it",
    "--cidfile": "down removes exactly the container whose id --cidfile wrote",
    "--rm": "rendered already",
    "--detach": "the engine runs in the script's foreground (pid, log and health tracking)",
    "--publish": "planned ports are host ports (--net=host); publishing means another network",
    "--publish-all": "every planned port is a host port (--net=host)",
    "--pull": "up checks the image on each node first; run never pulls (--pull=never)",
    "--entrypoint": "the plan's argv is the command; an entrypoint would run instead",
}
NETWORK = ("--net", "--network")
RDMA = RDMA_DEVICES[0]


def _once(fn: Callable[[Topology], Iterator[Finding]]) -> Callable[[Topology], Iterator[Finding]]:
    """A default's setting is every instance's: its finding is reported once."""

    @functools.wraps(fn)
    def wrapped(topo: Topology) -> Iterator[Finding]:
        seen: set[tuple[FieldPath, str]] = set()
        for f in fn(topo):
            if (f.field, f.message) not in seen:
                seen.add((f.field, f.message))
                yield f

    return wrapped


def _flag(arg: str) -> str:
    return arg.split("=", 1)[0]


def _value(args: list[str], i: int) -> str | None:
    arg = args[i]
    if "=" in arg:
        return arg.split("=", 1)[1]
    return args[i + 1] if i + 1 < len(args) else None


def _users(topo: Topology) -> Iterator[tuple[FieldPath, Container | None, Instance | None]]:
    for role, i, inst in topo.instances():
        yield (role, i, "container"), inst.container, inst
    yield ("router", "container"), topo.router.container, None


def _where(field: FieldPath, own: Container | None, key: str) -> FieldPath:
    """The field a finding points at: the instance's own setting if it has it, else the
    default's."""
    if own is not None and key in own.model_fields_set:
        return (*field, key)
    return ("defaults", "container", key)


@rule("container-image", "a process run in a container names its image", SOURCE)
@_once
def container_image(topo: Topology) -> Iterator[Finding]:
    for field, own, _ in _users(topo):
        c = settings(topo, own)
        if c is not None and not c.image:
            yield error(
                "container-image",
                (*field, "image") if own is not None else ("defaults", "container", "image"),
                "container settings without an image: nothing to run the engine in",
                "name the image (e.g. image: vllm/vllm-openai:v0.10.2), or set enabled: false "
                "to run this instance on the host",
                SOURCE,
            )


def _run_flags(c: Container) -> Iterator[tuple[str, str | None, str]]:
    """(flag's long name, value, the word it is written in) of each flag in
    ``extra_args``: as `docker/podman run` parse them (run_flags) for those runtimes; pyxis's
    are srun flags, named as written."""
    if c.runtime == "pyxis":
        args = c.extra_args
        for i, arg in enumerate(args):
            yield _flag(arg), _value(args, i), arg
        return
    for f in run_flags.parse(c.extra_args).flags:
        yield f.flag, f.value, c.extra_args[f.index]


def _srun_flags(where: FieldPath, c: Container) -> Iterator[Finding]:
    """pyxis's extra_args go onto each step's srun line after pdlaunch's own options (the
    last of a repeated one wins), before the node runner: read as srun reads them."""
    found = slurm_args.refusal(c.extra_args, slurm_args.SRUN)
    if found is not None:
        word, why = found
        yield error(
            "container-flags",
            where,
            f"extra_args (srun, pyxis) {word!r} {why}",
            f"remove {word} from container.extra_args",
            SRUN_SOURCE,
        )
    stray = slurm_args.read(c.extra_args, slurm_args.SRUN)[1]
    if stray:
        word = c.extra_args[stray[0]]
        yield error(
            "container-flags",
            where,
            f"extra_args (srun, pyxis) word {word!r} is not an option nor an option's value: "
            "srun stops reading options there and runs it as the step's command instead of "
            "the process pdlaunch planned",
            "write an option with its value in one word (--option=value), or remove the word",
            SRUN_SOURCE,
        )


def _read_as(flag: str, word: str) -> str:
    """The word as written, and the flag the runtime reads in it when that is not plain."""
    return word if word.partition("=")[0] == flag else f"{word} (read by the runtime as {flag})"


@rule("container-flags", "container extra_args leave pdlaunch's own run flags alone", SOURCE)
@_once
def container_flags(topo: Topology) -> Iterator[Finding]:
    for field, own, inst in _users(topo):
        c = settings(topo, own)
        if c is None:
            continue
        where = _where(field, own, "extra_args")
        needs = profile(inst.device).container if inst is not None else None
        runtime = c.runtime or DEFAULT_RUNTIME
        if runtime == "pyxis":
            yield from _srun_flags(where, c)
            continue
        for flag, value, word in _run_flags(c):
            said = _read_as(flag, word)
            if flag in MANAGED:
                yield error(
                    "container-flags",
                    where,
                    f"extra_args gives {said}: {MANAGED[flag]}",
                    f"remove {word} from container.extra_args",
                    SOURCE,
                )
            elif flag in NETWORK and value != "host":
                yield error(
                    "container-flags",
                    where,
                    f"{said} takes the container off the host network, but every port the "
                    "plan gives it (HTTP, KV side channel, DP RPC) is dialled on the host's "
                    "address",
                    f"remove {word}: pdlaunch renders --net=host",
                    f"{SOURCE}; {SEED_HETERO} (containers run with --net=host)",
                )
            elif flag == "--ipc" and value != "host" and inst and needs and needs.ipc_host:
                yield error(
                    "container-flags",
                    where,
                    f"{said}: a {inst.device} engine needs the host's IPC namespace "
                    "(shared memory of the KV transport)",
                    f"remove {word} (pdlaunch renders --ipc=host for {inst.device})",
                    needs.source,
                )
        parsed = run_flags.parse(c.extra_args)
        for _, letter in parsed.unknown:
            yield error(
                "container-flags",
                where,
                f"extra_args gives {letter}, which `{runtime} run` has no flag for (its "
                f"one-letter flags: {', '.join('-' + k for k in run_flags.SHORT)})",
                "spell the flag out (--name=value)",
                RUN_FLAGS,
            )
        if parsed.stray:
            _, word = parsed.stray[0]
            yield error(
                "container-flags",
                where,
                f"extra_args word {word!r} is not a flag nor a flag's value: `{runtime} run` "
                f"stops reading flags there and takes it as the image (the image {c.image} and "
                "the engine's command would become its arguments)",
                "write a flag with its value in one word (--flag=value), or remove the word",
                RUN_FLAGS,
            )


PYXIS = (
    "github.com/NVIDIA/pyxis args.c: --container-mounts=SRC:DST[:FLAGS][,SRC:DST...], "
    'mount flags "separated with +"'
)


@rule("container-pyxis-mounts", "a pyxis mount holds no comma", PYXIS)
@_once
def container_pyxis_mounts(topo: Topology) -> Iterator[Finding]:
    """pyxis takes every mount in one --container-mounts value and splits it at commas
    (containers.pyxis_flags joins them so): ``/data,/etc:/data`` would mount /data and /etc.
    Its mount flags are joined by ``+`` (``ro+rprivate``), so a comma there splits too."""
    for field, own, _ in _users(topo):
        c = settings(topo, own)
        if c is None or c.runtime != "pyxis":
            continue
        for m in c.mounts or []:
            if "," not in m:
                continue
            src, _, rest = m.partition(":")
            dst = rest.partition(":")[0]
            if "," in src or "," in dst:
                parts = m.split(",")
                why = f"pyxis splits it into {len(parts)} mounts ({', '.join(parts)})"
                fix = "mount a path without a comma (a parent directory, or a link to it)"
            else:
                why = "pyxis separates mount flags with +, so each word after a comma is read as "
                why += "another mount"
                fix = "keep one flag (e.g. :ro) on a pyxis mount"
            yield error(
                "container-pyxis-mounts",
                _where(field, own, "mounts"),
                f"mount {m!r} holds a comma: {why}",
                fix,
                PYXIS,
            )


def _gives(c: Container, *flags: str) -> bool:
    return any(flag in flags for flag, _, _ in _run_flags(c))


@rule(
    "container-device",
    "a container gets the devices and namespaces its device kind needs",
    f"{SEED_HETERO}; {SEED_ASCEND}",
)
@_once
def container_device(topo: Topology) -> Iterator[Finding]:
    """With device_flags: false the user writes every flag; what the device kind needs
    (devices.py) must still be there, by the guide's flags or an equivalent."""
    for field, own, inst in _users(topo):
        c = settings(topo, own)
        if c is None or inst is None or c.device_flags is not False:
            continue
        needs = profile(inst.device).container
        missing: list[str] = []
        if needs.privileged and not _gives(c, "--privileged"):
            given = {d.split(":")[0] for d in c.devices or []}
            if needs.devices:
                missing += [f"--device {d}" for d in needs.devices if d not in given]
            elif "ib" in (profile(inst.device).ucx_tls or "").split(",") and not any(
                d == RDMA or d.startswith(RDMA + "/") for d in given
            ):
                missing.append(f"--privileged or --device {RDMA} (RDMA for UCX ib/rc)")
        if needs.ipc_host and not _gives(c, "--ipc"):
            missing.append("--ipc=host")
        if missing:
            yield error(
                "container-device",
                _where(field, own, "device_flags"),
                f"device_flags is false, and the container of this {inst.device} instance "
                f"lacks what the device needs: {'; '.join(missing)}",
                "add them to container.devices / extra_args, or drop device_flags: false "
                "(pdlaunch then adds them)",
                needs.source,
            )


@rule("container-model-mount", "the model path is mounted into the container", SOURCE)
@_once
def container_model_mount(topo: Topology) -> Iterator[Finding]:
    for field, own, inst in _users(topo):
        c = settings(topo, own)
        if c is None or inst is None or not c.image:
            continue
        path = inst.model_path or topo.model.name
        if not path.startswith("/"):
            continue  # a Hugging Face id: fetched (or cached) inside
        own_mounts = [*(c.mounts or []), *profile(inst.device).container.mounts]
        mounts = [m.split(":")[1] for m in own_mounts]
        if not any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts):
            yield warning(
                "container-model-mount",
                _where(field, own, "mounts"),
                f"the model path {path} is under none of the container's mounts: it must be "
                f"in the image {c.image}",
                f"mount it, e.g. mounts: ['{path}:{path}:ro']",
                SOURCE,
            )
