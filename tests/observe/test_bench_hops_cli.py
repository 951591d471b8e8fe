"""`bench` prints and saves the per-hop breakdown: loopback servers play the engines and
vllm-router's metrics port, serving /metrics captured around a real run
(tests/fixtures/bench/hops) before and after a stand-in `vllm` marks that the run happened."""

from __future__ import annotations

import json
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app
from pdlaunch.observe import bench
from tests.support import hostile_files
from tests.support.fake_bench_client import FAKE_VLLM

HOPS = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "hops"
CLIENT = json.loads((HOPS / "bench_client.json").read_text())
PAGES = {"prefill": "prefill-0", "decode": "decode-0", "metrics": "router", "router": None}
# The hops excerpts hold only histograms; bench's verdict reads counters too (a decode whose
# request counter does not move proves nothing, issue 32). The same day's 1P2D capture
# (tests/fixtures/bench/SOURCES.md) gives them: its bench run, before -> mid (decode-0 served
# 20 requests, all loaded over the connector).
COUNTERS = {
    name: {"before": (HOPS.parent / f"{name}_before.txt").read_text(),
           "after": (HOPS.parent / f"{name}_mid.txt").read_text()}
    for name in ("prefill-0", "decode-0")
}  # fmt: skip


@pytest.fixture
def topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    marker = tmp_path / "ran"
    servers = []
    ports: dict[str, int] = {}
    for role, name in PAGES.items():

        class Handler(BaseHTTPRequestHandler):
            page = name

            def do_GET(self) -> None:
                body = ""
                if self.path == "/metrics" and self.page:
                    stage = "after" if marker.exists() else "before"
                    body = (HOPS / f"{self.page}_{stage}.txt").read_text()
                    if self.page != "router":
                        body += COUNTERS[self.page][stage]
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        ports[role] = srv.server_address[1]
    fake = tmp_path / "vllm"
    # The stand-in reports the real run's mean TTFT (the derived hand-off row uses it).
    fake.write_text(
        FAKE_VLLM.replace('"mean_ttft_ms": 10.0', f'"mean_ttft_ms": {CLIENT["mean_ttft_ms"]}')
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(bench, "find_vllm", lambda explicit=None: str(fake))
    monkeypatch.setenv("BENCH_RAN", str(marker))
    model = tmp_path / "model"
    model.mkdir()

    def engine(port: int) -> dict:
        return {"host": "127.0.0.1", "device": "cpu", "port": port, "block_size": 32}

    topo = {
        "deployment": "hops",
        "model": {"name": str(model), "served_name": "tiny"},
        "prefill": [engine(ports["prefill"])],
        "decode": [engine(ports["decode"])],
        "router": {
            "host": "127.0.0.1",
            "port": ports["router"],
            "prometheus_port": ports["metrics"],
        },
        "kv_connector": {"kv_lease_duration": 5},
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topo))
    yield path
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_json_and_files_carry_the_hops_and_the_lease_warning(topology: Path, tmp_path: Path):
    out = tmp_path / "result"
    res = CliRunner().invoke(
        app, ["bench", str(topology), "--num-prompts", "40", "--json", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    hops = {h["hop"]: h for h in data["hops"]["hops"]}
    # the router's metrics were read (its port from the plan's --prometheus-port)
    assert hops["router_request"]["count"] == 40
    assert hops["decode_kv_wait"]["p99_bound"] == "<="
    assert data["hops"]["kv"]["transfers"] == 40
    lease = data["kv_lease"]
    assert lease["lease_s"] == 5 and lease["lease_source"] == "kv_connector.kv_lease_duration"
    # the gap: decode queue p99 (at most 0.3 s) + the run's mean hand-off and decode frontend
    (pair,) = lease["pairs"]
    assert pair["gap_p99_s"] > 0.5 * 5 and pair["warning"] and "decode-0" in pair["warning"]
    saved = json.loads((out / "bench.json").read_text())
    assert saved["hops"] == data["hops"]
    assert (out / "hops.svg").read_text().startswith("<svg")


def test_human_output_prints_the_table_and_the_kv_rate(topology: Path):
    res = CliRunner().invoke(app, ["bench", str(topology), "--num-prompts", "40"])
    assert res.exit_code == 0, res.output
    assert "decode: queue + KV handshake + read" in res.stdout
    assert "40 NIXL reads" in res.stdout and "GB/s" in res.stdout
    assert "KV lease 5 s" in res.stdout and "warning" in res.stderr


def test_a_fabric_report_without_bandwidth_is_bad_input(topology: Path, tmp_path: Path):
    report = tmp_path / "check.json"
    report.write_text(json.dumps({"results": []}))
    res = CliRunner().invoke(app, ["bench", str(topology), "--fabric", str(report)])
    assert res.exit_code == 2
    assert "no ib_write_bw result" in res.output and "Traceback" not in res.output


# -- files handed to bench, files bench writes (issue 32) -----------------------------------------
def test_planted_symlinks_under_out_are_replaced_and_their_targets_untouched(
    topology: Path, tmp_path: Path
):
    out = tmp_path / "result"
    out.mkdir()
    victims = {name: tmp_path / f"victim-{name}" for name in ("bench.json", "hops.svg")}
    for name, victim in victims.items():
        victim.write_text("precious\n")
        (out / name).symlink_to(victim)
    res = CliRunner().invoke(
        app, ["bench", str(topology), "--num-prompts", "40", "--json", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    for name, victim in victims.items():
        assert victim.read_text() == "precious\n"
        assert not (out / name).is_symlink()
    assert json.loads((out / "bench.json").read_text())["completed"] == 40


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("fifo", "is not a regular file (a FIFO)"),
        ("dev-zero", "is not a regular file (a character device)"),
        ("sparse-1gib", "at most 16,777,216 are read"),
        ("deep", "nests deeper than"),
        ("infinity", "Infinity is not a JSON number"),
        ("1e999", "beyond a float's range"),
    ],
)
def test_a_hostile_fabric_file_is_one_line_of_bad_input(
    topology: Path, tmp_path: Path, kind: str, says: str
):
    path = hostile_files.make(tmp_path, "fabric.json", kind)
    res, peak = hostile_files.bounded_call(
        lambda: CliRunner().invoke(app, ["bench", str(topology), "--fabric", str(path)])
    )
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    (line,) = [ln for ln in res.output.splitlines() if str(path) in ln]
    assert says in line and "--fabric report" in line, line
    assert peak < 64 << 20, f"{peak:,} bytes allocated reading {kind}"
