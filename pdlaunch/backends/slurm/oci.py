"""Slurm's own OCI containers (``slurm.container_support: oci``): what a step of a process in a
container is run with, and what the bundle it names must hold.

Facts, from Slurm's containers guide (slurm.schedmd.com/containers.html; doc/html/
containers.shtml in SchedMD/slurm) and srun(1) of Slurm 22.05.8 (Debian 12's slurm-client,
``--container=<path_to_container>``: "Absolute path to OCI container bundle"; copied in
tests/fixtures/slurm/srun-container.txt), summed up in docs/slurm-containers.md:

* ``srun --container PATH`` runs the step in the OCI bundle at PATH (Slurm 21.08+), started
  by the OCI runtime the node's oci.conf names (RunTimeRun/RunTimeCreate, ``%b`` = PATH);
  without an oci.conf on the node the request is ignored ("Known limitations").
* Slurm does not transfer the bundle: it must exist at PATH on every node; so a bundle
  directory (config.json + rootfs, e.g. ``umoci unpack``) on shared storage, never an image
  name, which only pyxis pulls.
* Containers run unprivileged (rootless) on the host network; there is no srun flag for
  mounts, devices, shm or the working directory: the bundle's config.json (its ``mounts``,
  ``linux.devices``, ``linux.namespaces``, ``process.cwd``) or the site's RunTimeRun wrapper
  decides them (sites with ``IgnoreFileConfigJson=true`` run PATH without reading its
  config.json). The step's environment is handed in (seen on 22.05.8, see :func:`oci_flags`).

So the topology's `container:` maps to one flag; what it asks beyond the image is checked
against the bundle's config.json where this machine sees it (:func:`bundle_findings`), and
what no bundle can carry (pyxis's ``extra_args``) is refused.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Iterator
from typing import Any

from pdlaunch.fsutil import ReadRefused, read_json_bounded
from pdlaunch.plan.build import Plan, Process
from pdlaunch.plan.containers import ContainerSpec
from pdlaunch.rules.base import Finding, error, warning
from pdlaunch.spec.slurm_options import SlurmError, SlurmOptions

GUIDE = "https://slurm.schedmd.com/containers.html"
SRUN = "https://slurm.schedmd.com/srun.html#OPT_container"
RULE = "slurm-oci-bundle"
FIELD = ("slurm", "oci_bundles")
#: config.json of a bundle is a few KiB; a larger file is not one
MAX_CONFIG = 4 << 20


def uses_oci(p: Process, opts: SlurmOptions) -> bool:
    """The process's step runs in Slurm's own OCI container."""
    c = p.container
    return c is not None and c.runtime == "pyxis" and opts.container_support == "oci"


def bundle_of(p: Process, opts: SlurmOptions) -> str:
    """The bundle path of ``p``'s image (SlurmError saying what to provide when none)."""
    c = p.container
    assert c is not None
    bundle = opts.oci_bundles.get(c.image)
    if bundle is None:
        raise SlurmError(
            f"{p.name}: image {c.image} has no OCI bundle: Slurm's own containers "
            "(slurm.container_support: oci) run a bundle directory already on every node "
            f"(srun --container=PATH; Slurm pulls and copies nothing, {GUIDE}). Unpack the "
            f"image on shared storage (skopeo copy docker://IMAGE oci:img:tag; umoci unpack "
            f"--rootless --image img:tag /shared/bundles/NAME) and name it in slurm.oci_bundles: "
            f"{{{json.dumps(c.image)}: /shared/bundles/NAME}}"
        )
    return bundle


