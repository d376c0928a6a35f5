"""Inline SVG charts for the HTML reports: line charts (linear or log axes) and bar charts.

No dependencies and no script: each function returns one ``<svg>`` element as a string, sized by
its ``viewBox`` so it scales with the page. Colours are the Okabe-Ito palette (distinguishable
with the common colour-vision deficiencies); the second series of a pair is also dashed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
_LEFT, _RIGHT, _TOP, _BOTTOM = 62, 18, 44, 42


@dataclass(frozen=True)
class Series:
    """One line: points (xs[i], ys[i]); ``step`` draws a step function (for CDFs)."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str | None = None
    dashed: bool = False
    step: bool = False
    markers: bool = False


@dataclass(frozen=True)
class Mark:
    """A reference line across the plot at ``value`` on the x (``axis="x"``) or y axis."""

    value: float
    label: str
    axis: str = "y"
    color: str = "#444"


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    x_log: bool | None = False,
    y_log: bool = False,
    y_min: float | None = None,
    y_max: float | None = None,
    marks: Sequence[Mark] = (),
    shade: tuple[float, float, str] | None = None,
    width: int = 640,
    height: int = 300,
) -> str:
    """A line chart. ``x_log=None`` picks a log x axis when the data span more than a factor of 30.
    ``shade=(x0, x1, label)`` greys a region (e.g. warm-up)."""
    pts = [(s, _clean(s.xs, s.ys, x_log is True, y_log)) for s in series]
    xs = [x for _, p in pts for x, _ in p]
    ys = [y for _, p in pts for _, y in p]
    if x_log is None:
        pos = [x for x in xs if x > 0]
        x_log = bool(pos) and max(pos) / min(pos) > 30
        pts = [(s, _clean(s.xs, s.ys, x_log, y_log)) for s in series]
        xs = [x for _, p in pts for x, _ in p]
    xs += [m.value for m in marks if m.axis == "x"]
    ys += [m.value for m in marks if m.axis == "y"]
    parts = _frame(title, width, height)
    if not xs or not ys:
        parts.append(_text(width / 2, height / 2, "no data", anchor="middle", cls="muted"))
        return _close(parts)
    xa = _Axis(min(xs), max(xs), _LEFT, width - _RIGHT, x_log)
    ya = _Axis(
        min(ys) if y_min is None else y_min,
        max(ys) if y_max is None else y_max,
        height - _BOTTOM,
        _TOP,
        y_log,
    )
    parts += _grid(xa, ya, width, height, x_label, y_label)
    if shade is not None:
        x0, x1 = xa.px(max(shade[0], xa.lo)), xa.px(min(shade[1], xa.hi))
        if x1 > x0:
            parts.append(
                f'<rect x="{x0:.1f}" y="{_TOP}" width="{x1 - x0:.1f}" height="{height - _TOP - _BOTTOM}" fill="#f1f1f1"/>'
            )
            parts.append(_text((x0 + x1) / 2, _TOP + 12, shade[2], anchor="middle", cls="muted"))
    for m in marks:
        parts.append(_mark(m, xa, ya, width, height))
    for i, (s, p) in enumerate(pts):
        color = s.color or PALETTE[i % len(PALETTE)]
        parts.append(_path(s, p, xa, ya, color))
    parts.append(
        _legend(
            [(s.name, s.color or PALETTE[i % len(PALETTE)], s.dashed) for i, (s, _) in enumerate(pts)], width
        )
    )
    return _close(parts)


