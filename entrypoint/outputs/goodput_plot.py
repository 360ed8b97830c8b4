"""A job's goodput timeline as a picture people can open: SVG with labels, or PNG drawn with the stdlib only.

``goodput --plot FILE`` hands ``write_plot`` the timeline its computation built: one lane per attempt and
replica (top to bottom), each a row of spans coloured by badput bucket, disruptions as red vertical lines with
their text, an elapsed-time axis and a legend of every bucket's seconds and share of the job's wall time. Both
formats are drawn from the same shapes (``_shapes``); the PNG leaves the text out (no font in the stdlib).
"""

from __future__ import annotations

import re
import struct
import zlib
from xml.sax.saxutils import escape

from entrypoint.errors import ConfigError
from entrypoint.outputs import storage

# Fixed colours: productive green, the disruption buckets red and orange, scheduling grey, the rest distinct.
COLOURS = {
    "productive": "#2ca02c", "program_startup": "#1f77b4", "training_preparation": "#9467bd",
    "data_loading": "#17becf", "checkpoint_save": "#8c564b", "checkpoint_restore": "#e377c2",
    "wasted_progress": "#d62728", "infrastructure_recovery": "#ff7f0e", "scheduling": "#999999",
    "evaluation": "#bcbd22", "export": "#393b79", "other": "#aec7e8",
}
UNKNOWN = "#dddddd"  # a bucket this module has no colour for
MARK = "#c00000"
WIDTH, LEFT, RIGHT, TOP, LANE, GAP = 1000, 260, 30, 44, 22, 8
LEGEND_COLUMNS, LEGEND_ROW = 3, 18
_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def colour(bucket: str) -> str:
    """The fill of ``bucket``'s spans and legend swatch."""
    return COLOURS.get(bucket, UNKNOWN)


def _ticks(span: float) -> tuple[list[float], float, str]:
    """Elapsed-time ticks for an axis ``span`` seconds long (at most about 8), the unit's seconds and its name."""
    step = next((s for s in _STEPS if span / s <= 8), _STEPS[-1])
    while span / step > 8:
        step *= 2
    unit, name = (1.0, "s") if step < 60 else (60.0, "min") if step < 3600 else (3600.0, "h")
    return [i * step for i in range(int(span / step + 1e-9) + 1)], unit, name


