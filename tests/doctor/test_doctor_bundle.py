"""Gathering through the hosts layer and the redacted bundle, on a deployment recorded by hand:
local processes whose logs are files under tmp_path (read by LocalHost, and once over real
SSH), a real HTTP server for one engine's /metrics, nothing listening for the others."""

from __future__ import annotations

import json
import os
import secrets
import stat
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, generate_latest

from pdlaunch import doctor
from pdlaunch.doctor.bundle import REDACTED, Redactor, members
from pdlaunch.doctor.collect import load_topology
from pdlaunch.hosts import ConnectOptions, HostPool
from pdlaunch.plan.build import build_plan
from pdlaunch.plan.render import render_plan
from pdlaunch.runtime.state import DeploymentState, ProcessState
from pdlaunch.spec.load import load_text

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "doctor"
SECRET_ENV = "PDLAUNCH_DOCTOR_TEST_TOKEN"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def metrics_server() -> Iterator[str]:
    """A real HTTP server answering /metrics with what a decode that recomputes exposes."""
    reg = CollectorRegistry()
    c = Counter(
        "vllm:prompt_tokens_by_source", "by source", ["model_name", "engine", "source"],
        registry=reg,
    )  # fmt: skip
    c.labels("tiny", "0", "local_compute").inc(640)
    c.labels("tiny", "0", "external_kv_transfer").inc(0)
    body = generate_latest(reg)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class Planted:
    def __init__(self) -> None:
        self.secret = "s3cr3t-" + secrets.token_hex(8)  # the ${env:...} secret's value
        self.hf = "hf_" + secrets.token_hex(16)  # a token nobody declared


def topology(tmp_path: Path, planted: Planted) -> Path:
    data = yaml.safe_load((ROOT / "topologies" / "local-cpu.yaml").read_text())
    data["deployment"] = "doctest"
    data["defaults"]["work_dir"] = str(tmp_path / "work")
    data["defaults"]["env"]["HF_TOKEN"] = "${env:" + SECRET_ENV + "}"
    data["defaults"]["env"]["EXTRA_DOWNLOAD_HINT"] = planted.hf  # pasted where it should not be
    path = tmp_path / "doctest.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def process(name: str, role: str, log: Path, health: str | None, ports: list[int]) -> ProcessState:
    return ProcessState(
        name=name, role=role, host="127.0.0.1", local=True, ssh={}, work_dir=str(log.parent),
        script_path=str(log.parent / f"{name}.sh"), log_path=str(log),
        pid_path=str(log.parent / f"{name}.pid"), secrets_path="", health_url=health,
        ports=ports, script_hash="", pid=None,
    )  # fmt: skip


def deployment(tmp_path: Path, planted: Planted, metrics_url: str) -> DeploymentState:
    logs = tmp_path / "logs"
    logs.mkdir()
    prefill = (FIXTURES / "prefill-0.log").read_text()
    # The secret inside a line a signature matches (it reaches findings.json) and a stray token.
    prefill = prefill.replace("for request cmpl-___prefill", f"for request cmpl-{planted.secret}")
    prefill += f"(APIServer pid=7) INFO 11-23 10:33:40 [hub.py:1] fetched with {planted.hf}\n"
    (logs / "prefill-0.log").write_text(prefill)
    decode = (FIXTURES / "decode-0.log").read_text()
    decode += f"(APIServer pid=8) INFO 11-23 10:33:41 [launcher.py:46] Route: /x/{planted.secret}\n"
    (logs / "decode-0.log").write_text(decode)
    (logs / "router.log").write_text((FIXTURES / "router.log").read_text())
    closed = free_port()
    return DeploymentState(
        deployment="doctest",
        topology=str(topology(tmp_path, planted)),
        scripts_hash="",
        endpoint="http://127.0.0.1:8123",
        served_model_name="tiny",
        status="up",
        processes=[
            process("prefill-0", "prefill", logs / "prefill-0.log",
                    f"http://127.0.0.1:{closed}/health", [closed]),
            process("decode-0", "decode", logs / "decode-0.log", f"{metrics_url}/health", [1]),
            process("router", "router", logs / "router.log",
                    f"http://127.0.0.1:{closed}/health", [closed, closed]),
        ],
    )  # fmt: skip


def read_tar(path: Path) -> dict[str, str]:
    with tarfile.open(path, "r:gz") as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in tar.getmembers()
        }


