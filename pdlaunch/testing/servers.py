"""The HTTP side of :class:`pdlaunch.testing.FakeRuntime`'s processes: each one answers on
127.0.0.1 (a port of its own) what the lifecycle's readiness probe and canary ask, as a vLLM
engine and vllm-router do, so `up`, `status` and the canary run for real against them.

What a disaggregated pair exposes (the wire shapes the repository's stand-in engine,
tests/support/fake_vllm.py, emulates; vLLM's NixlConnector hands out ``kv_transfer_params``):

* ``GET /health``: 503 while the process is starting (its behaviour's ``healthy_after``), 200
  after; ``GET /metrics``: ``vllm:prompt_tokens_by_source_total{source}`` and
  ``vllm:request_success_total``;
* ``POST /v1/completions`` on an engine: with ``kv_transfer_params.do_remote_decode`` it is a
  prefill (prompt counted as ``local_compute``, block ids handed out); with
  ``remote_block_ids`` a decode (all prompt tokens but the last loaded:
  ``external_kv_transfer``, unless the behaviour says ``serves_kv=False``); else local;
* ``POST /v1/completions`` on the router: one prefill, then one decode with the prefill's
  ``kv_transfer_params``, round robin, as vllm-router does in P/D mode.

A prompt's token count is its word count; the answer is ``" tok"`` per token, so the same
greedy request answers the same through the router and from one engine alone.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pdlaunch.observe.canary import prefill_body

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
#: one poll: what a process's /health answers, an HTTP status, or None for no answer at all
HealthHook = Callable[[], int | None]
#: whether it answers anything at all (running, not hung)
AnswersHook = Callable[[], bool]


class Engine:
    """One engine's counters and completions (thread-safe)."""

    def __init__(self, model: str, *, serves_kv: Callable[[], bool]):
        self.model = model
        self.serves_kv = serves_kv
        self.lock = threading.Lock()
        self.tokens = dict.fromkeys(SOURCES, 0)
        self.requests = 0
        self.port = 0  # set by its Server
        self._blocks = itertools.count()

    def metrics(self) -> str:
        with self.lock:
            lines = [
                "# TYPE vllm:prompt_tokens_by_source_total counter",
                *(
                    f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="{self.model}",'
                    f'source="{src}"}} {float(self.tokens[src])}'
                    for src in SOURCES
                ),
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{engine="0",finished_reason="length",'
                f'model_name="{self.model}"}} {float(self.requests)}',
            ]
        return "\n".join(lines) + "\n"

    def complete(self, req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if req.get("model") not in (None, self.model):
            return 404, {"error": {"message": f"model {req.get('model')} not found"}}
        prompt = req.get("prompt", "")
        words = " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
        n = max(1, len(words.split()))
        kv = req.get("kv_transfer_params") or {}
        if not self.serves_kv():
            kv = {}
        out_kv = None
        max_tokens = int(req.get("max_tokens") or 16)
        with self.lock:
            self.requests += 1
            if kv.get("do_remote_decode"):  # the prefill half of a P/D request
                self.tokens["local_compute"] += n
                blocks = [next(self._blocks) for _ in range(max(1, n // 16))]
                out_kv = {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_block_ids": [blocks],
                    "remote_engine_id": f"fake-{self.port}",
                    "remote_host": "127.0.0.1",
                    "remote_port": self.port,
                    "tp_size": 1,
                }
                max_tokens = 1
            elif kv.get("remote_block_ids") is not None:  # the decode half: KV loaded
                self.tokens["external_kv_transfer"] += n - 1
                self.tokens["local_compute"] += 1
            else:
                self.tokens["local_compute"] += n
            count = self.requests
        return 200, {
            "id": f"cmpl-fake-{count}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "text": " tok" * max_tokens, "finish_reason": "length"}],
            "usage": {
                "prompt_tokens": n,
                "completion_tokens": max_tokens,
                "total_tokens": n + max_tokens,
            },
            "kv_transfer_params": out_kv,
        }


class Server:
    """One process's HTTP server on 127.0.0.1 (a free port), its answers from the hooks."""

    def __init__(
        self,
        health: HealthHook,
        answers: AnswersHook,
        log: Callable[[str], None],
        *,
        engine: Engine | None = None,
        route: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]] | None = None,
    ):
        self.health, self.answers, self.log = health, answers, log
        self.engine, self.route = engine, route
        self.httpd = _Quiet(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.app = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        if engine is not None:
            engine.port = self.port
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop listening, without waiting (from any thread, a handler's included): the
        process already answers nothing (its health hook says None once it has ended)."""

        def _close() -> None:
            self.httpd.shutdown()
            self.httpd.server_close()

        threading.Thread(target=_close, daemon=True).start()

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes] | None:
        if method == "GET" and path == "/health":  # a poll (it may exit at this one)
            code = self.health()
            return None if code is None else (code, "text/plain", b"")
        if not self.answers():  # exited, or hung before listening: no answer at all
            return None
        if method == "GET" and path == "/metrics" and self.engine is not None:
            return 200, "text/plain; version=0.0.4", self.engine.metrics().encode()
        if method == "POST" and path == "/v1/completions":
            try:
                req = json.loads(body or b"{}")
            except ValueError:
                return _json(400, {"error": "bad json"})
            if self.engine is not None:
                return _json(*self.engine.complete(req))
            if self.route is not None:
                return _json(*self.route(req))
        return _json(404, {"error": f"no route {method} {path}"})


def _json(code: int, obj: object) -> tuple[int, str, bytes]:
    return code, "application/json", json.dumps(obj).encode()


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a probe's timeout): nothing to tell anyone


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def _serve(self, method: str) -> None:
        app: Server = self.server.app  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        out = app.answer(method, path, body)
        if out is None:
            self.close_connection = True
            return
        code, ctype, data = out
        app.log(f"{method} {path} -> {code}")
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the process's own log has the request line (Server.log)


def router(
    prefills: Callable[[], list[Engine]], decodes: Callable[[], list[Engine]]
) -> Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]:
    """vllm-router's P/D mode over the running engines: prefill, then decode, round robin."""
    turn = itertools.count()

    def route(req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        ps, ds = prefills(), decodes()
        if not ps or not ds:
            return 503, {"error": "no prefill or no decode worker is available"}
        i = next(turn)
        p, d = ps[i % len(ps)], ds[i % len(ds)]
        code, pre = p.complete(prefill_body(req))
        if code != 200:
            return code, pre
        return d.complete({**req, "kv_transfer_params": pre.get("kv_transfer_params")})

    return route
