"""Prometheus histograms from /metrics text: parse, subtract (after - before), quantiles.

Pure functions. A histogram family ``x`` is exposed by prometheus_client as cumulative
``x_bucket{le="..."}`` samples, ``x_sum`` and ``x_count``; samples of every label set (vLLM
labels each engine index and model) are added together. Quantiles are estimated like
PromQL's ``histogram_quantile``: linear inside the bucket holding the rank, so they are only
as fine as the buckets the runtime chose: a rank in the ``+Inf`` bucket is reported as the
highest finite bound with ``above=True``, one in the first bucket as its bound with
``below=True``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LE = re.compile(r'(?:^|,)\s*le="([^"]*)"')


@dataclass(frozen=True)
class Histogram:
    # (upper bound, cumulative count), ascending, +Inf last.
    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def __sub__(self, other: Histogram) -> Histogram:
        """What was observed between ``other`` (earlier) and ``self`` (later): buckets the
        earlier text lacked count as zero there."""
        before = dict(other.buckets)
        return Histogram(
            tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
            self.sum - other.sum,
            self.count - other.count,
        )

    def went_back(self) -> bool:
        """A delta with negative counts: the process restarted between the two reads."""
        return self.count < 0 or any(c < 0 for _, c in self.buckets)


@dataclass(frozen=True)
class Quantile:
    value: float
    above: bool = False  # the rank is in the +Inf bucket: the value is at least this
    below: bool = False  # the rank is in the first bucket: the value is at most this


def parse(text: str, name: str, **labels: str) -> Histogram | None:
    """The histogram family ``name`` summed over its label sets that include ``labels``;
    None if absent."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    seen = False
    for line in text.splitlines():
        if not line or line[0] == "#" or not line.startswith(name):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        metric, have, raw = m.groups()
        if labels and not all(f'{k}="{v}"' in (have or "") for k, v in labels.items()):
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if metric == name + "_bucket":
            le = _LE.search(have or "")
            if le is None:
                continue
            bound = math.inf if le.group(1) in ("+Inf", "Inf") else float(le.group(1))
            buckets[bound] = buckets.get(bound, 0.0) + value
            seen = True
        elif metric == name + "_sum":
            total += value
            seen = True
        elif metric == name + "_count":
            count += value
            seen = True
    if not seen:
        return None
    return Histogram(tuple(sorted(buckets.items())), total, count)


def quantile(h: Histogram, q: float) -> Quantile | None:
    """The ``q`` quantile (0..1) of ``h``, interpolated in its bucket; None when nothing was
    observed. A rank in the first bucket gives that bucket's bound with ``below=True``:
    interpolating from 0 would invent a value (vLLM's queue-time buckets start at 0.3 s)."""
    if not h.buckets:
        return None
    total = h.buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, prev = 0.0, 0.0
    for le, cum in h.buckets:
        if cum >= rank and cum > prev:
            if math.isinf(le):
                finite = [b for b, _ in h.buckets if not math.isinf(b)]
                return Quantile(finite[-1] if finite else lower, above=True)
            if prev == 0 and lower == 0.0:
                return Quantile(le, below=True)
            return Quantile(lower + (le - lower) * (rank - prev) / (cum - prev))
        lower, prev = le, cum
    return Quantile(lower)
