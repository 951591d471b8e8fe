"""Reading a process's log on a host: its last lines (``sh/read-log.sh``), or following it as
it grows like ``tail -F`` (``sh/follow-log.sh``), stopped from any thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from .errors import HostError
from .shell import sh_quote_path, with_args
from .transport import Stream, Transport

# The most of a log's end that is read: doctor asks 500 lines, `logs` 50; engine log lines are
# well under a KB, so 4 MiB holds them, and a log of one endless line does not come back whole.
LOG_TAIL_MAX_BYTES = 4 << 20


class LogReading(Transport):
    """Log files on a host, on top of its transport."""

    def read_log(self, path: str, lines: int = 50, max_bytes: int = LOG_TAIL_MAX_BYTES) -> str:
        """The last ``lines`` lines of a file, from its last ``max_bytes`` bytes at most (``""``
        if it does not exist; HostError if it is a symbolic link, which is not followed, or
        not a regular file)."""
        res = self._exec(
            with_args("read-log.sh", sh_quote_path(path), str(int(lines)), str(int(max_bytes))),
            timeout=60,
        )
        if res.rc != 0:
            raise HostError(
                f"{self.name}: cannot read {path}: {res.stderr.strip()}", host=self.name
            )
        return res.stdout

    def follow_log(
        self,
        path: str,
        *,
        lines: int = 10,
        stop: threading.Event | None = None,
        poll_interval: float = 0.2,
    ) -> LogFollower:
        """Follow a file like ``tail -F``: yields its last ``lines`` lines, then each new line
        (waits for the file to appear, follows rotation). Lines have no trailing newline.

        ``tail`` starts right away (not at the first ``next()``). Stops, killing ``tail`` on the
        host, when the returned iterator is closed (``.close()``, or leaving ``with``), when
        ``stop`` is set (checked every ``poll_interval`` s, so another thread can stop a consumer
        blocked waiting for lines), or when the host is closed::

            with host.follow_log("~/pdlaunch/prefill.log") as lines:
                for line in lines:
                    print(line)
        """
        command = with_args("follow-log.sh", sh_quote_path(path), str(int(lines)))
        stream = self._open_stream(command)
        self._keep_stream(stream)
        # Wait for the first line (the pid of tail), so that tail is running on return.
        buf, deadline = b"", time.monotonic() + 60
        while b"\n" not in buf and time.monotonic() < deadline:
            chunk = stream.read(0.5)
            if chunk is None:
                break
            buf += chunk
        head, sep, rest = buf.partition(b"\n")
        if not sep or not head.strip().isdigit():
            self._drop_stream(stream)
            stream.close()
            raise HostError(f"{self.name}: cannot follow {path}", host=self.name)
        stream.pid = int(head)
        return LogFollower(self, stream, stop=stop, poll_interval=poll_interval, buffered=rest)


class LogFollower(Iterator[str]):
    """Iterator over the lines of a followed log (see :meth:`LogReading.follow_log`)."""

    def __init__(
        self,
        host: Transport,
        stream: Stream,
        *,
        stop: threading.Event | None,
        poll_interval: float,
        buffered: bytes = b"",
    ):
        self._host = host
        self._stream = stream
        self._stop = stop
        self._poll = poll_interval
        self._buf = bytearray(buffered)
        self._scanned = 0  # bytes of _buf already known to hold no newline
        self._closed = False

    def __next__(self) -> str:
        # A bytearray and a scan offset: a 50 MB line arrives in thousands of chunks, and
        # re-scanning or re-copying the whole buffer per chunk made that quadratic.
        stream = self._stream
        buf = self._buf
        while not self._closed:
            nl = buf.find(b"\n", self._scanned)
            if nl >= 0:
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                self._scanned = 0
                return line.decode("utf-8", errors="replace")
            self._scanned = len(buf)
            if self._stop is not None and self._stop.is_set():
                break
            chunk = stream.read(self._poll)
            if chunk is None:  # tail ended (file gone for good, host closed, ...)
                rest = bytes(buf)
                buf.clear()
                self._scanned = 0
                self.close()
                if rest:
                    return rest.decode("utf-8", errors="replace")
                break
            buf += chunk
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Stop following (kills ``tail``); idempotent, callable from any thread."""
        if self._closed:
            return
        self._closed = True
        self._host._drop_stream(self._stream)
        self._stream.close()

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
