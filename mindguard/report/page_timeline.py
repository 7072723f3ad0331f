"""The report page's timeline chart: the loss per global step as inline SVG, with the failing step and the steps
whose training state was kept marked."""
from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

from .page_html import e, num_text


def _nice(raw: float) -> float:
    """A round tick spacing (1, 2 or 5 times a power of ten) near ``raw``."""
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def timeline_svg(last: int, failing: Optional[int], losses: List[Tuple[int, Any, str]], kept: List[int]) -> str:
    width, height, left, right, top, bottom = 860, 220, 64, 16, 16, 40
    last = max([last, failing or 0] + [s for s, _, _ in losses] + [1])
    finite = [(s, float(v)) for s, v, _ in losses if isinstance(v, (int, float)) and math.isfinite(float(v))]
    bad = [(s, v) for s, v, _ in losses if not (isinstance(v, (int, float)) and math.isfinite(float(v)))]

    def x(step: float) -> float:
        return left + (width - left - right) * ((step - 1) / max(last - 1, 1) if last > 1 else 0.5)

    lo = min((v for _, v in finite), default=0.0)
    hi = max((v for _, v in finite), default=1.0)
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    step_size = _nice((hi - lo) / 4)
    lo, hi = math.floor(lo / step_size) * step_size, math.ceil(hi / step_size) * step_size
    levels = [lo + step_size * i for i in range(int(round((hi - lo) / step_size)) + 1)]

    def y(value: float) -> float:
        return top + (height - top - bottom) * (1 - (value - lo) / (hi - lo))

    parts = [f'<svg class="timeline" viewBox="0 0 {width} {height}" role="img" aria-label="loss per step">',
             f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
             f'class="plot"/>']
    for value in levels:
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}" y2="{y(value):.1f}" class="grid"/>'
                     f'<text x="{left - 6}" y="{y(value) + 4:.1f}" class="tick" text-anchor="end">'
                     f'{e(num_text(value))}</text>')
    ticks = sorted({1, last} | {int(round(1 + (last - 1) * i / 6)) for i in range(7)})
    for step in ticks:
        parts.append(f'<text x="{x(step):.1f}" y="{height - bottom + 16}" class="tick" text-anchor="middle">'
                     f'{step}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 6}" class="axis" text-anchor="middle">'
                 f'global step</text>')
    parts.append(f'<text x="14" y="{(top + height - bottom) / 2:.0f}" class="axis" text-anchor="middle" '
                 f'transform="rotate(-90 14 {(top + height - bottom) / 2:.0f})">loss</text>')
    if failing:
        parts.append(f'<rect x="{x(failing) - 3:.1f}" y="{top}" width="6" height="{height - top - bottom}" '
                     f'class="failband"/><text x="{min(x(failing) + 6, width - right - 4):.1f}" y="{top + 14}" '
                     f'class="faillabel" text-anchor="{"end" if x(failing) > width - 160 else "start"}">failing step '
                     f'{failing}</text>')
    for step in kept:
        parts.append(f'<line x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{top}" y2="{height - bottom}" class="kept">'
                     f'<title>training state kept at the beginning of step {step}</title></line>')
    if finite:
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(s):.1f},{y(v):.1f}" for i, (s, v) in enumerate(finite))
        parts.append(f'<path d="{path}" class="loss"/>')
        for s, v in finite:
            parts.append(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="2.6" class="pt"><title>step {s}: loss '
                         f'{e(num_text(v))}</title></circle>')
    for s, v in bad:
        parts.append(f'<text x="{x(s):.1f}" y="{height - bottom - 6}" class="badpt" text-anchor="middle">{e(v)}'
                     f'<title>step {s}: loss {e(v)}</title></text>')
    if not losses:
        parts.append(f'<text x="{(left + width) / 2:.0f}" y="{(top + height - bottom) / 2:.0f}" class="none" '
                     f'text-anchor="middle">loss per step: not recorded</text>')
    parts.append("</svg>")
    return "".join(parts)