def oci_flags(p: Process, opts: SlurmOptions) -> tuple[str, ...]:
    """srun's flags for ``p``'s step: ``--container=BUNDLE``; SlurmError for what the
    topology asks that no srun flag carries."""
    c = p.container
    assert c is not None
    # pass_env needs no flag: Slurm hands the step's environment (srun --export=ALL) to the
    # container over config.json's process.env, the step's value winning (seen on Slurm 22.05.8
    # with runc: a variable of the submitting shell inside, the image's PATH replaced, its other
    # variables kept), as pyxis's --container-env does; a node's oci.conf EnvExclude may drop some.
    if c.extra_args:
        raise SlurmError(
            f"{p.name}: container.extra_args ({' '.join(c.extra_args)}) are pyxis's srun flags; "
            "Slurm's own containers take only --container=BUNDLE (put the settings in the "
            "bundle's config.json), so drop them under slurm.container_support: oci"
        )
    return (f"--container={bundle_of(p, opts)}",)


# -- the bundle, where this machine sees it ------------------------------------------------------


def _binds(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, destination) of the config.json's bind mounts (runtime-spec config.md)."""
    out = []
    for m in config.get("mounts") or []:
        if not isinstance(m, dict):
            continue
        opts = m.get("options") or []
        if m.get("type") == "bind" or "bind" in opts or "rbind" in opts:
            out.append((str(m.get("source", "")), str(m.get("destination", ""))))
    return out


def _covered(src: str, dst: str, binds: list[tuple[str, str]]) -> bool:
    """A bind of ``src`` at ``dst``, or of a directory above both at the same relative place."""
    for msrc, mdst in binds:
        msrc, mdst = msrc.rstrip("/") or "/", mdst.rstrip("/") or "/"
        if dst == mdst and src.rstrip("/") == msrc:
            return True
        rel = posixpath.relpath(dst, mdst) if dst.startswith(mdst.rstrip("/") + "/") else None
        if rel and posixpath.join(msrc, rel) == src.rstrip("/"):
            return True
    return False


def _needed_binds(p: Process, c: ContainerSpec) -> list[tuple[str, str]]:
    """The binds the step needs: its work dir (scripts, logs) and the container's mounts."""
    out = [(p.work_dir, p.work_dir)]
    for mount in c.mounts:
        src, dst = mount.split(":")[:2]
        out.append((src, dst))
    return list(dict.fromkeys(out))


def _namespaces(config: dict[str, Any]) -> set[str]:
    linux = config.get("linux") or {}
    return {str(n.get("type")) for n in linux.get("namespaces") or [] if isinstance(n, dict)}


def _devices(config: dict[str, Any]) -> set[str]:
    linux = config.get("linux") or {}
    return {str(d.get("path")) for d in linux.get("devices") or [] if isinstance(d, dict)}


def _one_bundle(bundle: str, procs: list[Process]) -> Iterator[Finding]:
    names = ", ".join(p.name for p in procs)
    config_path = os.path.join(bundle, "config.json")
    if not os.path.exists(bundle):
        yield warning(
            RULE, FIELD,
            f"OCI bundle {bundle} ({names}) is not on this machine, so its config.json was not "
            "checked; every node must have it at that path (Slurm does not copy it)",
            "put the bundle on storage the nodes and this machine share, or check its "
            "config.json binds the work dirs and mounts by hand", GUIDE,
        )  # fmt: skip
        return
    if not os.path.exists(config_path):
        yield warning(
            RULE, FIELD,
            f"{bundle} ({names}) has no config.json: only a node whose oci.conf sets "
            "IgnoreFileConfigJson=true runs it, and its RunTimeRun wrapper decides the mounts "
            f"(the work dir {procs[0].work_dir} must be visible inside)",
            "make it an OCI bundle (umoci unpack), or check the site's wrapper binds the "
            "work dirs and mounts", GUIDE + "#bundle",
        )  # fmt: skip
        return
    try:
        config = read_json_bounded(config_path, MAX_CONFIG, what="OCI bundle config")
    except ReadRefused as exc:
        yield error(RULE, FIELD, str(exc), "regenerate it (runc spec --rootless)", GUIDE)
        return
    if not isinstance(config, dict):
        yield error(RULE, FIELD, f"{config_path} is not a JSON object", "regenerate it", GUIDE)
        return
    yield from _judge(config, config_path, procs)


