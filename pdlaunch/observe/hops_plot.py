"""The per-hop breakdown of a benchmark as a standalone SVG (no plotting dependency: a
browser opens it). One row per hop: a bar to p50 and a lighter one to p99 on a log time axis
(hops span milliseconds to minutes), the mean as a tick, derived rows (means only) hatched
in words. Pure: a Breakdown in, SVG text out."""

from __future__ import annotations

import math
from html import escape

from pdlaunch.observe.bench_hops import Breakdown, kv_line

_ROW = 26
_LEFT = 330
_WIDTH = 900
_TOP = 60


def _x(seconds: float, lo: float, hi: float) -> float:
    span = math.log10(hi) - math.log10(lo)
    frac = (math.log10(max(seconds, lo)) - math.log10(lo)) / span
    return _LEFT + frac * (_WIDTH - _LEFT - 20)


def _drawn(v: float | None) -> float | None:
    """A value the log axis can place: finite and above 0 (a derived row's difference of
    means can be anything), else None (not drawn)."""
    return v if v is not None and math.isfinite(v) and 0 < v < 1e12 else None


def svg(b: Breakdown, title: str) -> str:
    values = [v for h in b.hops for v in (h.p50_s, h.p99_s, h.mean_s) if _drawn(v) is not None]
    # Sub-0.1 ms means (an idle queue) would stretch the axis over empty decades.
    lo = max(1e-4, 10 ** math.floor(math.log10(min(values)))) if values else 1e-3
    hi = 10 ** math.ceil(math.log10(max(values))) if values else 1.0
    if hi <= lo:
        hi = lo * 10
    height = _TOP + _ROW * len(b.hops) + 90
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="10" y="20" font-size="15" font-weight="bold">{escape(title)}</text>',
        '<text x="10" y="40" fill="#555">dark: p50, light: p99, black tick: mean '
        "(log scale; histogram estimates, derived rows: mean only)</text>",
    ]
    axis_y = _TOP + _ROW * len(b.hops) + 5
    decade = lo
    while decade <= hi * 1.0001:
        x = _x(decade, lo, hi)
        label = f"{decade * 1e3:g} ms" if decade < 1 else f"{decade:g} s"
        out.append(
            f'<line x1="{x:.1f}" y1="{_TOP - 5}" x2="{x:.1f}" y2="{axis_y}" stroke="#ddd"/>'
            f'<text x="{x:.1f}" y="{axis_y + 15}" text-anchor="middle">{label}</text>'
        )
        decade *= 10
    for i, h in enumerate(b.hops):
        y = _TOP + i * _ROW
        name = h.label + ("" if h.count else " (no data)")
        out.append(f'<text x="10" y="{y + 15}">{escape(name)}</text>')
        if p99 := _drawn(h.p99_s):
            w = _x(p99, lo, hi) - _LEFT
            out.append(
                f'<rect x="{_LEFT}" y="{y + 3}" width="{w:.1f}" height="16" fill="#9ecae1">'
                f"<title>p99 {escape(h.p99_bound)}{p99 * 1e3:.1f} ms</title></rect>"
            )
        if p50 := _drawn(h.p50_s):
            w = _x(p50, lo, hi) - _LEFT
            out.append(
                f'<rect x="{_LEFT}" y="{y + 3}" width="{w:.1f}" height="16" fill="#3182bd">'
                f"<title>p50 {escape(h.p50_bound)}{p50 * 1e3:.1f} ms</title></rect>"
            )
        if mean := _drawn(h.mean_s):
            x = _x(mean, lo, hi)
            fill = "#e6550d" if h.derived else "#000"
            out.append(
                f'<rect x="{x - 1:.1f}" y="{y}" width="3" height="22" fill="{fill}">'
                f"<title>mean {mean * 1e3:.1f} ms</title></rect>"
            )
    out.append(f'<text x="10" y="{axis_y + 40}">{escape(kv_line(b.kv))}</text>')
    for j, note in enumerate(b.notes[:1]):
        out.append(f'<text x="10" y="{axis_y + 58 + j * 16}" fill="#555">{escape(note)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
