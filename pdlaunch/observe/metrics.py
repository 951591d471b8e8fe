"""Prometheus samples from /metrics text: counters and histograms read as evidence; histograms
subtracted (after - before) and their quantiles estimated.

Pure functions. A histogram family ``x`` is exposed by prometheus_client as cumulative
``x_bucket{le="..."}`` samples, ``x_sum`` and ``x_count``; samples of every label set (vLLM
labels each engine index and model) are added together. Quantiles are estimated like
PromQL's ``histogram_quantile``: linear inside the bucket holding the rank, so they are only
as fine as the buckets the runtime chose: a rank in the ``+Inf`` bucket is reported as the
highest finite bound with ``above=True``, one in the first bucket as its bound with
``below=True``.

It is also the one place where a sample of a /metrics page becomes evidence (the canary's,
bench's, watch's): :func:`counter` and :func:`read_histogram` say what on the page cannot be
believed (a value that is NaN, infinite, negative, beyond what a float counts exactly, not a
number; a series twice; a sample line of the family that does not parse), naming the series
and the value, so that a verdict is never drawn from a number every comparison is False for.
Any page gives an answer, never an exception.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# Above 2**53 a float no longer counts by one: a delta of a few hundred tokens between two
# such readings is rounding, not evidence.
EXACT = float(2**53)
_SHOWN = 3  # problems named per reading: one line stays readable


def _labels(raw: str | None) -> dict[str, str]:
    return dict(_LABEL.findall(raw or ""))


def _series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _samples(text: str, name: str) -> Iterator[tuple[str, dict[str, str], str] | str]:
    """(metric, labels, raw value) of every sample line whose metric starts with ``name``;
    a line of the family that does not parse as a sample is yielded as its problem."""
    for line in text.splitlines():
        if not line.startswith(name) or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if m is None:
            rest = line[len(name) :]
            if rest[:1] in ("{", " ", "\t") or rest.startswith(("_sum", "_count", "_bucket")):
                yield f"unreadable sample line {line[:80]!r}"
            continue
        metric, have, raw = m.groups()
        yield metric, _labels(have), raw


def _number(raw: str, *, count: bool) -> tuple[float, str | None]:
    """A sample value and why it is no evidence (None: it is). ``count``: a counter or a
    histogram count, which must also be below EXACT."""
    try:
        value = float(raw)
    except ValueError:
        return 0.0, "not a number"
    if math.isnan(value):
        return 0.0, "NaN"
    if math.isinf(value):
        return 0.0, "infinite"
    if value < 0:
        return 0.0, "negative (a counter never is)"
    if count and value > EXACT:
        return 0.0, "beyond 2**53 (a float no longer counts it by one)"
    return value, None


@dataclass(frozen=True)
class Reading:
    """A counter's value on a page (summed over the label sets asked for), and why it is no
    evidence: empty when it is."""

    value: float = 0.0
    problems: tuple[str, ...] = ()


def counter(text: str, name: str, **labels: str) -> Reading:
    """The sum of every sample of ``name`` whose labels include ``labels``; samples that are
    no evidence are left out of the value and named in ``problems``."""
    total = 0.0
    problems: list[str] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for sample in _samples(text, name):
        if isinstance(sample, str):
            problems.append(f"{name}: {sample}")
            continue
        metric, have, raw = sample
        if metric != name or not all(have.get(k) == v for k, v in labels.items()):
            continue
        key = tuple(sorted(have.items()))
        if key in seen:
            problems.append(f"{_series(name, have)} appears twice on the page")
            continue
        seen.add(key)
        value, why = _number(raw, count=True)
        if why is not None:
            problems.append(f"{_series(name, have)} = {raw[:40]}: {why}")
            continue
        total += value
    if not problems and total > EXACT:
        problems.append(f"{name} sums to {total:g}: beyond 2**53 (a float no longer counts by one)")
    return Reading(total, tuple(problems[:_SHOWN]))


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
    None if absent, or if any of its samples is no evidence (:func:`read_histogram` says
    which)."""
    h, problems = read_histogram(text, name, **labels)
    return None if problems else h


def read_histogram(text: str, name: str, **labels: str) -> tuple[Histogram | None, tuple[str, ...]]:
    """The histogram family ``name`` summed over its label sets that include ``labels``
    (None if absent), and why it is no evidence: a count, bucket or sum that is not a finite
    number >= 0, a bound that is not a number, a series twice. A family with problems is
    returned as None."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    seen_series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    problems: list[str] = []
    seen = False
    for sample in _samples(text, name):
        if isinstance(sample, str):
            problems.append(f"{name}: {sample}")
            continue
        metric, have, raw = sample
        if metric not in (name + "_bucket", name + "_sum", name + "_count"):
            continue
        if labels and not all(have.get(k) == v for k, v in labels.items()):
            continue
        key = (metric, tuple(sorted(have.items())))
        if key in seen_series:
            problems.append(f"{_series(metric, have)} appears twice on the page")
            continue
        seen_series.add(key)
        value, why = _number(raw, count=metric != name + "_sum")
        if why is not None:
            problems.append(f"{_series(metric, have)} = {raw[:40]}: {why}")
            continue
        seen = True
        if metric == name + "_bucket":
            bound = _bound(have.get("le"))
            if bound is None:
                problems.append(f"{_series(metric, have)}: its le is not a bound")
                continue
            buckets[bound] = buckets.get(bound, 0.0) + value
        elif metric == name + "_sum":
            total += value
        else:
            count += value
    if not math.isfinite(total) or count > EXACT:
        problems.append(f"{name}: its sum or count overflows when the label sets are added")
    if problems:
        return None, tuple(problems[:_SHOWN])
    if not seen:
        return None, ()
    return Histogram(tuple(sorted(buckets.items())), total, count), ()


def _bound(le: str | None) -> float | None:
    if le is None:
        return None
    if le in ("+Inf", "Inf"):
        return math.inf
    try:
        value = float(le)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


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
