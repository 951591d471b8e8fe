"""Pure pieces of the launch layer: metrics parsing, state records, the lock, secrets files,
change descriptions."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from pdlaunch.backends.ssh import records as launch
from pdlaunch.observe import health
from pdlaunch.plan.build import build_plan
from pdlaunch.plan.render import RenderedFile, render_plan
from pdlaunch.runtime.record_store import load_state, remove, save_state
from pdlaunch.runtime.state import (
    DeploymentLock,
    DeploymentState,
    ProcessState,
    StateError,
    deployment_dir,
    file_hashes,
    scripts_hash,
    state_root,
)
from pdlaunch.spec.load import load

# As vLLM 0.32 prints it (vllm/v1/metrics/loggers.py: labels model_name, engine, source).
METRICS = """\
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 12.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 0.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 96.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="external_kv_transfer"} 4.0
vllm:prompt_tokens_by_source_created{engine="0",model_name="m",source="local_compute"} 1.7e9
vllm:prompt_tokens_total{engine="0",model_name="m"} 108.0
"""


def test_metric_sum_filters_by_name_and_labels():
    name = health.PROMPT_TOKENS_BY_SOURCE
    assert health.metric_sum(METRICS, name, source="external_kv_transfer") == 100.0
    assert health.metric_sum(METRICS, name, source="external_kv_transfer", engine="1") == 4.0
    assert health.metric_sum(METRICS, name, source="local_compute") == 12.0
    assert health.metric_sum(METRICS, name) == 112.0
    assert health.metric_sum(METRICS, "vllm:nope") == 0.0
    assert health.metric_sum("garbage {\n\n", name) == 0.0


def test_probe_of_a_closed_port_is_not_ok():
    from tests.support.sshd import free_port

    pr = health.probe(f"http://127.0.0.1:{free_port()}/health", timeout=1)
    assert not pr.ok and pr.status is None and pr.describe()


def test_state_dir_override_and_round_trip(state_dir):
    assert state_root() == state_dir
    assert deployment_dir("d") == state_dir / "d"
    ps = ProcessState(
        name="p",
        role="prefill",
        host="h",
        local=False,
        # as `up` records it: the topology's Ssh settings, every field
        ssh={"user": None, "port": 22, "key": None, "jump": None, "connect_timeout": 10.0},
        work_dir="/w/d",
        script_path="/w/d/p.sh",
        log_path="/w/d/logs/p.log",
        pid_path="/w/d/run/p.pid",
        secrets_path="/w/d/run/p.secrets.env",
        health_url=None,
        ports=[1],
        script_hash="x",
        pid=42,
        start_time=7,
    )
    st = DeploymentState(
        deployment="d",
        topology="/t.yaml",
        scripts_hash="h",
        endpoint="e",
        served_model_name="m",
        processes=[ps],
    )
    save_state(st)
    back = load_state("d")
    assert back == st and back.process("p").pid == 42 and back.started() == [ps]
    remove("d", "ssh")
    assert load_state("d") is None
    remove("d", "ssh")  # idempotent
    (state_dir / "d" / "state.json").write_text("{not json")
    with pytest.raises(StateError, match="cannot read"):
        load_state("d")


# A record edited or damaged by hand: (field of processes[0], value), and the text the message
# must hold. Each got past the reader before (a traceback later, in status/logs/down, or a
# file outside the deployment deleted by `down`).
WRONG = {
    "ports-str": ("ports", "8000", "processes[0].ports"),
    "ssh-int": ("ssh", 5, "processes[0].ssh"),
    "local-str": ("local", "yes", "processes[0].local"),
    "pid-bool": ("pid", True, "processes[0].pid"),
    "health-list": ("health_url", ["x"], "processes[0].health_url"),
    "secrets-outside": ("secrets_path", "/home/u/.ssh/id_ed25519", "does not delete"),
    "another-deployment": ("deployment", "other", "deployment is 'other'"),
}


@pytest.mark.parametrize("kind", list(WRONG))
def test_a_record_field_of_the_wrong_type_or_place_is_named(kind, state_dir):
    import json

    path = state_dir / "d" / "state.json"
    path.parent.mkdir(parents=True)
    proc = {
        "name": "p", "role": "prefill", "host": "h", "local": False, "ssh": {},
        "work_dir": "/w/d", "script_path": "/w/d/p.sh", "log_path": "/w/d/logs/p.log",
        "pid_path": "/w/d/run/p.pid", "secrets_path": "/w/d/run/p.secrets.env",
        "health_url": None, "ports": [1], "script_hash": "x", "pid": 42,
    }  # fmt: skip
    record = {"deployment": "d", "topology": "/t.yaml", "scripts_hash": "h", "endpoint": "e",
              "served_model_name": "m", "processes": [proc]}  # fmt: skip
    path.write_text(json.dumps(record))
    assert load_state("d").process("p").pid == 42  # the control: this record reads
    key, value, says = WRONG[kind]
    (record if key == "deployment" else proc)[key] = value
    path.write_text(json.dumps(record))
    with pytest.raises(StateError) as err:
        load_state("d")
    assert str(path) in str(err.value) and says in str(err.value), err.value
    # The commands say so and what to do next, with no traceback.
    res = subprocess.run(
        [sys.executable, "-m", "pdlaunch", "status", "d"], capture_output=True, text=True
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    said = " ".join(res.stderr.split())  # as one line, however the console wrapped it
    assert says in said and "pdlaunch down FILE" in said, said


def test_lock_is_exclusive_across_processes_and_released(state_dir):
    with DeploymentLock("d", "up"):
        with pytest.raises(StateError, match=r"locked by another pdlaunch run \(pid \d+, up\)"):
            DeploymentLock("d", "down").acquire()
        # another process sees it too (flock, not a pid file)
        code = (
            "from pdlaunch.runtime.state import DeploymentLock, StateError\n"
            "try:\n    DeploymentLock('d').acquire()\nexcept StateError:\n    raise SystemExit(3)\n"
        )
        rc = subprocess.run(
            [sys.executable, "-c", code], env={"PDLAUNCH_STATE_DIR": str(state_dir)}
        ).returncode
        assert rc == 3
    with DeploymentLock("d", "down"):
        pass


def test_scripts_hash_is_order_independent_and_content_sensitive():
    a, b = RenderedFile("a.sh", "x", True), RenderedFile("b.sh", "y", True)
    assert scripts_hash([a, b]) == scripts_hash([b, a])
    assert scripts_hash([a, b]) != scripts_hash([a, RenderedFile("b.sh", "z", True)])


def _plan(tmp_path, extra: str = "", router_port: int = 8123):
    path = tmp_path / "t.yaml"
    path.write_text(
        f"""deployment: u