def _judge(config: dict[str, Any], where: str, procs: list[Process]) -> Iterator[Finding]:
    binds, spaces, devices = _binds(config), _namespaces(config), _devices(config)
    process = config.get("process") if isinstance(config.get("process"), dict) else {}
    cwd = str(process.get("cwd") or "/")
    away = [p.name for p in procs if p.work_dir.rstrip("/") != cwd.rstrip("/")]
    if away:
        # srun --chdir (the driver's) does not reach the container: Slurm 22.05.8 with runc
        # started the step in config.json's process.cwd (tests/system/slurm/test_slurm_oci_steps)
        yield warning(
            RULE, FIELD,
            f"{', '.join(away)} start in {cwd} (the bundle's process.cwd), not in their work "
            "dir as under pyxis or SSH: srun's --chdir does not reach Slurm's containers",
            f"set process.cwd in {where} to the work dir ({procs[0].work_dir}) if the engine "
            "reads relative paths", GUIDE,
        )  # fmt: skip
    if "network" in spaces:
        yield error(
            RULE, FIELD,
            f"{where} gives the container its own network namespace, but every port the plan "
            "uses is a host port (and Slurm's containers work on the host network only)",
            'remove {"type": "network"} from linux.namespaces', GUIDE + "#limitations",
        )  # fmt: skip
    for p in procs:
        c = p.container
        assert c is not None
        missing = [(s, d) for s, d in _needed_binds(p, c) if not _covered(s, d, binds)]
        if missing:
            entries = ", ".join(
                json.dumps({"destination": d, "source": s, "type": "bind", "options": ["rbind"]})
                for s, d in missing
            )
            yield error(
                RULE, FIELD,
                f"{p.name}: {where} does not bind "
                f"{', '.join(f'{s} at {d}' for s, d in missing)}: srun has no mount flag, "
                "so the bundle must (the work dir holds the step's script and log)",
                f"add to its \"mounts\": {entries}", GUIDE + "#bundle",
            )  # fmt: skip
        lacking = [
            d.split(":")[0] for d in c.devices
            if d.split(":")[0] not in devices and not _covered("/dev", "/dev", binds)
        ]  # fmt: skip
        if lacking:
            yield error(
                RULE, FIELD,
                f"{p.name}: {where} gives the container none of {', '.join(lacking)} "
                "(neither in linux.devices nor a bind of /dev)",
                "add them to linux.devices or bind them in mounts", GUIDE + "#bundle",
            )  # fmt: skip
        if c.ipc_host and "ipc" in spaces:
            yield error(
                RULE, FIELD,
                f"{p.name}: its device kind shares the host's IPC (--ipc=host: UCX shared "
                f"memory), but {where} gives the container its own IPC namespace",
                'remove {"type": "ipc"} from linux.namespaces', GUIDE,
            )  # fmt: skip
        if c.privileged:
            yield warning(
                RULE, FIELD,
                f"{p.name}: its device kind runs privileged under docker (--privileged), which "
                "Slurm's rootless containers cannot: its accelerators must reach the container "
                "through the bundle (linux.devices, mounts) or the node's OCI runtime",
                "e.g. nvidia-container-runtime in oci.conf for CUDA (the guide's example)",
                GUIDE + "#example",
            )  # fmt: skip


def bundle_findings(plan: Plan, opts: SlurmOptions) -> list[Finding]:
    """What each bundle the job names lacks, read from its config.json where this machine
    sees it (the submitting machine shares the nodes' storage under Slurm)."""
    if opts.container_support != "oci":
        return []
    by_bundle: dict[str, list[Process]] = {}
    for p in plan.processes:
        if uses_oci(p, opts):
            c = p.container
            assert c is not None
            if c.image in opts.oci_bundles:
                by_bundle.setdefault(opts.oci_bundles[c.image], []).append(p)
    return [f for bundle, procs in by_bundle.items() for f in _one_bundle(bundle, procs)]
