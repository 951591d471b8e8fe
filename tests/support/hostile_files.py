"""Files a careless user or an attacker hands pdlaunch where it expects a small JSON or YAML
file (issue 32): each must be refused with one line naming the file and the bound, without
hanging (a FIFO with no writer), without reading it whole (/dev/zero, a sparse 1 GiB file:
no disk used) and without a traceback (deep nesting, Infinity, numbers beyond a float)."""

from __future__ import annotations

import os
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

KINDS = ("fifo", "dev-zero", "sparse-1gib", "deep", "infinity", "1e999")


def make(directory: Path, name: str, kind: str) -> Path:
    """``directory/name`` as a hostile file of ``kind`` (one of KINDS)."""
    path = directory / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "sparse-1gib":
        with open(path, "wb") as f:
            f.truncate(1 << 30)
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "infinity":
        path.write_text('{"a": Infinity, "b": NaN}')
    elif kind == "1e999":
        path.write_text('{"a": 1e999}')
    else:
        raise ValueError(kind)
    return path


def bounded_call(fn: Callable[[], T], seconds: float = 30.0) -> tuple[T, int]:
    """``fn()``'s result and the peak bytes Python allocated while it ran; an AssertionError
    when it does not return within ``seconds`` (a read blocked on a FIFO)."""
    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(fn())
        except BaseException as exc:
            failed.append(exc)

    tracemalloc.start()
    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(seconds)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if failed:
        raise failed[0]
    assert done, f"did not return within {seconds:g} s (blocked reading the file?)"
    return done[0], peak
