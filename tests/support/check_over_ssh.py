"""Helpers of the `pdlaunch check` suites over real sshd hosts (tests/system/ssh/): ports no
plan of the session shares, an interpreter that sees chosen vllm/nixl versions, the topology's
ssh settings for a host, a planned topology, and the report rows of one probe."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from pdlaunch.check.report import CheckReport
from pdlaunch.check.results import CheckResult
from pdlaunch.check.runner import CheckOptions
from pdlaunch.hosts import ConnectOptions
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load
from tests.support.sshd import free_port as _free_port

_USED: set[int] = set()


def free_port() -> int:
    """A free port not handed out before in this session (plans must not share ports)."""
    while True:
        port = _free_port()
        if port not in _USED:
            _USED.add(port)
            return port


def fake_python(root: Path, name: str, vllm: str, nixl: str = "0.7.1") -> Path:
    """An interpreter that sees exactly the given vllm/nixl distributions: the real
    interpreter with ``-S`` (no site-packages) and PYTHONPATH -> fake ``*.dist-info``."""
    site = root / name / "site"
    for dist, ver in (("vllm", vllm), ("nixl", nixl)):
        info = site / f"{dist}-{ver}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {ver}\n")
    bindir = root / name / "bin"
    bindir.mkdir(parents=True)
    py = bindir / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    py.chmod(0o755)
    return py


def ssh_of(h, cluster) -> dict:
    return {
        "port": h.port,
        "user": cluster.user,
        "key": str(cluster.key_file),
        "connect_timeout": 5,
    }


def plan_of(tmp_path: Path, topo: dict):
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo, sort_keys=False))
    t, source = load(path)
    findings = validate(t, source)
    assert not has_errors(findings), [f.message for f in findings]
    return path, build_plan(t)


def rows(report: CheckReport, probe: str, target: str | None = None) -> list[CheckResult]:
    return [
        r for r in report.results if r.probe == probe and (target is None or r.target == target)
    ]


def host_of(report: CheckReport, process: str) -> str:
    return next(h.label for h in report.hosts if process in [p.name for p in h.processes])


def opts(cluster, **kw) -> CheckOptions:
    return CheckOptions(connect=ConnectOptions(known_hosts=str(cluster.known_hosts)), **kw)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model directory the model.path probe accepts (a config and a weights file)."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    return d
