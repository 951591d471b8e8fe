"""`pdlaunch check` of engines in a podman container, over real sshd: the software probes
(python/vLLM/NIXL versions, the model path) run inside the instance's image with the mounts
`up` gives it, so a node whose vLLM exists only in the image passes the preflight, and the
same image without vLLM fails naming the image and the processes.

The images are the container tests' skeleton (scripts/container-image.sh) plus, only inside,
/opt/pdl-venv: a `python` that runs this machine's interpreter with ``-S`` on a site dir of
chosen ``*.dist-info`` entries (what the versions probe reads); the host has no /opt/pdl-venv
and no /models/tiny, the path the model is mounted at.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from pdlaunch.check.results import Status
from pdlaunch.check.runner import run_check
from tests.support.check_over_ssh import (
    free_port,
    opts,
    plan_of,
    rows,
    ssh_of,
)

pytestmark = pytest.mark.ssh

BASE = os.path.realpath(sys.base_prefix)  # the interpreter's home, mounted read-only
VENV = "/opt/pdl-venv"


def _podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


def _image(tmp: Path, dists: dict[str, str]) -> str:
    """A skeleton image (as scripts/container-image.sh builds) with /opt/pdl-venv whose
    python sees exactly ``dists`` ({name: version})."""
    root = tmp / f"root-{uuid.uuid4().hex[:6]}"
    for d in ("usr", "etc", "tmp", "proc", "sys", "dev", "root", "run", "models"):
        (root / d).mkdir(parents=True)
    (root / "tmp").chmod(0o1777)
    for d in ("bin", "lib", "lib64", "sbin"):
        (root / d).symlink_to(f"usr/{d}")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    site = root / VENV.lstrip("/") / "site"
    for name, version in dists.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    site.mkdir(parents=True, exist_ok=True)
    py = root / VENV.lstrip("/") / "bin" / "python"
    py.parent.mkdir(parents=True)
    real = os.path.realpath(sys.executable)
    py.write_text(f'#!/bin/sh\nPYTHONPATH={VENV}/site exec {real} -S "$@"\n')
    py.chmod(0o755)
    tar = tmp / f"{root.name}.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(root, arcname=".")
    tag = f"localhost/pdl-check-in-image:{uuid.uuid4().hex[:8]}"
    res = _podman("import", "--change", 'CMD ["/bin/sh"]', str(tar), tag)
    assert res.returncode == 0, res.stderr
    return tag


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip("needs rootful podman (scripts/install.sh; CI runs as root)")
    tmp = tmp_path_factory.mktemp("images")
    made = {
        "with": _image(tmp, {"vllm": "0.32.0", "nixl": "0.7.1"}),
        "without": _image(tmp, {"nixl": "0.7.1"}),
    }
    yield made
    for tag in made.values():
        _podman("rmi", "-f", tag)


def _topology(tmp_path, model_dir, h, cluster, image: str, enabled: bool = True) -> dict:
    return {
        "deployment": f"chk-{uuid.uuid4().hex[:6]}",
        "model": {"name": "/models/tiny"},
        "hosts": {"127.0.0.1": {"local": False}},
        "defaults": {
            "ssh": ssh_of(h, cluster),
            "work_dir": str(tmp_path / "work"),
            "vllm_bin": f"{VENV}/bin/vllm",
            "container": {
                "image": image,
                "runtime": "podman",
                "enabled": enabled,
                "mounts": ["/usr:/usr:ro", f"{BASE}:{BASE}:ro", f"{model_dir}:/models/tiny:ro"],
            },
        },
        "prefill": [{"host": "127.0.0.1", "device": "cpu", "port": free_port(),
                     "side_channel_port": free_port()}],
        "decode": [{"host": "127.0.0.1", "device": "cpu", "port": free_port(),
                    "side_channel_port": free_port()}],
        "router": {"host": "127.0.0.1", "port": free_port(), "container": {"enabled": False}},
    }  # fmt: skip


def _check(tmp_path, topo, cluster, fast: bool = True):
    _, plan = plan_of(tmp_path, topo)
    return run_check(plan, opts(cluster, fast=fast))


def test_vllm_only_in_the_image_passes(
    tmp_path, model_dir, images, sshd_hosts, sshd_cluster
) -> None:
    (h,) = sshd_hosts(1)
    topo = _topology(tmp_path, model_dir, h, sshd_cluster, images["with"])
    report = _check(tmp_path, topo, sshd_cluster, fast=False)  # the argv dry-parse too
    (versions,) = rows(report, "versions")
    assert versions.status is Status.OK, versions
    assert "vllm 0.32.0, nixl 0.7.1" in versions.message
    assert images["with"] in versions.message and "prefill-0, decode-0" in versions.message
    assert versions.data["executable"].startswith("/") and versions.data["image"] == images["with"]
    (model,) = rows(report, "model.path")
    assert model.status is Status.OK, model  # through the container's mount
    # the image's vLLM answered the dry-parse (its distribution is there, its CLI is not)
    (argv,) = rows(report, "vllm.argv")
    assert argv.data["vllm"] == "0.32.0" and argv.data["image"] == images["with"], argv
    assert "CLI parser did not import" in argv.message
    # the host itself has neither: the same topology with the engines on the host fails
    host = _check(tmp_path, {**topo, "defaults": {**topo["defaults"], "container":
                  {**topo["defaults"]["container"], "enabled": False}}}, sshd_cluster)  # fmt: skip
    assert [r.status for r in rows(host, "versions")] == [Status.FAIL]
    assert "python not found on host" in rows(host, "versions")[0].message
    assert [r.status for r in rows(host, "model.path")] == [Status.FAIL]
    # no container of the check is left behind
    name = f"name=pdl-{topo['deployment']}"
    left = _podman("ps", "-a", "--format", "{{.Names}}", "--filter", name)
    assert left.stdout.strip() == ""


def test_vllm_missing_from_the_image_fails(
    tmp_path, model_dir, images, sshd_hosts, sshd_cluster
) -> None:
    (h,) = sshd_hosts(1)
    topo = _topology(tmp_path, model_dir, h, sshd_cluster, images["without"])
    report = _check(tmp_path, topo, sshd_cluster)
    (versions,) = rows(report, "versions")
    assert versions.status is Status.FAIL
    assert versions.message.startswith(f"in {images['without']} (prefill-0, decode-0): ")
    assert "vLLM not installed for" in versions.message


def test_image_not_on_the_node_fails_with_the_runtime_words(
    tmp_path, model_dir, images, sshd_hosts, sshd_cluster
) -> None:
    (h,) = sshd_hosts(1)
    gone = f"localhost/pdl-check-absent:{uuid.uuid4().hex[:8]}"
    report = _check(tmp_path, _topology(tmp_path, model_dir, h, sshd_cluster, gone), sshd_cluster)
    (versions,) = rows(report, "versions")
    assert versions.status is Status.FAIL
    assert f"podman could not run {gone} (rc=" in versions.message
    assert "`up` never pulls" in versions.fix
