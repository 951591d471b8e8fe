"""Issue 32, class 5, against the real parser: podman reads `extra_args` the way
pdlaunch/spec/run_flags.py says it does. Each spelling is given to a real ``podman create``
(the same pflag flags as ``run``, minus ``-d`` and ``--rm``; nothing starts) of an empty image
made for the test, and what podman stored (``podman inspect``) is compared with what the
parser read: combined letters (``-itp8000:8000`` is -i, -t and a publish), a valued letter
taking the rest of its word (``-v/tmp:/mnt`` is one mount, not the letters v, /, t...) or the
next word whatever it is (``-e -d``: -d is -e's value, not a flag), ``-x=value``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from pdlaunch.spec import run_flags


def _podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip("needs rootful podman (scripts/install.sh; CI runs as root)")
    tar = tmp_path_factory.mktemp("empty-image") / "empty.tar"
    subprocess.run(["tar", "cf", str(tar), "--files-from", "/dev/null"], check=True)
    name = f"localhost/pdl-flags-{uuid.uuid4().hex[:8]}:1"
    res = _podman("import", "-q", str(tar), name)
    assert res.returncode == 0, res.stderr
    yield name
    _podman("rmi", "-f", name)


def _created(image: str, args: list[str]) -> dict:
    name = f"pdl-flags-{uuid.uuid4().hex[:8]}"
    res = _podman("create", "--pull=never", "--name", name, *args, image, "/x")
    try:
        assert res.returncode == 0, res.stderr
        [info] = json.loads(_podman("inspect", name).stdout)
        return info
    finally:
        _podman("rm", "-f", name)


def _read(args: list[str]) -> dict[str, list[str | None]]:
    out: dict[str, list[str | None]] = {}
    for f in run_flags.parse(args).flags:
        out.setdefault(f.flag, []).append(f.value)
    return out


CASES = {
    "-itp8000:8000": ["-itp8000:8000"],
    "-tip=8001:8001": ["-tip=8001:8001"],
    "-v/tmp:/mnt": ["-v/tmp:/mnt"],
    "-e -d": ["-e", "-d", "-lk=v"],
    "--publish=8002:8002 -ti": ["--publish=8002:8002", "-ti"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_podman_reads_each_spelling_as_the_parser_does(case: str, image: str):
    args = CASES[case]
    read = _read(args)
    info = _created(image, args)
    config, host = info["Config"], info["HostConfig"]
    assert config["Tty"] == ("--tty" in read)
    assert config["OpenStdin"] == ("--interactive" in read)
    ports = sorted(int(p.split("/")[0]) for p in (host.get("PortBindings") or {}))
    assert ports == sorted(int(v.split(":")[1]) for v in read.get("--publish", []) if v)
    mounts = [(m["Source"], m["Destination"]) for m in info["Mounts"]]
    assert mounts == [tuple(v.split(":")) for v in read.get("--volume", []) if v]
    labels = {k: v for k, v in (config.get("Labels") or {}).items() if not k.startswith("io.")}
    want = dict(v.split("=", 1) for v in read.get("--label", []) if v)
    assert {k: labels[k] for k in want} == want
    if "--env" in read:  # -e -d: -d was the value (a variable named -d, unset here: dropped)
        assert read["--env"] == ["-d"] and "--detach" not in read


def test_a_letter_podman_does_not_have_is_one_the_parser_calls_unknown(image: str):
    assert run_flags.parse(["-y"]).unknown == [(0, "-y")]
    res = _podman("create", "--pull=never", "-y", image, "/x")
    assert res.returncode != 0 and "unknown shorthand flag: 'y'" in res.stderr, res.stderr


def test_a_stray_word_is_the_image_to_podman(image: str, tmp_path: Path):
    """``--init extra``: --init takes no value, so podman takes ``extra`` as the image."""
    assert run_flags.parse(["--init", "extra"]).stray == [(1, "extra")]
    res = _podman("create", "--pull=never", "--init", "extra", image, "/x")
    assert res.returncode != 0 and "extra" in res.stderr, res.stderr
