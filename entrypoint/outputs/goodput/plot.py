"""A job's goodput timeline as a picture people can open: SVG with labels, or PNG drawn with the stdlib only.

``goodput --plot FILE`` hands ``write_plot`` the timeline its computation built: one lane per attempt and
replica (top to bottom), each a row of spans coloured by badput bucket, disruptions as red vertical lines with
their text, an elapsed-time axis and a legend of every bucket's seconds and share of the job's wall time. Both
formats are drawn from the same shapes (``_shapes``), their text included (the PNG's in ``bitmap_font.py``'s
glyphs), and every text is placed inside the picture: a disruption's text near the right edge goes to the left of
its line, a text longer than its room is cut in its middle (``...``).
"""

from __future__ import annotations

import re
import struct
import zlib
from xml.sax.saxutils import escape

from entrypoint.errors import ConfigError
from entrypoint.outputs import storage
from entrypoint.outputs.goodput import bitmap_font

# Fixed colours: productive green, the disruption buckets red and orange, scheduling grey, the rest distinct.
COLOURS = {
    "productive": "#2ca02c", "program_startup": "#1f77b4", "training_preparation": "#9467bd",
    "data_loading": "#17becf", "checkpoint_save": "#8c564b", "checkpoint_restore": "#e377c2",
    "wasted_progress": "#d62728", "infrastructure_recovery": "#ff7f0e", "scheduling": "#999999",
    "evaluation": "#bcbd22", "export": "#393b79", "other": "#aec7e8",
}
UNKNOWN = "#dddddd"  # a bucket this module has no colour for
MARK = "#c00000"
INK, GREY, HALO = "#000000", "#666666", "#ffffff"
WIDTH, LEFT, RIGHT, TOP, LANE, GAP = 1000, 260, 30, 44, 22, 8
LEGEND_COLUMNS, LEGEND_ROW = 3, 18
EDGE = 4  # pixels every text keeps from the picture's edges
_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def colour(bucket: str) -> str:
    """The fill of ``bucket``'s spans and legend swatch."""
    return COLOURS.get(bucket, UNKNOWN)


def scale(size: int) -> int:
    """The PNG glyphs' scale for an SVG font size (the title's 15 is drawn twice as large)."""
    return 2 if size >= 14 else 1


def text_width(text: str, size: int) -> float:
    """How wide ``text`` is at ``size``: the PNG's glyphs exactly, and no narrower than the SVG's sans-serif is on
    average (0.6 of its size per character)."""
    return max(float(bitmap_font.width(text, scale(size))), 0.6 * size * len(text))


