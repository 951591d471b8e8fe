"""pdlaunch.hosts.containers against the real rootful podman (scripts/install.sh), with
`sleep` containers of the test image (scripts/container-image.sh): removal by the cid file
and by name + labels, never a same-named stranger, proof of removal, state, image checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from pdlaunch.hosts import HostError, LocalHost
from pdlaunch.hosts import containers as ctr
from pdlaunch.hosts.containers import ContainerRef

IMAGE = "localhost/pdlaunch-engine:test"


def _podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def ready() -> None:
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip("needs rootful podman (scripts/install.sh)")
    if _podman("image", "exists", IMAGE).returncode != 0:
        pytest.skip(f"{IMAGE} is missing (scripts/container-image.sh)")


@pytest.fixture
def ref(tmp_path: Path, ready: None):
    dep = f"t-{uuid.uuid4().hex[:8]}"
    r = ContainerRef("podman", f"pdl-{dep}-decode-0", str(tmp_path / "decode-0.cid"), dep,
                     "decode-0")  # fmt: skip
    yield r
    for c in _podman("ps", "-a", "-q", "--filter", f"name={dep}").stdout.split():
        _podman("rm", "-f", "-t", "0", c)


def _start(ref: ContainerRef, *, cidfile: bool = True, labels: bool = True, name: str = "") -> str:
    argv = ["run", "-d", "--name", name or ref.name, "--net=host", "-v", "/usr:/usr:ro"]
    if cidfile:
        argv += ["--cidfile", ref.cid_path]
    if labels:
        argv += ["--label", f"pdlaunch.deployment={ref.deployment}",
                 "--label", f"pdlaunch.process={ref.process}"]  # fmt: skip
    res = _podman(*argv, IMAGE, "/usr/bin/sleep", "600")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def _exists(cid: str) -> bool:
    return _podman("container", "exists", cid).returncode == 0


def test_remove_by_cid_file_proves_it_gone(ref: ContainerRef) -> None:
    cid = _start(ref)
    host = LocalHost()
    assert ctr.state(host, ref) == "running"
    assert ctr.remove(host, ref, grace=1) == [cid]
    assert not _exists(cid) and not Path(ref.cid_path).exists()
    assert ctr.state(host, ref) == "none"
    assert ctr.remove(host, ref, grace=1) == []  # idempotent


def test_remove_finds_a_labelled_container_without_cid_file(ref: ContainerRef) -> None:
    cid = _start(ref, cidfile=False)  # a start cut short before the id reached the file
    assert ctr.remove(LocalHost(), ref, grace=1) == [cid]
    assert not _exists(cid)


def test_a_same_named_stranger_is_never_touched(ref: ContainerRef) -> None:
    cid = _start(ref, cidfile=False, labels=False)
    host = LocalHost()
    assert ctr.state(host, ref) == "none"
    assert ctr.remove(host, ref, grace=1) == []
    assert _exists(cid)


def test_a_damaged_cid_file_is_refused(ref: ContainerRef) -> None:
    Path(ref.cid_path).write_text("$(reboot)\n")
    with pytest.raises(HostError, match="does not hold a container id"):
        ctr.remove(LocalHost(), ref, grace=1)


def test_a_runtime_that_cannot_answer_proves_nothing(ref: ContainerRef, tmp_path: Path) -> None:
    cid = _start(ref)
    broken = ContainerRef(str(tmp_path / "no-such-runtime"), ref.name, ref.cid_path,
                          ref.deployment, ref.process)  # fmt: skip
    with pytest.raises(HostError):
        ctr.remove(LocalHost(), broken, grace=1)
    assert _exists(cid) and Path(ref.cid_path).exists()


def test_missing_images_name_node_and_image(ready: None) -> None:
    host = LocalHost()
    out = ctr.missing_images(host, [("podman", IMAGE), ("podman", "localhost/absent-xyz:1")])
    assert len(out) == 1 and "localhost/absent-xyz:1" in out[0] and host.name in out[0]
    (msg,) = ctr.missing_images(host, [("no-such-runtime-xyz", IMAGE)])
    assert "no-such-runtime-xyz" in msg


def test_a_huge_cid_file_is_neither_read_whole_nor_echoed(ref: ContainerRef) -> None:
    # 3 MB of hex digits passed the old hex check and reached one error line whole.
    cid = _start(ref)
    Path(ref.cid_path).write_text("a" * 3_000_000)
    host = LocalHost()
    with pytest.raises(HostError, match="does not hold a container id") as caught:
        ctr.remove(host, ref, grace=1)
    assert len(str(caught.value)) < 2_000, len(str(caught.value))
    assert _exists(cid)  # nothing was removed on a damaged file's word
    # state falls back to the labelled container, without reading the file whole either
    assert ctr.state(host, ref) == "running"
    Path(ref.cid_path).write_text(cid[:63] + "\n")  # one digit short: no container id either
    with pytest.raises(HostError, match="does not hold a container id"):
        ctr.remove(host, ref, grace=1)
    Path(ref.cid_path).write_text(cid)
    assert ctr.remove(host, ref, grace=1) == [cid]