def test_bundle_has_everything_and_no_secret(tmp_path, metrics_server):
    planted = Planted()
    state = deployment(tmp_path, planted, metrics_server)
    env = {SECRET_ENV: planted.secret}
    check = {"results": [{"probe": "env", "message": f"HF_TOKEN set to {planted.secret}"}]}
    with HostPool() as pool:
        path = doctor.write_bundle(
            tmp_path / "out.tar.gz", state, pool, env=env, check_json=check, lines=200
        )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    files = read_tar(path)
    expected = {
        "manifest.json", "summary.txt", "findings.json", "state.json", "topology.yaml",
        "plan.json", "scripts/prefill-0.sh", "scripts/decode-0.sh", "scripts/router.sh",
        "scripts/index.md", "logs/prefill-0.log", "logs/decode-0.log", "logs/router.log",
        "metrics/decode-0.prom", "metrics/prefill-0.error", "metrics/router.error",
        "versions.json", "check.json",
    }  # fmt: skip
    assert set(files) == expected
    assert json.loads(files["manifest.json"])["members"] == sorted(
        expected - {"manifest.json"}, key=list(files).index
    )
    for name, text in files.items():
        assert planted.secret not in text, f"{name} leaks the secret"
        assert planted.hf not in text, f"{name} leaks the hf_ token"
    for name in ("logs/prefill-0.log", "logs/decode-0.log", "findings.json", "summary.txt",
                 "check.json", "scripts/prefill-0.sh", "plan.json", "topology.yaml"):  # fmt: skip
        assert REDACTED in files[name], name
    # The reference itself is not a secret and stays readable, and so does the script's check.
    assert ': "${HF_TOKEN:?secret HF_TOKEN is not set}"' in files["scripts/decode-0.sh"]
    assert "${env:" + SECRET_ENV + "}" in files["topology.yaml"]

    findings = json.loads(files["findings.json"])
    by_id = {f["id"]: f for f in findings}
    assert by_id["decode-recomputes"]["what"].startswith("Decode computed 640 prompt tokens")
    assert by_id["metrics-unreachable"]["process"] in ("prefill-0", "router")
    lease = by_id["kv-lease-expired"]
    assert lease["count"] == 2 and lease["what"].startswith(
        f"Prefill freed the KV of request cmpl-{REDACTED}"
    )
    # Line numbers point into the bundle's copy of the log.
    assert files["logs/prefill-0.log"].splitlines()[lease["line_no"] - 1] == lease["line"]
    versions = json.loads(files["versions.json"])
    assert versions[0]["host"] == "127.0.0.1" and versions[0]["data"]["python"]
    assert "packages" in versions[0]["data"] and "ucx_bundled" in versions[0]["data"]


def test_unredacted_members_do_hold_the_planted_values(tmp_path, metrics_server):
    # Control for the test above: what goes into the redactor does contain both values.
    planted = Planted()
    state = deployment(tmp_path, planted, metrics_server)
    with HostPool() as pool:
        exam = doctor.examine(state, pool)
    raw = dict(members(state, exam.evidence, exam.findings, exam.topology)[0])
    assert planted.secret in raw["logs/decode-0.log"] and planted.secret in raw["findings.json"]
    assert planted.hf in raw["logs/prefill-0.log"] and planted.hf in raw["plan.json"]


def test_diagnose_a_recorded_deployment(tmp_path, metrics_server):
    state = deployment(tmp_path, Planted(), metrics_server)
    (tmp_path / "logs" / "router.log").unlink()
    with HostPool() as pool:
        found = doctor.diagnose(state, pool)
    got = {(f.id, f.process) for f in found}
    assert {
        ("kv-block-size-divisibility", "decode-0"),
        ("decode-recomputes", "decode-0"),
        ("kv-read-after-expiry", "prefill-0"),
        ("metrics-unreachable", "prefill-0"),
        ("log-unreadable", "router"),
    } <= got
    (unreadable,) = [f for f in found if f.id == "log-unreadable"]
    assert unreadable.what.endswith("router.log does not exist")


def test_an_unrecorded_deployment_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLAUNCH_STATE_DIR", str(tmp_path / "state"))
    with HostPool() as pool, pytest.raises(doctor.DoctorError, match="no deployment 'nope'"):
        doctor.diagnose("nope", pool)


def test_a_topology_that_moved_away_leaves_the_recorded_scripts(tmp_path, metrics_server):
    planted = Planted()
    state = deployment(tmp_path, planted, metrics_server)
    state.scripts = {"decode-0.sh": f"export EXTRA={planted.hf}\nexec vllm serve\n"}
    Path(state.topology).unlink()
    topo = load_topology(state)
    assert topo.plan is None and "no such file" in (topo.note or "")
    with HostPool() as pool:
        path = doctor.write_bundle(tmp_path / "b.tar.gz", state, pool, versions=False, env={})
    files = read_tar(path)
    assert "plan.json" not in files and "topology.yaml" not in files
    assert files["scripts/decode-0.sh"] == f"export EXTRA={REDACTED}\nexec vllm serve\n"
    notes = json.loads(files["manifest.json"])["notes"]
    assert any("no such file" in n for n in notes)


