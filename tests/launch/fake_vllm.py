#!/usr/bin/env python3
"""A stand-in for `vllm serve` in launch tests: starts in well under a second.

Invoked like the real thing (``fake_vllm.py serve MODEL --host H --port P ...``; unknown flags
are ignored) and serves ``/health``, ``/metrics``, ``/v1/models`` and ``/v1/completions``.

It emulates what a disaggregated P/D pair exposes, so the canary can be tested for real:

* a request with ``kv_transfer_params.do_remote_decode`` is a *prefill*: its prompt tokens are
  counted as ``local_compute`` and the response carries ``kv_transfer_params`` with
  ``remote_block_ids`` (as vLLM's NixlConnector returns them);
* a request with ``kv_transfer_params.remote_block_ids`` is a *decode* of a remotely prefilled
  prompt: all prompt tokens but the last count as ``external_kv_transfer`` (the last one is
  recomputed, as in vLLM);
* anything else is computed locally.

Counters are exposed as ``vllm:prompt_tokens_by_source_total{engine,model_name,source}``.

Behaviour is set by environment variables (topologies set them per instance via ``env``):

``FAKE_VLLM_MODE``      ``ok`` (default) | ``exit`` (exit 3 at start) | ``hang`` (never listen)
                        | ``unhealthy`` (``/health`` answers 503) | ``no_kv`` (ignore
                        ``kv_transfer_params``: recompute everything, i.e. not disaggregated)
``FAKE_VLLM_DELAY``     seconds to wait before listening (default 0)
``FAKE_VLLM_REQUIRE_ENV``  comma-separated variable names that must be set (exit 4 otherwise);
                        only the names are ever printed, never the values
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def log(msg: str) -> None:
    sys.stdout.write(f"fake-vllm[{os.getpid()}] {msg}\n")
    sys.stdout.flush()


class State:
    def __init__(self, model: str, host: str, port: int, no_kv: bool, unhealthy: bool):
        self.model = model
        self.host = host
        self.port = port
        self.no_kv = no_kv
        self.unhealthy = unhealthy
        self.lock = threading.Lock()
        self.tokens = dict.fromkeys(SOURCES, 0)
        self.requests = 0
        self.next_block = 0

    def metrics(self) -> str:
        lines = [
            "# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.",
            "# TYPE vllm:prompt_tokens_by_source_total counter",
        ]
        with self.lock:
            for src in SOURCES:
                lines.append(
                    "vllm:prompt_tokens_by_source_total"
                    f'{{engine="0",model_name="{self.model}",source="{src}"}} '
                    f"{float(self.tokens[src])}"
                )
            lines += [
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{engine="0",finished_reason="length",'
                f'model_name="{self.model}"}} {float(self.requests)}',
            ]
        return "\n".join(lines) + "\n"


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # one line per request, on stdout (the log file)
            log(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}")

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: object) -> None:
            self._send(code, json.dumps(obj).encode())

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/health":
                if state.unhealthy:
                    self._send(503, b"")
                else:
                    self._send(200, b"")
            elif path == "/metrics":
                self._send(200, state.metrics().encode(), "text/plain; version=0.0.4")
            elif path in ("/v1/models", "/models"):
                self._json(200, {"object": "list", "data": [
                    {"id": state.model, "object": "model", "owned_by": "fake-vllm"}]})
            elif path == "/version":
                self._json(200, {"version": "0.0.0-fake"})
            else:
                self._json(404, {"error": f"no route {path}"})

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._json(400, {"error": "bad json"})
                return
            if path not in ("/v1/completions", "/v1/chat/completions"):
                self._json(404, {"error": f"no route {path}"})
                return
            if req.get("model") not in (None, state.model):
                self._json(404, {"error": {"message": f"model {req.get('model')} not found"}})
                return
            if path == "/v1/chat/completions":
                prompt = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            else:
                prompt = req.get("prompt", "")
                if isinstance(prompt, list):
                    prompt = " ".join(map(str, prompt))
            n = max(1, len(str(prompt).split()))
            kv = req.get("kv_transfer_params") or {}
            if state.no_kv:
                kv = {}
            out_kv = None
            with state.lock:
                state.requests += 1
                if kv.get("do_remote_decode"):
                    state.tokens["local_compute"] += n
                    blocks = list(range(state.next_block, state.next_block + max(1, n // 16)))
                    state.next_block += len(blocks)
                    out_kv = {
                        "do_remote_prefill": True,
                        "do_remote_decode": False,
                        "remote_block_ids": blocks,
                        "remote_engine_id": f"fake-{state.port}",
                        "remote_host": state.host,
                        "remote_port": state.port,
                        "tp_size": 1,
                    }
                    max_tokens = 1
                elif kv.get("remote_block_ids") is not None:
                    state.tokens["external_kv_transfer"] += n - 1
                    state.tokens["local_compute"] += 1
                    max_tokens = int(req.get("max_tokens") or 16)
                else:
                    state.tokens["local_compute"] += n
                    max_tokens = int(req.get("max_tokens") or 16)
            text = " tok" * max_tokens
            if path == "/v1/chat/completions":
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "finish_reason": "length"}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            self._json(200, {
                "id": f"cmpl-fake-{state.requests}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": state.model,
                "choices": [choice],
                "usage": {"prompt_tokens": n, "completion_tokens": max_tokens,
                          "total_tokens": n + max_tokens},
                "kv_transfer_params": out_kv,
            })

    return Handler


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fake_vllm.py")
    p.add_argument("command", choices=["serve"])
    p.add_argument("model")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--headless", action="store_true")
    args, _unknown = p.parse_known_args(argv)
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    model = args.served_model_name or args.model
    log(f"starting: model={model} host={args.host} port={args.port} mode={mode}")

    missing = [
        name for name in filter(None, os.environ.get("FAKE_VLLM_REQUIRE_ENV", "").split(","))
        if not os.environ.get(name)
    ]
    if missing:
        log(f"error: required variable(s) not set: {', '.join(missing)}")
        return 4
    for name in filter(None, os.environ.get("FAKE_VLLM_REQUIRE_ENV", "").split(",")):
        log(f"required variable {name} is set")

    delay = float(os.environ.get("FAKE_VLLM_DELAY", "0") or 0)
    if delay:
        time.sleep(delay)
    if mode == "exit":
        log("error: simulated engine failure at start (FAKE_VLLM_MODE=exit)")
        return 3
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if mode == "hang" or args.headless:
        log("not listening (hang/headless)")
        while not stop.wait(3600):
            pass
        return 0

    state = State(model, args.host, args.port, no_kv=mode == "no_kv",
                  unhealthy=mode == "unhealthy")
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"serving on http://{args.host}:{args.port}")
    stop.wait()
    log("terminated")
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
