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

Data parallel as vLLM serves it without an external load balancer: ``--data-parallel-size N``
makes one API server in front of ranks 0..N-1 (``--data-parallel-hybrid-lb``: its own
``--data-parallel-size-local`` ranks from ``--data-parallel-start-rank``), counters per rank
(label ``engine``), the ``X-data-parallel-rank`` header an index into those ranks (HTTP 400
out of range, as vLLM's input processor), round robin without it. A prefilling rank hands out
its side channel port plus its rank, as vLLM does.

Behaviour is set by environment variables (topologies set them per instance via ``env``):

``FAKE_VLLM_MODE``      ``ok`` (default) | ``exit`` (exit 3 at start) | ``hang`` (never listen)
                        | ``unhealthy`` (``/health`` answers 503) | ``no_kv`` (ignore
                        ``kv_transfer_params``: recompute everything, i.e. not disaggregated)
                        | ``partial_kv`` (load only half the prompt's KV)
                        | ``corrupt_kv`` (load remote KV, but answer what garbage KV would
                        give: HTTP 200, disaggregated counters, wrong tokens)
``FAKE_VLLM_DELAY``     seconds to wait before listening (default 0)
``FAKE_VLLM_SIDE_CHANNEL_PORT``  the ``remote_port`` a prefill hands out (default: its HTTP
                        port); a port nothing listens on makes a real decode's NIXL
                        handshake with it fail (tests/system/engines/test_cpu_pd.py)
``FAKE_VLLM_REQUIRE_ENV``  comma-separated variable names that must be set (exit 4 otherwise);
                        only the names are ever printed, never the values
``FAKE_VLLM_NO_KV_RANKS``  comma-separated DP ranks that behave as ``no_kv`` (a rank that
                        cannot reach the other side's KV: vLLM recomputes)
``FAKE_VLLM_IGNORE_DP_RANK_HEADER``  ``1``: ignore ``X-data-parallel-rank`` (round robin)
``FAKE_VLLM_CHILDREN``  start that many child processes (``sleep``) in the engine's process
                        group, holding its log as stdout, as vLLM's EngineCore and workers do
"""

from __future__ import annotations

# Only light imports (no http.server, argparse): the benchmark starts 64 of these at once on
# a small machine, so each one's start-up CPU counts.
import json
import os
import signal
import socket
import sys
import threading
import time

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}


def log(msg: str) -> None:
    sys.stdout.write(f"fake-vllm[{os.getpid()}] {msg}\n")
    sys.stdout.flush()


class Engine:
    def __init__(
        self,
        model: str,
        host: str,
        port: int,
        no_kv: bool,
        unhealthy: bool,
        ranks: list[int] | None = None,
    ):
        self.model = model
        self.host = host
        self.port = port
        self.no_kv = no_kv
        self.corrupt_kv = os.environ.get("FAKE_VLLM_MODE") == "corrupt_kv"
        self.partial_kv = os.environ.get("FAKE_VLLM_MODE") == "partial_kv"
        self.unhealthy = unhealthy
        self.ranks = ranks or [0]
        self.no_kv_ranks = {
            int(r) for r in os.environ.get("FAKE_VLLM_NO_KV_RANKS", "").split(",") if r.strip()
        }
        self.ignore_rank_header = os.environ.get("FAKE_VLLM_IGNORE_DP_RANK_HEADER") == "1"
        self.lock = threading.Lock()
        self.tokens_of = {r: dict.fromkeys(SOURCES, 0) for r in self.ranks}
        self.requests_of = dict.fromkeys(self.ranks, 0)
        self.next_rank = 0  # round robin without the header
        self.next_block = 0

    @property
    def tokens(self) -> dict[str, int]:
        """The first rank's token counters (the only rank without data parallel)."""
        return self.tokens_of[self.ranks[0]]

    @property
    def requests(self) -> int:
        return sum(self.requests_of.values())

    def metrics(self) -> str:
        lines = [
            "# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.",
            "# TYPE vllm:prompt_tokens_by_source_total counter",
        ]
        with self.lock:
            for rank in self.ranks:
                for src in SOURCES:
                    lines.append(
                        "vllm:prompt_tokens_by_source_total"
                        f'{{engine="{rank}",model_name="{self.model}",source="{src}"}} '
                        f"{float(self.tokens_of[rank][src])}"
                    )
            lines.append("# TYPE vllm:request_success_total counter")
            for rank in self.ranks:
                lines.append(
                    f'vllm:request_success_total{{engine="{rank}",finished_reason="length",'
                    f'model_name="{self.model}"}} {float(self.requests_of[rank])}'
                )
        return "\n".join(lines) + "\n"

    def _rank(self, header: str | None) -> int | None:
        """The rank a request runs on (None: the header is out of range)."""
        if header is None or self.ignore_rank_header:
            with self.lock:
                self.next_rank = (self.next_rank + 1) % len(self.ranks)
                return self.ranks[self.next_rank - 1]
        index = int(header)
        return self.ranks[index] if 0 <= index < len(self.ranks) else None

    def get(self, path: str) -> tuple[int, str, bytes]:
        if path == "/health":
            return (503 if self.unhealthy else 200), "text/plain", b""
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", self.metrics().encode()
        if path in ("/v1/models", "/models"):
            return _json(
                200,
                {
                    "object": "list",
                    "data": [{"id": self.model, "object": "model", "owned_by": "fake-vllm"}],
                },
            )
        if path == "/version":
            return _json(200, {"version": "0.0.0-fake"})
        return _json(404, {"error": f"no route {path}"})

    def post(self, path: str, raw: bytes, rank_header: str | None = None) -> tuple[int, str, bytes]:
        try:
            req = json.loads(raw or b"{}")
            rank = self._rank(rank_header)
        except ValueError:
            return _json(400, {"error": "bad json or rank header"})
        if rank is None:
            return _json(400, {"error": f"data_parallel_rank {rank_header} is out of range"})
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return _json(404, {"error": f"no route {path}"})
        if req.get("model") not in (None, self.model):
            return _json(404, {"error": {"message": f"model {req.get('model')} not found"}})
        if path == "/v1/chat/completions":
            prompt = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
        else:
            prompt = req.get("prompt", "")
            if isinstance(prompt, list):
                prompt = " ".join(map(str, prompt))
        n = max(1, len(str(prompt).split()))
        no_kv = self.no_kv or rank in self.no_kv_ranks
        kv = {} if no_kv else (req.get("kv_transfer_params") or {})
        multi = len(self.ranks) > 1
        tokens = self.tokens_of[rank]
        out_kv = None
        with self.lock:
            self.requests_of[rank] += 1
            if kv.get("do_remote_decode"):  # prefill for a remote decode
                tokens["local_compute"] += n
                blocks = list(range(self.next_block, self.next_block + max(1, n // 16)))
                self.next_block += len(blocks)
                out_kv = {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    # one list per KV cache group, as vLLM 0.32 returns them (a real decode
                    # handed a flat list fails in its own failure logging and never answers)
                    "remote_block_ids": [blocks],
                    "remote_engine_id": f"fake-{self.port}" + (f"-dp{rank}" if multi else ""),
                    "remote_request_id": f"cmpl-fake-{self.requests}",
                    "remote_host": self.host,
                    "remote_port": int(os.environ.get("FAKE_VLLM_SIDE_CHANNEL_PORT") or self.port)
                    + (rank if multi else 0),
                    "tp_size": 1,
                }
                max_tokens = 1
            elif kv.get("remote_block_ids") is not None:  # decode of a remote prefill
                loaded = n // 2 if self.partial_kv else n - 1
                tokens["external_kv_transfer"] += loaded
                tokens["local_compute"] += n - loaded
                max_tokens = int(req.get("max_tokens") or 16)
            else:
                tokens["local_compute"] += n
                max_tokens = int(req.get("max_tokens") or 16)
            count = self.requests
        word = " tok"
        if self.corrupt_kv and kv.get("remote_block_ids") is not None:
            word = " garbage"
        text = word * max_tokens
        if path == "/v1/chat/completions":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return _json(
            200,
            {
                "id": f"cmpl-fake-{count}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": n,
                    "completion_tokens": max_tokens,
                    "total_tokens": n + max_tokens,
                },
                "kv_transfer_params": out_kv,
            },
        )


def _json(code: int, obj: object) -> tuple[int, str, bytes]:
    return code, "application/json", json.dumps(obj).encode()


def _handle(conn: socket.socket, engine: Engine) -> None:
    """One HTTP/1.1 request per connection (answered with Connection: close)."""
    try:
        conn.settimeout(30)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target = lines[0].split(" ")[:2]
        pairs = (x.partition(":") for x in lines[1:])
        headers = {k.strip().lower(): v.strip() for k, _, v in pairs}
        length = int(headers.get("content-length") or 0)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        path = target.split("?", 1)[0]
        if method == "POST":
            code, ctype, out = engine.post(path, body[:length], headers.get("x-data-parallel-rank"))
        else:
            code, ctype, out = engine.get(path)
        log(f"{method} {path} -> {code}")
        conn.sendall(
            f"HTTP/1.1 {code} {REASONS.get(code, 'Error')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(out)}\r\nConnection: close\r\n\r\n".encode()
            + out
        )
    except (OSError, ValueError):
        pass
    finally:
        conn.close()


def _option(argv: list[str], name: str, default: str | None = None) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _dp_ranks(argv: list[str]) -> list[int]:
    size = int(_option(argv, "--data-parallel-size", "1") or 1)
    if "--data-parallel-hybrid-lb" not in argv:
        return list(range(size))
    start = int(_option(argv, "--data-parallel-start-rank", "0") or 0)
    return list(range(start, start + int(_option(argv, "--data-parallel-size-local", "1") or 1)))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "serve":
        sys.stderr.write("usage: fake_vllm.py serve MODEL [--host H] [--port P] ...\n")
        return 2
    host = _option(argv, "--host", "0.0.0.0")
    port = int(_option(argv, "--port", "8000"))
    model = _option(argv, "--served-model-name") or argv[1]
    headless = "--headless" in argv
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    log(f"starting: model={model} host={host} port={port} mode={mode}")

    required = [n for n in os.environ.get("FAKE_VLLM_REQUIRE_ENV", "").split(",") if n]
    missing = [name for name in required if not os.environ.get(name)]
    if missing:
        log(f"error: required variable(s) not set: {', '.join(missing)}")
        return 4
    for name in required:
        log(f"required variable {name} is set")

    delay = float(os.environ.get("FAKE_VLLM_DELAY", "0") or 0)
    if delay:
        time.sleep(delay)
    if mode == "exit":
        log("error: simulated engine failure at start (FAKE_VLLM_MODE=exit)")
        return 3
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for _ in range(int(os.environ.get("FAKE_VLLM_CHILDREN", "0") or 0)):
        child = os.fork()  # inherits the group and the log, like EngineCore and its workers
        if child == 0:
            os.execvp("sleep", ["sleep", "3600"])
        log(f"child pid {child}")
    if mode == "hang" or headless:
        log("not listening (hang/headless)")
        while not stop.wait(3600):
            pass
        return 0

    engine = Engine(
        model, host, port, no_kv=mode == "no_kv", unhealthy=mode == "unhealthy",
        ranks=_dp_ranks(argv),
    )  # fmt: skip
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(128)

    def accept_loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=_handle, args=(conn, engine), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    log(f"serving on http://{host}:{port}")
    stop.wait()
    log("terminated")
    srv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