def bar_chart(
    labels: Sequence[str], values: Sequence[float], *, title: str, y_label: str, color: str = PALETTE[1],
    width: int = 640, height: int = 260,
) -> str:  # fmt: skip
    """Vertical bars, one per label, with the value printed above each."""
    parts = _frame(title, width, height)
    if not values:
        parts.append(_text(width / 2, height / 2, "none", anchor="middle", cls="muted"))
        return _close(parts)
    ya = _Axis(0, max(max(values), 1e-12), height - _BOTTOM, _TOP, False)
    for t in ya.ticks():
        y = ya.px(t)
        parts.append(f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(_text(_LEFT - 6, y + 4, _fmt(t), anchor="end"))
    parts.append(_text(14, (height - _BOTTOM + _TOP) / 2, y_label, anchor="middle", rotate=True))
    slot = (width - _LEFT - _RIGHT) / len(values)
    bar = min(slot * 0.7, 80)
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        x = _LEFT + slot * i + (slot - bar) / 2
        y = ya.px(v)
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{height - _BOTTOM - y:.1f}" fill="{color}"/>'
        )
        parts.append(_text(x + bar / 2, y - 4, _fmt(v), anchor="middle"))
        parts.append(_text(x + bar / 2, height - _BOTTOM + 16, label, anchor="middle"))
    return _close(parts)


class _Axis:
    def __init__(self, lo: float, hi: float, p0: float, p1: float, log: bool) -> None:
        if log:
            # Out to the 1-2-5 values around the data, so that even a range inside one step (15 to
            # 19 ms) has labelled ticks at both ends (10 and 20).
            lo, hi = (math.log10(v) for v in _log_bounds(lo, hi))
        if hi - lo < 1e-12:
            pad = abs(lo) * 0.05 or 1.0
            lo, hi = lo - pad, hi + pad
        elif not log:
            lo, hi = _nice_bounds(lo, hi)
        self.log, self.lo_t, self.hi_t, self.p0, self.p1 = log, lo, hi, p0, p1

    @property
    def lo(self) -> float:
        return 10**self.lo_t if self.log else self.lo_t

    @property
    def hi(self) -> float:
        return 10**self.hi_t if self.log else self.hi_t

    def px(self, v: float) -> float:
        t = math.log10(v) if self.log else v
        return self.p0 + (t - self.lo_t) / (self.hi_t - self.lo_t) * (self.p1 - self.p0)

    def ticks(self) -> list[float]:
        if self.log:
            decades = range(math.floor(self.lo_t), math.ceil(self.hi_t) + 1)
            steps = (1, 2, 5) if self.hi_t - self.lo_t < 3 else (1,)
            vals = [m * 10**d for d in decades for m in steps]
            out = [v for v in vals if self.lo * 0.999 <= v <= self.hi * 1.001]
            if len(out) >= 3:
                return out
            # A narrow log axis (10 to 20): evenly spaced values label it better than its two ends.
            step = _nice_step((self.hi - self.lo) / 5)
            first = math.ceil(self.lo / step - 1e-9) * step
            return [
                round(first + k * step, 12) for k in range(math.floor((self.hi - first) / step + 1e-9) + 1)
            ]
        step = _nice_step((self.hi_t - self.lo_t) / 5)
        first = math.ceil(self.lo_t / step - 1e-9) * step
        n = math.floor((self.hi_t - first) / step + 1e-9) + 1
        return [round(first + k * step, 12) for k in range(n)]


def _nice_step(raw: float) -> float:
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _log_bounds(lo: float, hi: float) -> tuple[float, float]:
    """The 1-2-5 values (or decades, over three decades or more) at or just outside [lo, hi]."""
    steps = (1, 2, 5) if math.log10(hi / lo) < 3 else (1,)
    grid = [
        m * 10**d for d in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2) for m in steps
    ]
    low = max(v for v in grid if v <= lo * 1.000001)
    return low, min(v for v in grid if v >= hi / 1.000001 and v > low * 1.000001)


def _nice_bounds(lo: float, hi: float) -> tuple[float, float]:
    step = _nice_step((hi - lo) / 5)
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def _clean(xs, ys, x_log: bool, y_log: bool) -> list[tuple[float, float]]:
    out = []
    for x, y in zip(xs, ys, strict=False):
        if x is None or y is None:
            continue
        x, y = float(x), float(y)
        if not (math.isfinite(x) and math.isfinite(y)) or (x_log and x <= 0) or (y_log and y <= 0):
            continue
        out.append((x, y))
    return out


