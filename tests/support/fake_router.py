#!/usr/bin/env python3
"""A stand-in for `vllm-router --vllm-pd-disaggregation` in launch tests (starts in < 1 s;
the real router's Python launcher takes seconds to import).

Takes the router's flags (``--prefill URL [BOOTSTRAP]``, ``--decode URL``, ``--host``,
``--port``; others ignored) and does what the real one does for a completion: send it to a
prefill with ``kv_transfer_params.do_remote_decode`` and ``max_tokens: 1``, then send it to a
decode with the ``kv_transfer_params`` the prefill returned.

``FAKE_ROUTER_MODE``: ``pd`` (default) | ``bypass`` (send straight to decode: served, but not
disaggregated, so the canary must fail) | ``exit`` (exit 3 at start).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def log(msg: str) -> None:
    sys.stdout.write(f"fake-router[{os.getpid()}] {msg}\n")
    sys.stdout.flush()


def parse(argv: list[str]) -> dict:
    opts = {"host": "127.0.0.1", "port": 30000, "prefill": [], "decode": []}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--host", "--port"):
            opts[a[2:]] = argv[i + 1]
            i += 2
        elif a in ("--prefill", "--decode"):
            opts[a[2:]].append(argv[i + 1].rstrip("/"))
            i += 2
            # an optional bootstrap port / "none" after a prefill URL
            while i < len(argv) and not argv[i].startswith("-"):
                i += 1
        else:
            i += 1
    opts["port"] = int(opts["port"])
    return opts


def post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with OPENER.open(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def main(argv: list[str]) -> int:
    opts = parse(argv)
    mode = os.environ.get("FAKE_ROUTER_MODE", "pd")
    log(f"starting: prefill={opts['prefill']} decode={opts['decode']} mode={mode}")
    if mode == "exit":
        log("error: simulated router failure")
        return 3
    prefills = itertools.cycle(opts["prefill"])
    decodes = itertools.cycle(opts["decode"])
    pick = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            log(f"{self.command} {self.path}")

        def _send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.split("?")[0] == "/health":
                self._send(200, b'"All servers healthy"')
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            with pick:
                p, d = next(prefills), next(decodes)
            if mode != "bypass":
                pre = dict(
                    body,
                    max_tokens=1,
                    stream=False,
                    kv_transfer_params={
                        "do_remote_decode": True,
                        "do_remote_prefill": False,
                        "remote_engine_id": None,
                        "remote_block_ids": None,
                        "remote_host": None,
                        "remote_port": None,
                    },
                )
                code, raw = post(p + self.path, pre)
                if code != 200:
                    self._send(code, raw)
                    return
                body = dict(body, kv_transfer_params=json.loads(raw).get("kv_transfer_params"))
            code, raw = post(d + self.path, body)
            self._send(code, raw)

    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer((opts["host"], opts["port"]), Handler)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"serving on http://{opts['host']}:{opts['port']}")
    stop.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
