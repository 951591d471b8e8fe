"""One job done on many hosts at once: a function over items in threads, every result in
order and no thread left running behind the caller when one fails. Kept apart from the
connection pool, which it does not need, so launch, check, status and doctor fan out the
same way."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MAX_WORKERS = 64


def parallel(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    """``fn`` over ``items`` in threads; results in order; re-raises the first exception after
    all finished (so nothing is left running behind the caller's back)."""
    items = list(items)
    if not items:
        return []
    if len(items) == 1:
        return [fn(items[0])]
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(items))) as pool:
        futures = [pool.submit(fn, it) for it in items]
        results, first_exc = [], None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:
                results.append(None)
                first_exc = first_exc or exc
    if first_exc is not None:
        raise first_exc
    return results
