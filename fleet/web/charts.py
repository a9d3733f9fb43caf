"""Charts drawn on the server as SVG: no script, no library, and they print.

Invariants: every label is escaped; colours come from CSS classes (`c-ok`, `c-fail`, …), so
the page's light and dark themes both apply and the page's policy (no inline style) holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 180
PAD_LEFT, PAD_BOTTOM, PAD_TOP = 48, 28, 10


def _axis(top: float) -> list[str]:
    """Horizontal grid lines with their values, from 0 to `top`."""
    out = []
    for i in range(5):
        value = top * i / 4
        y = HEIGHT - PAD_BOTTOM - (HEIGHT - PAD_BOTTOM - PAD_TOP) * i / 4
        label = f"{value:.2f}" if top < 4 else f"{value:.0f}"
        out.append(
            f'<line class="grid" x1="{PAD_LEFT}" x2="{WIDTH}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{PAD_LEFT - 6}" y="{y + 4:.1f}"'
            f' text-anchor="end">{label}</text>'
        )
    return out


def bars(
    points: Sequence[tuple[str, Sequence[float]]],
    classes: Sequence[str],
    title: str,
    unit: str = "",
) -> Markup:
    """Stacked bars, one per point (label, values by class), labelled under the axis."""
    if not points:
        return Markup(f'<p class="empty">No {escape(title.lower())} yet.</p>')
    top = max(sum(values) for _, values in points) or 1.0
    inner_w = WIDTH - PAD_LEFT
    inner_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    step = inner_w / len(points)
    width = max(2.0, step * 0.7)
    shapes = _axis(top)
    every = max(1, len(points) // 10)
    for i, (label, values) in enumerate(points):
        x = PAD_LEFT + i * step + (step - width) / 2
        y = float(HEIGHT - PAD_BOTTOM)
        for value, kind in zip(values, classes, strict=False):
            h = inner_h * value / top
            y -= h
            tip = f"{label}: {value:g}{unit}"
            shapes.append(
                f'<rect class="{kind}" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}"'
                f' height="{h:.1f}"><title>{escape(tip)}</title></rect>'
            )
        if i % every == 0:
            shapes.append(
                f'<text class="tick" x="{x + width / 2:.1f}" y="{HEIGHT - 10}"'
                f' text-anchor="middle">{escape(label)}</text>'
            )
    return _svg(title, shapes)


def timeline(
    rows: Sequence[tuple[str, Sequence[tuple[float, float, str, str]]]],
    start: float,
    end: float,
    title: str,
) -> Markup:
    """A lane per row (a coder) with a bar per span (from, to, kind class, tooltip)."""
    if not rows or end <= start:
        return Markup(f'<p class="empty">No {escape(title.lower())} in this period.</p>')
    lane = 26
    height = PAD_TOP + lane * len(rows) + PAD_BOTTOM
    inner_w = WIDTH - PAD_LEFT - 70
    shapes = []
    for i, (name, spans) in enumerate(rows):
        y = PAD_TOP + i * lane
        shapes.append(
            f'<text class="tick" x="{PAD_LEFT + 64}" y="{y + 17}" text-anchor="end">'
            f"{escape(name)}</text>"
            f'<line class="grid" x1="{PAD_LEFT + 70}" x2="{WIDTH}" y1="{y + 13}" y2="{y + 13}"/>'
        )
        for begin, finish, kind, tip in spans:
            x0 = PAD_LEFT + 70 + inner_w * (max(begin, start) - start) / (end - start)
            x1 = PAD_LEFT + 70 + inner_w * (min(finish, end) - start) / (end - start)
            shapes.append(
                f'<rect class="{kind}" x="{x0:.1f}" y="{y + 4}" width="{max(2.0, x1 - x0):.1f}"'
                f' height="18" rx="3"><title>{escape(tip)}</title></rect>'
            )
    return _svg(title, shapes, height)


def _svg(title: str, shapes: list[str], height: int = HEIGHT) -> Markup:
    return Markup(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" role="img"'
        f' aria-label="{escape(title)}" preserveAspectRatio="xMidYMid meet">'
        f"<title>{escape(title)}</title>{''.join(shapes)}</svg>"
    )