def fit(text: str, size: int, room: float) -> str:
    """``text``, cut in its middle (``...``) to at most ``room`` pixels wide."""
    if text_width(text, size) <= room:
        return text
    keep = max(int(room // max(bitmap_font.ADVANCE * scale(size), 0.6 * size)) - 3, 2)  # characters, "..." aside
    return f"{text[:(keep + 1) // 2]}...{text[len(text) - keep // 2:]}"


def _text(x: float, y: float, text: str, anchor: str, size: int, fill: str = INK, bold: bool = False,
          halo: bool = False, lo: float = EDGE) -> tuple:
    """A text shape placed between ``lo`` and the picture's right edge: cut to that width, then moved in from an
    edge."""
    text = fit(text, size, WIDTH - EDGE - lo)
    w = text_width(text, size)
    left = x - {"start": 0.0, "middle": w / 2, "end": w}[anchor]
    x += max(lo - left, 0.0) - max(left + w - (WIDTH - EDGE), 0.0)
    return ("text", x, y, text, anchor, size, fill, bold, halo)


def _ticks(span: float) -> tuple[list[float], float, str]:
    """Elapsed-time ticks for an axis ``span`` seconds long (at most about 8), the unit's seconds and its name."""
    step = next((s for s in _STEPS if span / s <= 8), _STEPS[-1])
    while span / step > 8:
        step *= 2
    unit, name = (1.0, "s") if step < 60 else (60.0, "min") if step < 3600 else (3600.0, "h")
    return [i * step for i in range(int(span / step + 1e-9) + 1)], unit, name


def _shapes(timeline: dict) -> tuple[int, int, list[tuple]]:
    """The picture as shapes: ``("rect", x, y, w, h, fill, bucket|None, tip)``, ``("line", x, y0, y1, colour)``
    (vertical), ``("hline", x0, x1, y, colour)`` and ``("text", x, y, text, anchor, size, fill, bold, halo)`` (``y``
    its baseline; every text inside the picture)."""
    start, end = float(timeline["start"]), float(timeline["end"])
    wall = max(end - start, 1e-9)
    plot_w = WIDTH - LEFT - RIGHT

    def x_of(t: float) -> float:
        return LEFT + (min(max(float(t), start), end) - start) / wall * plot_w

    shapes: list[tuple] = [_text(12, 24, str(timeline.get("title", "")), "start", 15, bold=True)]
    lanes = list(timeline.get("lanes") or [])
    y = TOP
    if not lanes:
        shapes.append(_text(LEFT, y + 15, "no attempt recorded", "start", 12, GREY))
        y += LANE + GAP
    for lane in lanes:
        shapes.append(_text(LEFT - 8, y + 15, fit(str(lane.get("label", "")), 12, LEFT - 8 - EDGE), "end", 12))
        shapes.append(("rect", LEFT, y, plot_w, LANE, "#f4f4f4", None, ""))
        for span in lane.get("spans") or []:
            x0, x1, bucket = x_of(span["t0"]), x_of(span["t1"]), str(span["bucket"])
            tip = f"{bucket}: {float(span['t1']) - float(span['t0']):.1f} s"
            shapes.append(("rect", x0, y, max(x1 - x0, 0.5), LANE, colour(bucket), bucket, tip))
        for mark in lane.get("marks") or []:
            x, text = x_of(mark["t"]), str(mark.get("text", ""))
            shapes.append(("line", x, y - 3, y + LANE + 3, MARK))
            # to the right of its line, or to its left where the right has no room (an attempt ending the job);
            # over the lanes only, never their labels
            right = x + 3 + text_width(text, 10) <= WIDTH - EDGE or x - 3 - LEFT < WIDTH - EDGE - x - 3
            shapes.append(_text(x + 3 if right else x - 3, y + 10, text, "start" if right else "end", 10, MARK,
                                halo=True, lo=LEFT))
        y += LANE + GAP
    shapes.append(("hline", LEFT, LEFT + plot_w, y, "#333333"))
    ticks, unit, name = _ticks(end - start)
    for tick in ticks:
        x = LEFT + tick / wall * plot_w
        shapes.append(("line", x, y, y + 5, "#333333"))
        shapes.append(_text(x, y + 18, f"{tick / unit:g} {name}" if tick else "0", "middle", 11))
    shapes.append(_text(LEFT - 8, y + 18, "elapsed", "end", 11, GREY))
    y += 36
    column_w = (WIDTH - 24) // LEGEND_COLUMNS
    buckets = list((timeline.get("buckets") or {}).items())
    for i, (bucket, seconds) in enumerate(buckets):
        lx, ly = 12 + (i % LEGEND_COLUMNS) * column_w, y + (i // LEGEND_COLUMNS) * LEGEND_ROW
        share = 100.0 * float(seconds) / (end - start) if end > start else 0.0
        shapes.append(("rect", lx, ly, 12, 12, colour(str(bucket)), None, str(bucket)))
        entry = fit(f"{bucket}  {float(seconds):.1f} s ({share:.1f}%)", 12, column_w - 24)
        shapes.append(_text(lx + 18, ly + 11, entry, "start", 12))
    height = y + -(-len(buckets) // LEGEND_COLUMNS) * LEGEND_ROW + 12
    return WIDTH, int(height), shapes


def _xml(value: str) -> str:
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
            attrs = f' class="span" data-bucket="{_xml(bucket)}"' if bucket is not None else ""
            body = f"<title>{_xml(tip)}</title></rect>" if tip else "</rect>"
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
            _, x, y, text, anchor, size, fill, bold, halo = shape
            extra = (' font-weight="bold"' if bold else "") + (f' fill="{fill}"' if fill != INK else "") + \
                (f' stroke="{HALO}" stroke-width="3" paint-order="stroke"' if halo else "")
            out.append(f'<text x="{x:.2f}" y="{y}" font-size="{size}" text-anchor="{anchor}"{extra}>'
                       f"{_xml(text)}</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _rgb(hex_colour: str) -> bytes:
    return bytes.fromhex(hex_colour.lstrip("#"))


def render_png(timeline: dict) -> bytes:
    """The timeline as an RGB PNG: the spans, lanes, axis, legend swatches, disruption lines and every text."""
    width, height, shapes = _shapes(timeline)
    rows = [bytearray(b"\xff" * (3 * width)) for _ in range(height)]

    def fill(x0: float, y0: float, x1: float, y1: float, rgb: bytes) -> None:
        left = max(0, round(x0))
        right = min(width, max(left + 1, round(x1)))
        for row in rows[max(0, int(y0)):min(height, int(y1))]:
            row[3 * left:3 * right] = rgb * (right - left)

    def text(shape: tuple) -> None:
        _, x, y, words, anchor, size, ink, bold, halo = shape
        k = scale(size)
        w = bitmap_font.width(words, k)
        left = round(x - {"start": 0, "middle": w / 2, "end": w}[anchor])
        top = round(y) - bitmap_font.HEIGHT * k
        dots = list(bitmap_font.pixels(words, k))
        if halo:  # a white outline keeps the text readable over the coloured spans, as the SVG's stroke does
            for dx, dy in dots:
                fill(left + dx - 1, top + dy - 1, left + dx + 2, top + dy + 2, _rgb(HALO))
        for dx, dy in dots:
            fill(left + dx, top + dy, left + dx + (2 if bold else 1), top + dy + 1, _rgb(ink))

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
        else:
            text(shape)

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
    data = render_svg(timeline).encode() if suffix == ".svg" else render_png(timeline)
    try:
        target = storage.path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        # UTF-8 whatever the locale (labels hold "·"): one object on a store, written whole.
        target.write_bytes(data)
    except OSError as exc:  # a store's failure (StorageError) is classified as the store's
        why = exc.strerror or type(exc).__name__
        raise ConfigError("--plot", f"{path} cannot be written ({why}): name a file in a directory you can write "
                          "to") from None
