"""A record written by a newer pdlaunch (format above 2): every command that finds
deployments refuses it with exit 2, naming the file and what to do, without a traceback, and
leaves the file as it was (not taken for damaged: never moved aside or overwritten)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdlaunch.backends.ssh.records import unrecorded_state
from pdlaunch.runtime import record_store
from tests.support.slurm_specs import fake_spec, planned

REPO = Path(__file__).resolve().parents[2]
PORTS = {"prefill": 18201, "decode": 18202, "side": 18203, "router": 18204, "metrics": 18205}


def _pdl(state_dir: Path, *args: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PDLAUNCH_STATE_DIR": str(state_dir), "COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "pdlaunch", *map(str, args)],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )  # fmt: skip


@pytest.fixture
def newer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, str]:
    """(state dir, topology file, record text): deployment "future" recorded in format 3."""
    state_dir = tmp_path / "state"
    monkeypatch.setenv("PDLAUNCH_STATE_DIR", str(state_dir))
    bins = {"vllm": Path("/opt/vllm/bin/vllm"), "router": Path("/opt/router/bin/vllm-router")}
    topo = tmp_path / "future.yaml"
    plan = planned(fake_spec("future", tmp_path / "work", ["pd-a", "pd-b"], bins, PORTS), topo)[2]
    path = record_store.save_state(unrecorded_state(plan, status="up"))
    data = json.loads(path.read_text())
    data["format"] = 3
    data["handle"]["kind"] = "ssh-v3"
    text = json.dumps(data)
    path.write_text(text)
    return state_dir, topo, text


@pytest.mark.parametrize(
    "args",
    [
        ("status", "future"),
        ("status", "future", "--backend", "ssh"),
        ("status", "future", "--watch", "--count", "1"),
        ("down", "future"),
        ("logs", "future", "router"),
        ("doctor", "future"),
        ("up", "TOPOLOGY"),
    ],
    ids=lambda a: "-".join(a),
)
def test_a_newer_record_is_refused_with_exit_2(newer, args) -> None:
    state_dir, topo, text = newer
    res = _pdl(state_dir, *[topo if a == "TOPOLOGY" else a for a in args])
    said = " ".join(res.stderr.split())
    assert res.returncode == 2, res
    assert "Traceback" not in res.stdout + res.stderr
    path = state_dir / "future" / "record.json"
    assert f"the record {path} is format 3" in said and "newer pdlaunch" in said, said
    assert "Nothing was read, stopped or changed" in said, said
    assert path.read_text() == text  # not overwritten, nor moved aside
    assert set(os.listdir(path.parent)) <= {"record.json", "lock"}