@pytest.mark.ssh
def test_logs_are_read_over_ssh(tmp_path, sshd_cluster, sshd_host):
    log = sshd_host.home / "doctor" / "decode-0.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text((FIXTURES / "decode-0.log").read_text())
    p = process("decode-0", "decode", log, None, [])
    p.local = False
    p.ssh = {"user": sshd_cluster.user, "port": sshd_host.port,
             "key": str(sshd_cluster.key_file), "connect_timeout": 5}  # fmt: skip
    state = DeploymentState("sshdoc", "", "", "", "tiny", processes=[p])
    with HostPool(ConnectOptions(known_hosts=str(sshd_cluster.known_hosts))) as pool:
        found = doctor.diagnose(state, pool, lines=5)
    # Only the last 5 lines were read: the block-size failure from line 8 of the file on.
    (block,) = [f for f in found if f.id == "kv-block-size-divisibility"]
    assert (block.line_no, block.count) == (1, 2)


# -- the redactor -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "hf_" + "a1B2" * 8,
        "sk-proj-" + "x9" * 16,
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def",
        "GET /x?token=abcdef123&y=1",
        '"password": "hunter2hunter2"',
        "HF_TOKEN=plainvalue",
        "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
        "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "key=" + "0f" * 20,
        "https://user:pa55word@example.com/model",
        "ghp_" + "Z" * 36,
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----",
    ],
)
def test_token_shapes_are_redacted(text):
    out = Redactor()(text)
    assert REDACTED in out
    words = ("a1B2a1B2", "x9x9x9", "eyJhbGci", "abcdef123", "hunter2", "plainvalue",
             "AKIAIOSFODNN7", "wJalrXUt", "0f0f0f0f", "pa55word", "ZZZZ", "b3BlbnNz")  # fmt: skip
    assert not [w for w in words if w in out]


def test_real_log_lines_and_ordinary_settings_are_left_alone():
    redact = Redactor()
    lines = yaml.safe_load((FIXTURES / "lines.yaml").read_text())
    for entry in lines.values():
        for line in entry["real"] + entry["near_miss"]:
            assert redact(line) == line
    kept = ("max_tokens=5", "tokenizer: null", "HF_TOKEN: ${env:HF_TOKEN}", "${T:?x: y}",
            "Authorization=Bearer [REDACTED]", "cache_key=abc", "kv_role: kv_producer",
            '"secret_env": {"HF_TOKEN": "MY_HF_TOKEN"}')  # fmt: skip
    assert [redact(t) for t in kept] == list(kept)


def test_secret_values_are_redacted_wherever_they_stand():
    value = 'we"ird\\secret'
    redact = Redactor([value, ""])
    assert redact(f"x {value} y") == f"x {REDACTED} y"
    assert redact(json.dumps({"v": value})) == json.dumps({"v": REDACTED})


def test_bundle_is_written_atomically(tmp_path, metrics_server):
    state = deployment(tmp_path, Planted(), metrics_server)
    target = tmp_path / "b.tar.gz"
    target.write_text("old")
    with HostPool() as pool:
        doctor.write_bundle(target, state, pool, versions=False, env={})
    assert tarfile.is_tarfile(target)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".b.tar.gz")] == []
    assert os.access(target, os.R_OK)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "topologies").glob("*.yaml")))
def test_rendered_files_of_shipped_topologies_pass_unchanged(name):
    # They hold no secret value, so redaction must not touch them (a mangled script in a
    # bundle would mislead whoever reads it), `${HF_TOKEN:?...}` checks included.
    topo, _ = load_text((ROOT / "topologies" / name).read_text(), name)
    redact = Redactor()
    for f in render_plan(build_plan(topo)):
        assert redact(f.content) == f.content, f.name


# -- secret-bearing flags, URLs, headers, moved topologies, links (issue 26) -------------------
KEY = "k3y-" + "Qx7" * 6  # an API key with no token shape: only its flag says it is one


