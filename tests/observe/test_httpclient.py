"""Issue 26: the HTTP client behind health probes, /metrics reads and the canary, against hostile
in-process servers on 127.0.0.1: one that trickles a byte at a time, one that answers
something other than HTTP, one with a huge body, one with malformed JSON. Each call must end
within a bounded time with a message naming the endpoint, never hang or raise a traceback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pdlaunch.doctor.collect import _fetch
from pdlaunch.observe import health
from pdlaunch.observe import http as httpclient
from pdlaunch.observe.http import HttpError

Handler = Callable[[socket.socket, threading.Event, bytes], None]


@contextlib.contextmanager
def hostile(handler: Handler) -> Iterator[str]:
    """A server on 127.0.0.1 running ``handler(conn, stop, head)`` per connection (after
    reading the request head); yields its base URL."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                handler(conn, stop, head)

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(2)
        srv.close()


def trickle(conn: socket.socket, stop: threading.Event, head: bytes = b"") -> None:
    """A status line, then a header one byte every 0.2 s, for up to 15 s: a per-read timeout
    never fires (the old client hung for as long as this went on)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    end = time.monotonic() + 15
    while not stop.is_set() and time.monotonic() < end:
        conn.sendall(b"a")
        time.sleep(0.2)


def trickle_body(conn: socket.socket, stop: threading.Event, head: bytes = b"") -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    end = time.monotonic() + 15
    while not stop.is_set() and time.monotonic() < end:
        conn.sendall(b"a")
        time.sleep(0.2)


def not_http(conn: socket.socket, stop: threading.Event, head: bytes = b"") -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\nProtocol mismatch.\r\n")


def huge(conn: socket.socket, stop: threading.Event, head: bytes = b"") -> None:
    """200 MB announced, sent until the client goes (or 40 MB: enough to tell)."""
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 209715200\r\n\r\n"
    )
    _stream(conn, stop)


def huge_unannounced(conn: socket.socket, stop: threading.Event, head: bytes = b"") -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    _stream(conn, stop)


def _stream(conn: socket.socket, stop: threading.Event, head: bytes = b"") -> None:
    block = b"vllm:num_requests_running 1\n" * 4096
    sent = 0
    while not stop.is_set() and sent < 40 * 1024 * 1024:
        conn.sendall(block)
        sent += len(block)


def _answer(body: bytes, status: str = "200 OK") -> Handler:
    def handler(conn: socket.socket, stop: threading.Event, head: bytes = b"") -> None:
        head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        conn.sendall(head.encode() + body)

    return handler


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    t0 = time.monotonic()
    try:
        out: object = fn()
    except HttpError as exc:
        out = exc
    return out, time.monotonic() - t0


@pytest.mark.parametrize("handler", [trickle, trickle_body], ids=["headers", "body"])
def test_trickling_server_is_cut_at_the_deadline(handler):
    with hostile(handler) as base:
        pr, took = _timed(lambda: health.probe(base + "/health", timeout=1.0))
        assert isinstance(pr, health.Probe) and not pr.ok
        assert took < 3, took  # the deadline is for the whole request, not per read
        assert pr.describe() == f"{base}/health: no complete answer within 1s"
        err, took = _timed(lambda: health.get_text(base + "/metrics", timeout=1.0))
        assert isinstance(err, HttpError) and took < 3, (err, took)
        assert str(err) == f"{base}/metrics: no complete answer within 1s"
        # doctor's collection: a finding's text, no hang
        (text, why), took = _timed(lambda: _fetch(base + "/metrics", 1.0))
        assert text is None and why.startswith(base) and took < 3


def test_an_answer_that_is_not_http_is_unhealthy_with_the_endpoint_named():
    with hostile(not_http) as base:
        pr = health.probe(base + "/health", timeout=2)
        assert not pr.ok and pr.status is None
        assert pr.describe().startswith(f"{base}/health: not an HTTP answer")
        assert "SSH-2.0" in pr.describe()
        with pytest.raises(HttpError, match="not an HTTP answer") as exc:
            health.get_text(base + "/metrics", timeout=2)
        assert exc.value.url == base + "/metrics"
        with pytest.raises(OSError, match="not an HTTP answer"):  # what the canary catches
            health.post_json(base + "/v1/completions", {"x": 1}, timeout=2)
        text, why = _fetch(base + "/metrics", 2)
        assert text is None and why.startswith(f"{base}/metrics: not an HTTP answer")


@pytest.mark.parametrize("handler", [huge, huge_unannounced], ids=["announced", "unannounced"])
def test_a_huge_metrics_answer_is_refused_not_read_whole(handler):
    with hostile(handler) as base:
        err, took = _timed(lambda: health.get_text(base + "/metrics", timeout=10))
        assert isinstance(err, HttpError), type(err)
        assert "answer too large" in str(err) and str(err).startswith(base + "/metrics")
        assert str(httpclient.METRICS_MAX_BYTES) in str(err)
        assert took < 8, took
        # /health is capped far lower
        pr = health.probe(base + "/health", timeout=5)
        assert not pr.ok and "too large" in pr.describe()
        assert str(httpclient.HEALTH_MAX_BYTES) in pr.describe()


def test_a_metrics_answer_under_the_cap_is_read():
    body = b"vllm:num_requests_running 1\n" * 1000
    with hostile(_answer(body)) as base:
        assert health.get_text(base + "/metrics", timeout=5) == body.decode()
        assert health.probe(base + "/health", timeout=5).ok  # 28 KB: under the /health cap
    with hostile(_answer(b"", "503 Service Unavailable")) as base:
        pr = health.probe(base + "/health", timeout=5)
        assert not pr.ok and pr.describe() == "HTTP 503"
        with pytest.raises(HttpError, match=r"/metrics: HTTP 503$"):
            health.get_text(base + "/metrics", timeout=5)


def test_health_answer_that_is_small_and_200_is_healthy():
    with hostile(_answer(b"")) as base:
        assert health.probe(base + "/health", timeout=5).ok


def _router(completion: bytes) -> Handler:
    """/metrics with counters that grow on every read (the canary's disaggregation check
    passes), and ``completion`` for anything else."""
    reads = [0]

    def handler(conn: socket.socket, stop: threading.Event, head: bytes = b"") -> None:
        if b" /metrics " in head.split(b"\r\n", 1)[0]:
            reads[0] += 10
            n = reads[0]
            name = health.PROMPT_TOKENS_BY_SOURCE
            text = (
                f'{name}{{source="local_compute"}} {n}\n'
                f'{name}{{source="external_kv_transfer"}} {n}\n'
            )
            _answer(text.encode())(conn, stop)
        else:
            _answer(completion)(conn, stop)

    return handler


@pytest.mark.parametrize(
    "body",
    [b'{"choices": [5]}', b'{"choices": 5}', b"{not json", b"[1, 2]", b'{"choices": [{}]}'],
)
def test_canary_with_a_malformed_answer_fails_cleanly(body):
    """The canary's completion answered 200 with JSON of the wrong shape (or none): a failed
    canary naming the router, never a traceback."""
    with hostile(_router(body)) as base:
        res = health.canary(base, "m", [base + "/health"], [base + "/health"], settle=0.3)
        assert not res.ok
        assert base in res.message and "answered HTTP 200" in res.message


def test_canary_against_an_endpoint_that_is_not_http_fails_cleanly():
    with hostile(not_http) as base:
        res = health.canary(base, "m", [base + "/health"], [base + "/health"], timeout=2)
        assert not res.ok and "not an HTTP answer" in res.message and base in res.message


def test_bad_urls_are_errors_naming_them():
    for url in ("https://127.0.0.1:1/health", "http://127.0.0.1:99999/health", "ftp://x/y"):
        with pytest.raises(HttpError) as exc:
            httpclient.request(url, timeout=1)
        assert str(exc.value).startswith(url)


# -- the commands that read endpoints ---------------------------------------------------------
def _record(state_dir: Path, base: str) -> None:
    """A recorded deployment whose decode (its pid gone) answers at ``base``."""
    from pdlaunch.runtime.record_store import save_state
    from pdlaunch.runtime.state import DeploymentState, ProcessState

    work = state_dir.parent / "work" / "hostile"  # a deployment's own work dir
    ps = ProcessState(
        name="decode-0",
        role="decode",
        host="127.0.0.1",
        local=True,
        ssh={},
        work_dir=str(work),
        script_path=str(work / "decode-0.sh"),
        log_path=str(work / "logs" / "decode-0.log"),
        pid_path=str(work / "run" / "decode-0.pid"),
        secrets_path=str(work / "run" / "decode-0.secrets.env"),
        health_url=base + "/health",
        ports=[int(base.rsplit(":", 1)[1])],
        script_hash="",
        pid=4_000_000,  # above pid_max: never a live process
        start_time=1,
        started_at=time.time(),
    )
    save_state(DeploymentState("hostile", "", "", base, "m", status="up", processes=[ps]))


@pytest.mark.parametrize("handler", [trickle, not_http, huge], ids=["trickle", "not-http", "huge"])
@pytest.mark.parametrize(
    "argv",
    [
        ["status", "hostile", "--json"],
        ["status", "hostile", "--watch", "--count", "1", "--interval", "0.1"],
        ["doctor", "hostile", "--json"],
    ],
    ids=["status", "watch", "doctor"],
)
def test_commands_against_a_hostile_engine_end_with_a_message(handler, argv, tmp_path, monkeypatch):
    """`status`, `status --watch` and `doctor` against an engine port that trickles, answers
    something other than HTTP, or sends 200 MB: each ends within its per-request deadline
    (5 s) with exit 1 and the endpoint named, never a traceback or a hang."""
    from typer.testing import CliRunner

    from pdlaunch.cli import app

    state_dir = tmp_path / "state"
    monkeypatch.setenv("PDLAUNCH_STATE_DIR", str(state_dir))
    monkeypatch.setenv("COLUMNS", "300")
    with hostile(handler) as base:
        _record(state_dir, base)
        t0 = time.monotonic()
        res = CliRunner().invoke(app, argv, catch_exceptions=False)
        took = time.monotonic() - t0
    assert res.exit_code == 1, res.output
    assert took < 12, took
    assert "Traceback" not in res.output
    assert base in res.output, res.output
