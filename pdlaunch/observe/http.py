"""The one HTTP client pdlaunch uses for the endpoints it launched: health, /metrics, canary.

Those endpoints are not trusted to behave. A request here:

* ends by a wall-clock deadline, whatever the server does: a socket timeout only bounds one
  read, and a server that trickles a byte a second never trips it; a timer shuts the socket
  down at the deadline, which wakes a read blocked anywhere inside ``http.client``;
* reads at most ``max_bytes`` of body (a ``Content-Length`` above it is refused unread), so a
  200 MB /metrics cannot take the control host's memory;
* never raises anything but :class:`HttpError` (an ``OSError``), whose message names the
  endpoint: refused, timed out, not HTTP, cut short, too large. HTTP error statuses are
  answers, returned to the caller.

Proxies are never used: these are cluster-internal addresses an ``http_proxy`` in the
operator's shell must not capture (``http.client`` reads no proxy variable).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

HEALTH_MAX_BYTES = 64 * 1024  # /health answers nothing (vLLM) or a short JSON (vllm-router)
METRICS_MAX_BYTES = 16 * 1024 * 1024  # a large engine's /metrics is a few hundred KB
JSON_MAX_BYTES = 4 * 1024 * 1024  # a canary completion of 4 tokens
_CHUNK = 64 * 1024


class HttpError(OSError):
    """No usable answer from ``url``; ``str()`` is the whole message, endpoint included.
    ``status``: the HTTP status when one was received (the body was the problem)."""

    def __init__(self, url: str, why: str, status: int | None = None):
        super().__init__(f"{url}: {why}")
        self.url = url
        self.why = why
        self.status = status

    def __str__(self) -> str:
        return f"{self.url}: {self.why}"


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def request(
    url: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
    max_bytes: int = HEALTH_MAX_BYTES,
) -> Response:
    """One request to ``url`` (http only), finished within ``timeout`` seconds of wall-clock
    time, body capped at ``max_bytes``. Raises :class:`HttpError` for anything but an HTTP
    answer read whole."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # a port out of range, a bad IPv6 literal
        raise HttpError(url, f"invalid URL ({exc})") from None
    if parts.scheme != "http" or not host:
        raise HttpError(url, "not an http:// URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = time.monotonic() + timeout
    conn = http.client.HTTPConnection(host, port or 80, timeout=max(timeout, 0.001))
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        length = resp.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > max_bytes:
            raise HttpError(
                url, f"answer too large ({int(length)} bytes; at most {max_bytes} read)",
                resp.status,
            )  # fmt: skip
        data = bytearray()
        while True:
            if time.monotonic() > deadline:
                expired.set()
                break
            chunk = resp.read(min(_CHUNK, max_bytes + 1 - len(data)))
            if not chunk:
                break
            data += chunk
            if len(data) > max_bytes:
                raise HttpError(
                    url, f"answer too large (more than {max_bytes} bytes; truncated, not used)",
                    resp.status,
                )  # fmt: skip
        if expired.is_set():
            raise HttpError(url, f"no complete answer within {timeout:g}s")
        return Response(resp.status, bytes(data))
    except HttpError:
        raise
    except (http.client.HTTPException, OSError, ValueError, UnicodeError) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise HttpError(url, f"no complete answer within {timeout:g}s") from None
        raise HttpError(url, _describe(exc)) from None
    finally:
        timer.cancel()
        conn.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, http.client.BadStatusLine):
        # RemoteDisconnected is one too: the server closed without a word
        if isinstance(exc, http.client.RemoteDisconnected):
            return "connection closed without an answer"
        line = str(exc)[:80]
        return f"not an HTTP answer ({line!r})" if line else "not an HTTP answer"
    if isinstance(exc, http.client.IncompleteRead):
        return f"answer cut short ({len(exc.partial)} bytes read)"
    if isinstance(exc, http.client.LineTooLong):
        return f"not a usable HTTP answer ({exc})"
    if isinstance(exc, http.client.HTTPException):
        return f"bad HTTP answer ({type(exc).__name__}: {exc})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror or exc})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"