def _shapes(timeline: dict) -> tuple[int, int, list[tuple]]:
    """The picture as shapes: ``("rect", x, y, w, h, fill, bucket|None, tip)``, ``("line", x, y0, y1, colour)``
    (vertical), ``("hline", x0, x1, y, colour)`` and ``("text", x, y, text, anchor, size, extra)``."""
    start, end = float(timeline["start"]), float(timeline["end"])
    wall = max(end - start, 1e-9)
    plot_w = WIDTH - LEFT - RIGHT

    def x_of(t: float) -> float:
        return LEFT + (min(max(float(t), start), end) - start) / wall * plot_w

    shapes: list[tuple] = [("text", 12, 24, str(timeline.get("title", "")), "start", 15, ' font-weight="bold"')]
    lanes = list(timeline.get("lanes") or [])
    y = TOP
    if not lanes:
        shapes.append(("text", LEFT, y + 15, "no attempt recorded", "start", 12, ' fill="#666666"'))
        y += LANE + GAP
    for lane in lanes:
        shapes.append(("text", LEFT - 8, y + 15, str(lane.get("label", "")), "end", 12, ""))
        shapes.append(("rect", LEFT, y, plot_w, LANE, "#f4f4f4", None, ""))
        for span in lane.get("spans") or []:
            x0, x1, bucket = x_of(span["t0"]), x_of(span["t1"]), str(span["bucket"])
            tip = f"{bucket}: {float(span['t1']) - float(span['t0']):.1f} s"
            shapes.append(("rect", x0, y, max(x1 - x0, 0.5), LANE, colour(bucket), bucket, tip))
        for mark in lane.get("marks") or []:
            x = x_of(mark["t"])
            shapes.append(("line", x, y - 3, y + LANE + 3, MARK))
            shapes.append(("text", x + 3, y + 10, str(mark.get("text", "")), "start", 10,
                           f' fill="{MARK}" stroke="#ffffff" stroke-width="3" paint-order="stroke"'))
        y += LANE + GAP
    shapes.append(("hline", LEFT, LEFT + plot_w, y, "#333333"))
    ticks, unit, name = _ticks(end - start)
    for tick in ticks:
        x = LEFT + tick / wall * plot_w
        shapes.append(("line", x, y, y + 5, "#333333"))
        shapes.append(("text", x, y + 18, f"{tick / unit:g} {name}" if tick else "0", "middle", 11, ""))
    shapes.append(("text", LEFT - 8, y + 18, "elapsed", "end", 11, ' fill="#666666"'))
    y += 36
    column_w = (WIDTH - 24) // LEGEND_COLUMNS
    buckets = list((timeline.get("buckets") or {}).items())
    for i, (bucket, seconds) in enumerate(buckets):
        lx, ly = 12 + (i % LEGEND_COLUMNS) * column_w, y + (i // LEGEND_COLUMNS) * LEGEND_ROW
        share = 100.0 * float(seconds) / (end - start) if end > start else 0.0
        shapes.append(("rect", lx, ly, 12, 12, colour(str(bucket)), None, str(bucket)))
        shapes.append(("text", lx + 18, ly + 11, f"{bucket}  {float(seconds):.1f} s ({share:.1f}%)", "start", 12, ""))
    height = y + -(-len(buckets) // LEGEND_COLUMNS) * LEGEND_ROW + 12
    return WIDTH, int(height), shapes


def _text(value: str) -> str:
    return escape(_CONTROL.sub("?", value), {'"': "&quot;"})


def render_svg(timeline: dict) -> str:
    """The timeline as an SVG document (text labels included, every text escaped for XML)."""
    width, height, shapes = _shapes(timeline)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>']
    for shape in shapes:
        kind = shape[0]
        if kind == "rect":
            _, x, y, w, h, fill, bucket, tip = shape
            attrs = f' class="span" data-bucket="{_text(bucket)}"' if bucket is not None else ""
            body = f"<title>{_text(tip)}</title></rect>" if tip else "</rect>"
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{h}" fill="{fill}"{attrs}>{body}')
        elif kind == "line":
            _, x, y0, y1, stroke = shape
            cls = ' class="mark"' if stroke == MARK else ""
            out.append(f'<line x1="{x:.2f}" y1="{y0}" x2="{x:.2f}" y2="{y1}" stroke="{stroke}" '
                       f'stroke-width="{2 if cls else 1}"{cls}/>')
        elif kind == "hline":
            _, x0, x1, y, stroke = shape
            out.append(f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="{stroke}"/>')
        else:
            _, x, y, text, anchor, size, extra = shape
            out.append(f'<text x="{x:.2f}" y="{y}" font-size="{size}" text-anchor="{anchor}"{extra}>'
                       f"{_text(text)}</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _rgb(hex_colour: str) -> bytes:
    return bytes.fromhex(hex_colour.lstrip("#"))


def render_png(timeline: dict) -> bytes:
    """The timeline as an RGB PNG: the spans, lanes, axis, legend swatches and disruption lines, without text."""
    width, height, shapes = _shapes(timeline)
    rows = [bytearray(b"\xff" * (3 * width)) for _ in range(height)]

    def fill(x0: float, y0: float, x1: float, y1: float, rgb: bytes) -> None:
        left = max(0, round(x0))
        right = min(width, max(left + 1, round(x1)))
        for row in rows[max(0, int(y0)):min(height, int(y1))]:
            row[3 * left:3 * right] = rgb * (right - left)

    for shape in shapes:
        if shape[0] == "rect":
            _, x, y, w, h, hex_fill, _bucket, _tip = shape
            fill(x, y, x + w, y + h, _rgb(hex_fill))
        elif shape[0] == "line":
            _, x, y0, y1, stroke = shape
            fill(x - (1 if stroke == MARK else 0), y0, x + 1, y1, _rgb(stroke))
        elif shape[0] == "hline":
            _, x0, x1, y, stroke = shape
            fill(x0, y, x1, y + 1, _rgb(stroke))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(row) for row in rows)  # filter type 0 (none) on every scanline
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def write_plot(path: str, timeline: dict) -> None:
    """Write the timeline to ``path`` (local or ``gs://``) as SVG or PNG by its suffix; any other is a ConfigError."""
    suffix = str(path).lower()[-4:]
    if suffix not in (".svg", ".png"):
        raise ConfigError("--plot", f"{path} is neither .svg nor .png: --plot names a .svg or .png file")
    target = storage.path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # UTF-8 whatever the locale (labels hold "·"): one object on a store, written whole.
    target.write_bytes(render_svg(timeline).encode() if suffix == ".svg" else render_png(timeline))
