"""tests/support/fake_vllm.py's Engine served over real HTTP on loopback, for the tests that
judge engines through their endpoints (the canary, hostile /metrics pages)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.fake_vllm import Engine as FakeEngine


@dataclass
class Served:
    engine: FakeEngine
    url: str
    posts: list[dict]
    rank_headers: list[str | None]  # each POST's X-data-parallel-rank


@contextlib.contextmanager
def serve(engine: FakeEngine, extra_requests: int = 0) -> Iterator[Served]:
    """``engine`` on a loopback port. ``extra_requests``: that many first completions each
    also count one request of somebody else (a busy decode)."""
    posts: list[dict] = []
    rank_headers: list[str | None] = []
    busy = [extra_requests]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _reply(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._reply(*engine.get(self.path))

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            posts.append(json.loads(raw))
            header = self.headers.get("X-data-parallel-rank")
            rank_headers.append(header)
            reply = engine.post(self.path, raw, header)
            if busy[0] > 0:
                busy[0] -= 1
                with engine.lock:
                    engine.requests_of[engine.ranks[0]] += 1
                    engine.tokens["external_kv_transfer"] += 40
            self._reply(*reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    engine.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Served(engine, f"http://127.0.0.1:{engine.port}", posts, rank_headers)
    finally:
        server.shutdown()
        server.server_close()