def _frame(title: str, width: int, height: int) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" class="chart" role="img" '
        f'aria-label="{escape(title)}" font-family="system-ui, sans-serif" font-size="11">'
        f"<title>{escape(title)}</title>",
        _text(_LEFT, 16, title, cls="title"),
    ]


def _close(parts: list[str]) -> str:
    parts.append("</svg>")
    return "".join(parts)


def _grid(xa: _Axis, ya: _Axis, width: int, height: int, x_label: str, y_label: str) -> list[str]:
    out = [
        f'<rect x="{_LEFT}" y="{_TOP}" width="{width - _LEFT - _RIGHT}" height="{height - _TOP - _BOTTOM}" fill="#fff" stroke="#bbb"/>'
    ]
    for t in ya.ticks():
        y = ya.px(t)
        out.append(f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(_text(_LEFT - 6, y + 4, _fmt(t), anchor="end"))
    for t in xa.ticks():
        x = xa.px(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{height - _BOTTOM}" stroke="#eee"/>')
        out.append(_text(x, height - _BOTTOM + 16, _fmt(t), anchor="middle"))
    out.append(_text((_LEFT + width - _RIGHT) / 2, height - 6, x_label, anchor="middle"))
    out.append(_text(14, (height - _BOTTOM + _TOP) / 2, y_label, anchor="middle", rotate=True))
    return out


def _path(s: Series, pts: list[tuple[float, float]], xa: _Axis, ya: _Axis, color: str) -> str:
    if not pts:
        return ""
    coords = [(xa.px(x), ya.px(y)) for x, y in pts]
    d = [f"M{coords[0][0]:.1f},{coords[0][1]:.1f}"]
    for x1, y1 in coords[1:]:
        d.append(f"H{x1:.1f}V{y1:.1f}" if s.step else f"L{x1:.1f},{y1:.1f}")
    dash = ' stroke-dasharray="6 4"' if s.dashed else ""
    out = f'<path d="{"".join(d)}" fill="none" stroke="{color}" stroke-width="2"{dash}><title>{escape(s.name)}</title></path>'
    if s.markers or len(coords) == 1:
        out += "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in coords)
    return out


def _mark(m: Mark, xa: _Axis, ya: _Axis, width: int, height: int) -> str:
    if m.axis == "x":
        x = xa.px(m.value)
        return (
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{height - _BOTTOM}" stroke="{m.color}" stroke-dasharray="3 3"/>'
            + _text(x + 4, _TOP + 24, m.label, cls="muted")
        )
    y = ya.px(m.value)
    return (
        f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="{m.color}" stroke-dasharray="3 3"/>'
        + _text(width - _RIGHT - 4, y - 4, m.label, anchor="end", cls="muted")
    )


def _legend(items: list[tuple[str, str, bool]], width: int) -> str:
    out, x = [], float(_LEFT)
    for name, color, dashed in items:
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        out.append(
            f'<line x1="{x:.1f}" x2="{x + 18:.1f}" y1="32" y2="32" stroke="{color}" stroke-width="2"{dash}/>'
        )
        out.append(_text(x + 22, 36, name))
        x += 30 + 6.5 * len(name)
        if x > width - 60:
            break
    return "".join(out)


def _text(x: float, y: float, s: str, *, anchor: str = "start", cls: str = "", rotate: bool = False) -> str:
    rot = f' transform="rotate(-90 {x:.1f} {y:.1f})"' if rotate else ""
    c = _TEXT_STYLE.get(cls, "")
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{c}{rot}>{escape(str(s))}</text>'


def _fmt(v: float) -> str:
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:.4g}"


_TEXT_STYLE = {"title": ' font-weight="600" font-size="13"', "muted": ' fill="#666"'}

# Styles are presentation attributes, so a chart saved on its own looks the same; the page only sizes it.
CSS = "svg.chart { width: 100%; max-width: 760px; height: auto; display: block; }"

__all__ = ["CSS", "PALETTE", "Mark", "Series", "bar_chart", "line_chart"]