model: {{name: m}}
defaults:
  env: {{TOKEN: "${{env:MY_TOKEN}}", PLAIN: "1"}}
prefill: [{{host: 10.0.0.1, device: cpu, port: 8100}}]
decode: [{{host: 10.0.0.2, device: cpu, port: 8200}}]
router: {{host: 10.0.0.3, port: {router_port}}}
{extra}"""
    )
    topo, _ = load(path)
    return build_plan(topo)


def test_missing_secrets_and_secret_file(tmp_path):
    plan = _plan(tmp_path)
    assert launch.missing_secrets(plan, {}) == {"MY_TOKEN": ["prefill-0", "decode-0"]}
    assert launch.missing_secrets(plan, {"MY_TOKEN": ""}) == {}
    value = "it's $(rm -rf /) `x`"
    text = launch.secrets_file(plan.processes[0], {"MY_TOKEN": value})
    line = text.splitlines()[-1]
    assert line == "TOKEN=" + shlex.quote(value)
    out = subprocess.run(
        ["sh", "-c", f'{line}\nprintf %s "$TOKEN"'], capture_output=True, text=True
    )
    assert out.stdout == value


def test_describe_changes_names_the_changed_lines(tmp_path):
    old_plan, new_plan = _plan(tmp_path), _plan(tmp_path, router_port=9123)
    old_files = render_plan(old_plan)
    old = DeploymentState(
        deployment="u",
        topology="",
        scripts_hash=scripts_hash(old_files),
        endpoint="",
        served_model_name="m",
        file_hashes=file_hashes(old_files),
        scripts={f.name: f.content for f in old_files if f.name.endswith(".sh")},
    )
    changes = launch.describe_changes(old, render_plan(new_plan))
    assert len(changes) == 1 and changes[0].startswith("router: ")
    assert "8123" in changes[0] and "9123" in changes[0]
    assert launch.describe_changes(old, old_files) == ["rendered files differ"]
