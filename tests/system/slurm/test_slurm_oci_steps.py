"""Slurm's own OCI containers for real: a two-node Slurm 22.05 cluster of its own whose oci.conf
runs runc (Slurm's containers guide, "oci.conf example for runc using run"), a bundle made
here (a skeleton rootfs and the config.json `runc spec` writes, with the binds the step needs),
and `pdlaunch up --backend slurm` of the stand-in 1P1D with `slurm.container_support: oci`:
the engines start as `srun --container=BUNDLE` steps, pass health and the PD canary, run inside
the bundle's root filesystem, and `down` leaves no job, step or runc container.

Its own cluster, as oci.conf is read from slurm.conf's directory when slurmd starts: the
session's cluster (tests/support/slurm_fixtures.py) has none, and other tests must keep
running steps on the host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pdlaunch.backends.slurm import jobs
from pdlaunch.kv.progress import SHIM_DIR
from tests.support import slurm_lifecycle as slurm_rt
from tests.support.cli_runner import pdl
from tests.support.slurm_cluster import SlurmCluster, SlurmClusterError
from tests.support.slurm_specs import fake_spec, planned
from tests.support.sshd import free_ports

pytestmark = pytest.mark.slurm

IMAGE = "localhost/pdl-oci-test:1"


@pytest.fixture(scope="module")
def oci_cluster():
    if shutil.which("runc") is None:
        pytest.fail("runc not found: apt-get install runc (scripts/install.sh)", pytrace=False)
    root = Path(f"/run/pdl-oci-{uuid.uuid4().hex[:8]}")  # runc's state, this cluster's own
    cluster = SlurmCluster(nodes=2)
    # the guide's runc "run" example, as root (this cluster's SlurmdUser), its own --root
    r = f"runc --root={root}"
    (cluster.root / "oci.conf").write_text(
        f'RunTimeQuery="{r} state %n.%u.%j.%s.%t"\n'
        f'RunTimeKill="{r} kill -a %n.%u.%j.%s.%t"\n'
        f'RunTimeDelete="{r} delete --force %n.%u.%j.%s.%t"\n'
        f'RunTimeRun="{r} run %n.%u.%j.%s.%t -b %b"\n'
    )
    try:
        cluster.start()
    except SlurmClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster, root
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _bundle(path: Path, binds: list[tuple[str, bool]], cwd: str) -> Path:
    """A skeleton root filesystem (as scripts/container-image.sh builds) and `runc spec`'s
    config.json with ``binds`` (path, writable) added and the network and IPC namespaces
    dropped (host ports; the cpu kind's UCX shared memory)."""
    rootfs = path / "rootfs"
    for d in ("usr", "etc", "tmp", "proc", "sys", "dev", "root", "run", "var/tmp"):
        (rootfs / d).mkdir(parents=True)
    for d in ("tmp", "var/tmp"):
        (rootfs / d).chmod(0o1777)
    for d in ("bin", "lib", "lib64", "sbin"):
        (rootfs / d).symlink_to(f"usr/{d}")
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "etc/group").write_text("root:x:0:\n")
    subprocess.run(["runc", "spec"], cwd=path, check=True, timeout=30)
    config = json.loads((path / "config.json").read_text())
    config["root"]["readonly"] = False
    config["process"]["terminal"] = False
    config["process"]["cwd"] = cwd  # srun --chdir does not reach the container
    config["mounts"] += [
        {"destination": p, "source": p, "type": "bind", "options": ["rbind", "rw" if w else "ro"]}
        for p, w in binds
    ]
    linux = config["linux"]
    linux["namespaces"] = [n for n in linux["namespaces"] if n["type"] not in ("network", "ipc")]
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def _runc_list(root: Path) -> list[str]:
    """The containers runc holds under this cluster's --root (none: an empty list)."""
    res = subprocess.run(["runc", f"--root={root}", "list", "-q"], capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    return res.stdout.split()


def _engine_pids(bins: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(str(bins).encode() in c and b"fake-vllm" in c for c in cmd):
                out.append(int(d.name))
    return out


def test_up_runs_the_engines_in_the_bundle_and_down_leaves_nothing(
    oci_cluster, fake_bins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, runc_root = oci_cluster
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    bins = fake_bins["vllm"].parent
    venv = Path(sys.executable).parent.parent  # the stand-ins' interpreter, as in their shebang
    base = Path(os.path.realpath(sys.base_prefix))
    work = tmp_path / "work"
    # /etc/alternatives: Debian's awk (the node runner's) is a link through it
    # and the NIXL progress shim the plan mounts for CPU engines (plan/build.py _with_shim)
    ro = ["/etc/alternatives", *(str(p) for p in (bins, venv, base, SHIM_DIR))]
    bundle = _bundle(tmp_path / "bundle", [("/usr", False), *((p, False) for p in ro),
                                           (str(work), True)], str(work / "oci-fake"))  # fmt: skip
    spec = fake_spec("oci-fake", work, cluster.nodes, fake_bins,
                     free_ports("prefill", "decode", "side", "router", "metrics"))  # fmt: skip
    spec["defaults"]["container"] = {
        "image": IMAGE, "runtime": "pyxis", "mounts": [f"{p}:{p}:ro" for p in ["/usr", *ro]],
    }  # fmt: skip
    spec["router"]["container"] = {"enabled": False}
    spec["slurm"] = {"container_support": "oci", "oci_bundles": {IMAGE: str(bundle)}}
    path = tmp_path / "oci.yaml"
    planned(spec, path)

    r = pdl("validate", path, "--backend", "slurm", "--nodelist", ",".join(cluster.nodes))
    assert r.rc == 0 and "slurm-oci-bundle" not in r.output, r
    t = time.monotonic()
    r = pdl("up", path, "--backend", "slurm", "--nodelist", ",".join(cluster.nodes),
            "--time", "10", "--start-timeout", "120", "--timeout", "120", "--json")  # fmt: skip
    up_s = time.monotonic() - t
    try:
        assert r.rc == 0, r.stdout
        up = json.loads(r.stdout)
        assert up["ok"] and up["canary"]["ok"], up
        driver = (work / "oci-fake").parent.rglob("slurm-job.sh")
        text = next(driver).read_text()
        assert text.count(f"--container={bundle}") == 2, "both engine steps, not the router"
        pids = _engine_pids(bins)
        assert len(pids) == 2, pids
        # started where the bundle says (process.cwd, the work dir), with the step's variables
        assert {os.readlink(f"/proc/{p}/cwd") for p in pids} == {str(work / "oci-fake")}
        environ = Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
        assert any(v.startswith(b"SLURM_JOB_ID=") for v in environ)
        inside = os.stat(bundle / "rootfs" / "etc" / "passwd").st_ino
        # each engine's root is the bundle's rootfs, not this machine's /
        assert [os.stat(f"/proc/{p}/root/etc/passwd").st_ino for p in pids] == [inside] * 2
        assert os.stat("/etc/passwd").st_ino != inside
        listed = _runc_list(runc_root)
        assert len(listed) == 2, listed
        r = pdl("down", "oci-fake", "--backend", "slurm")
        assert r.rc == 0 and "nothing left" in r.stdout, r
    finally:
        slurm_rt.down("oci-fake")
    assert jobs.processes_under([str(work)]) == [] and _engine_pids(bins) == []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = _runc_list(runc_root)
        if not left:
            break
        time.sleep(0.5)
    assert left == [], f"runc containers left: {left}"
    print(f"up with two OCI steps: {up_s:.1f}s")