@pytest.mark.parametrize(
    "text",
    [
        f"vllm serve m --api-key {KEY} --port 8000",
        f"exec vllm serve m --api-key '{KEY}' \\\n  --port 8000",
        f"--api-key={KEY}",
        f'["vllm", "serve", "--api-key",\n    "{KEY}", "--port", "8000"]',
        f"argv: ['--api-key', '{KEY}']",
        f'{{"--api-key": "{KEY}"}}',
        f"non-default args: {{'api_key': '{KEY}', 'port': 8000}}",
        f"(APIServer pid=7) INFO args: Namespace(api_key='{KEY}', port=8000)",
        f'router config: api_key: Some("{KEY}")',
        f"--hf-token {KEY}",
        f"redis://:{KEY}@cache:6379/0",
        f"https://user:{KEY}@example.com/x",
        f"Authorization: Basic {KEY}",
        f"curl -H 'Authorization: Bearer {KEY}' http://x",
        f"{{'Authorization': 'Token {KEY}'}}",
        f"Proxy-Authorization: Digest {KEY}",
    ],
)
def test_secret_bearing_flags_urls_and_headers_are_redacted(text):
    out = Redactor()(text)
    assert KEY not in out and REDACTED in out, out


def test_flag_values_are_redacted_wherever_else_they_stand(tmp_path):
    """A key given as a flag in the recorded script is redacted bare in a log line too."""
    state = DeploymentState("flags", "", "", "", "tiny")
    state.scripts = {"router.sh": f"exec vllm-router --api-key {KEY} --port 8000\n"}
    logs = tmp_path / "router.log"
    logs.write_text(f"client sent key {KEY}\nrouter listening on 0.0.0.0:8000\n")
    state.processes = [process("router", "router", logs, None, [])]
    with HostPool() as pool:
        path = doctor.write_bundle(tmp_path / "b.tar.gz", state, pool, versions=False, env={})
    files = read_tar(path)
    assert all(KEY not in text for text in files.values())
    assert files["logs/router.log"] == (
        f"client sent key {REDACTED}\nrouter listening on 0.0.0.0:8000\n"
    )


def test_ordinary_flags_and_urls_stay():
    kept = ("--max-num-batched-tokens 2048", "--tokenizer /models/x", "--api-key $API_KEY",
            "--api-key --port 8000", "http://127.0.0.1:8000/v1", "http://[::1]:8000/health",
            "Authorization: Bearer [REDACTED]", "--hf-token [REDACTED]",
            "scheme://host/path@ref")  # fmt: skip
    redact = Redactor()
    assert [redact(t) for t in kept] == list(kept)


def test_secret_names_recorded_at_up_redact_after_the_topology_moved(tmp_path, metrics_server):
    planted = Planted()
    state = deployment(tmp_path, planted, metrics_server)
    state.secret_names = [SECRET_ENV]
    Path(state.topology).rename(tmp_path / "moved.yaml")
    with HostPool() as pool:
        path = doctor.write_bundle(
            tmp_path / "b.tar.gz", state, pool, versions=False, env={SECRET_ENV: planted.secret}
        )
    files = read_tar(path)
    assert "topology.yaml" not in files
    assert all(planted.secret not in text for text in files.values())
    assert REDACTED in files["logs/decode-0.log"]
    # The state in the bundle keeps the name, never a value.
    assert json.loads(files["state.json"])["secret_names"] == [SECRET_ENV]


def test_a_log_that_is_a_link_is_not_read_into_the_bundle(tmp_path, metrics_server):
    state = deployment(tmp_path, Planted(), metrics_server)
    private = tmp_path / "id_ed25519"
    private.write_text("private notes of the user " + secrets.token_hex(8) + "\n")
    log = Path(state.process("router").log_path)
    log.unlink()
    log.symlink_to(private)
    with HostPool() as pool:
        path = doctor.write_bundle(tmp_path / "b.tar.gz", state, pool, versions=False, env={})
    files = read_tar(path)
    assert "logs/router.log" not in files
    assert "symbolic link" in files["logs/router.error"]
    assert all("private notes" not in text for text in files.values())


def test_no_value_in_shipped_plans_or_real_logs_is_taken_for_a_flagged_secret():
    """Values found after secret-bearing flags are redacted everywhere in the bundle: none may
    come from ordinary settings or log lines (each would vanish from every member)."""
    from pdlaunch.doctor.bundle import flagged_values
    from pdlaunch.plan.render import plan_json

    texts = [(FIXTURES / n).read_text() for n in ("prefill-0.log", "decode-0.log", "router.log")]
    for entry in yaml.safe_load((FIXTURES / "lines.yaml").read_text()).values():
        texts += entry["real"] + entry["near_miss"]
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        plan = build_plan(load_text(path.read_text(), path.name)[0])
        texts += [path.read_text(), plan_json(plan), *(f.content for f in render_plan(plan))]
    assert flagged_values(texts) == set()
    assert flagged_values([f"--api-key {KEY}", "--api-key 1234567"]) == {KEY}
