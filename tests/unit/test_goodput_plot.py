"""``goodput --plot``: the timeline as SVG (parsed back) and as PNG (decoded back with the stdlib)."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

from entrypoint.errors import ConfigError
from entrypoint.outputs.goodput import plot as goodput_plot
from entrypoint.outputs.goodput.plot import COLOURS, UNKNOWN, render_png, render_svg, write_plot

SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_700_000_000.0


def timeline(label: str = "attempt 1 · workerpool0[0] (chief)") -> dict:
    return {
        "title": "job /tmp/job: goodput 71.3% (provisional)", "start": T0, "end": T0 + 600,
        "lanes": [
            {"label": label,
             "spans": [{"t0": T0, "t1": T0 + 20, "bucket": "program_startup"},
                       {"t0": T0 + 20, "t1": T0 + 200, "bucket": "productive"},
                       {"t0": T0 + 200, "t1": T0 + 230, "bucket": "wasted_progress"}],
             "marks": [{"t": T0 + 230, "text": "peer_lost: worker 1 killed"}]},
            {"label": "attempt 2 · workerpool0[0] (chief)",
             "spans": [{"t0": T0 + 300, "t1": T0 + 320, "bucket": "checkpoint_restore"},
                       {"t0": T0 + 320, "t1": T0 + 600, "bucket": "a_new_bucket"}],
             "marks": []}],
        "buckets": {"productive": 180.0, "program_startup": 20.0, "wasted_progress": 30.0, "scheduling": 70.0,
                    "checkpoint_restore": 20.0, "a_new_bucket": 280.0}}


def texts(root: ET.Element) -> list[str]:
    return [element.text or "" for element in root.iter(f"{SVG}text")]


def test_svg_has_one_coloured_rect_per_span_the_labels_marks_axis_and_legend() -> None:
    root = ET.fromstring(render_svg(timeline()))
    spans = [rect for rect in root.iter(f"{SVG}rect") if rect.get("class") == "span"]
    assert [(rect.get("data-bucket"), rect.get("fill")) for rect in spans] == [
        ("program_startup", COLOURS["program_startup"]), ("productive", COLOURS["productive"]),
        ("wasted_progress", COLOURS["wasted_progress"]), ("checkpoint_restore", COLOURS["checkpoint_restore"]),
        ("a_new_bucket", UNKNOWN)]
    xs = [float(rect.get("x", "")) for rect in spans]
    assert xs[0] < xs[1] < xs[2] < xs[3] < xs[4]  # in time order, left to right
    words = texts(root)
    assert "job /tmp/job: goodput 71.3% (provisional)" in words
    assert "attempt 1 · workerpool0[0] (chief)" in words and "attempt 2 · workerpool0[0] (chief)" in words
    assert "peer_lost: worker 1 killed" in words
    assert len([line for line in root.iter(f"{SVG}line") if line.get("class") == "mark"]) == 1
    assert "0" in words and "10 min" in words  # a 10-minute job's axis in minutes
    assert "productive  180.0 s (30.0%)" in words and "a_new_bucket  280.0 s (46.7%)" in words


def test_svg_escapes_every_text() -> None:
    bad = timeline(label='<&> "quoted" \x01')
    bad["title"] = "a & b <c>"
    bad["lanes"][0]["marks"][0]["text"] = "</text><script>x</script>"
    bad["lanes"][0]["spans"][0]["bucket"] = 'b"<&>'
    svg = render_svg(bad)
    assert "<script>" not in svg
    root = ET.fromstring(svg)
    words = texts(root)
    assert '<&> "quoted" ?' in words and "a & b <c>" in words and "</text><script>x</script>" in words
    assert any(rect.get("data-bucket") == 'b"<&>' for rect in root.iter(f"{SVG}rect"))


def test_the_axis_unit_follows_the_span() -> None:
    assert goodput_plot._ticks(45)[2] == "s"
    assert goodput_plot._ticks(600)[2] == "min"
    ticks, _unit, name = goodput_plot._ticks(3 * 86400)
    assert name == "h" and len(ticks) <= 9 and ticks[-1] <= 3 * 86400


def test_no_lanes_still_renders() -> None:
    empty = {"title": "job x", "start": T0, "end": T0, "lanes": [], "buckets": {}}
    root = ET.fromstring(render_svg(empty))
    assert "job x" in texts(root)
    assert not [rect for rect in root.iter(f"{SVG}rect") if rect.get("class") == "span"]
    assert decode(render_png(empty))[0] > 0


def decode(png: bytes) -> tuple[int, int, bytes]:
    """Width, height and the raw scanlines of an 8-bit RGB PNG, checked chunk by chunk."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks = 8, []
    while offset < len(png):
        (length,) = struct.unpack(">I", png[offset:offset + 4])
        kind, data = png[offset + 4:offset + 8], png[offset + 8:offset + 8 + length]
        (crc,) = struct.unpack(">I", png[offset + 8 + length:offset + 12 + length])
        assert crc == zlib.crc32(kind + data) & 0xFFFFFFFF
        chunks.append((kind, data))
        offset += 12 + length
    assert [kind for kind, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, colour_type = struct.unpack(">IIBB", chunks[0][1][:10])
    assert (depth, colour_type) == (8, 2)
    raw = zlib.decompress(chunks[1][1])
    assert len(raw) == height * (1 + width * 3)
    return width, height, raw


def pixels(png: bytes, rgb: str) -> int:
    width, _height, raw = decode(png)
    target = bytes.fromhex(rgb.lstrip("#"))
    rows = [raw[i + 1:i + 1 + 3 * width] for i in range(0, len(raw), 1 + 3 * width)]
    return sum(row[j:j + 3] == target for row in rows for j in range(0, len(row), 3))


def test_png_decodes_and_holds_the_bucket_colours_and_marks(tmp_path: Path) -> None:
    write_plot(str(tmp_path / "deep" / "job.png"), timeline())
    png = (tmp_path / "deep" / "job.png").read_bytes()
    assert decode(png)[:2] == (1000, goodput_plot._shapes(timeline())[1])
    for colour in (COLOURS["productive"], COLOURS["wasted_progress"], UNKNOWN, goodput_plot.MARK):
        assert pixels(png, colour) > 0


def test_write_plot_writes_svg_by_its_suffix(tmp_path: Path) -> None:
    write_plot(str(tmp_path / "job.SVG"), timeline())
    assert ET.parse(tmp_path / "job.SVG").getroot().tag == f"{SVG}svg"


def test_write_plot_goes_through_the_storage_seam() -> None:
    pytest.importorskip("fsspec")
    from entrypoint.outputs import storage

    write_plot("memory://plots/job.svg", timeline())
    assert ET.fromstring(storage.path("memory://plots/job.svg").read_bytes()).tag == f"{SVG}svg"


@pytest.mark.parametrize("name", ["job.jpg", "job", "svg", "job.svg.txt"])
def test_a_suffix_other_than_svg_or_png_is_a_config_error(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=r"^--plot: .* names a \.svg or \.png file$"):
        write_plot(str(tmp_path / name), timeline())
    assert not (tmp_path / name).exists()


# ---- the PNG's text, and every text inside the picture ----------------------------------------------------------
def svg_texts(svg: str) -> list[dict]:
    """Every <text> of the SVG: its words, x, baseline, anchor, size, colour and weight."""
    return [{"text": t.text or "", "x": float(t.get("x", "")), "y": float(t.get("y", "")),
             "anchor": t.get("text-anchor"), "size": int(t.get("font-size", "")), "fill": t.get("fill", "#000000"),
             "bold": t.get("font-weight") == "bold"} for t in ET.fromstring(svg).iter(f"{SVG}text")]


def ink(png: bytes, rgb: str) -> set[tuple[int, int]]:
    """The (x, y) of every pixel of colour ``rgb``."""
    width, _height, raw = decode(png)
    target = bytes.fromhex(rgb.lstrip("#"))
    rows = [raw[i + 1:i + 1 + 3 * width] for i in range(0, len(raw), 1 + 3 * width)]
    return {(j // 3, y) for y, row in enumerate(rows) for j in range(0, len(row), 3) if row[j:j + 3] == target}


def drawn(png: bytes, text: dict) -> bool:
    """Whether the PNG shows ``text`` (an SVG text's words) where the SVG puts it: in the 5x7 glyphs at its size and
    colour, anchored alike, their bottom row on its baseline, and no other pixel of that colour in their box."""
    from entrypoint.outputs.goodput import bitmap_font

    scale = 2 if text["size"] >= 14 else 1
    dots = set(bitmap_font.pixels(text["text"], scale))
    if text["bold"]:
        dots |= {(x + 1, y) for x, y in dots}
    width = bitmap_font.width(text["text"], scale)
    left = text["x"] - {"start": 0, "middle": width / 2, "end": width}[text["anchor"]]
    top = int(text["y"]) - bitmap_font.HEIGHT * scale
    box = {(x, y) for x in range(width + 1) for y in range(bitmap_font.HEIGHT * scale)}
    found = ink(png, text["fill"])
    return bool(dots) and any(all((at + dx, top + dy) in found for dx, dy in dots) and
                              not any((at + dx, top + dy) in found for dx, dy in box - dots)
                              for at in (round(left) - 1, round(left), round(left) + 1))


def test_the_png_carries_every_label_the_svg_has() -> None:
    """Lanes, marks, times, legend names and the title: each SVG text is drawn in the PNG, in its colour, where the
    SVG places it (the glyphs' baseline on the text's, anchored the same way)."""
    shown = timeline()
    png, texts_ = render_png(shown), svg_texts(render_svg(shown))
    assert {t["text"] for t in texts_} >= {"attempt 1 · workerpool0[0] (chief)", "peer_lost: worker 1 killed",
                                           "10 min", "elapsed", "productive  180.0 s (30.0%)"}
    assert all(drawn(png, text) for text in texts_), [t["text"] for t in texts_ if not drawn(png, t)]


def test_every_text_stays_inside_the_picture() -> None:
    """An attempt that ends the job has its end's text left of its line; a label longer than its room is cut in
    its middle; nothing runs off either edge, in the SVG (at 0.6 of the font size a character, sans-serif's
    average) or in the PNG (found whole)."""
    long = timeline(label="workerpool1-0 (chief) from +12 s · " + "x" * 80)
    long["title"] = "job gs://a-bucket/" + "deep/" * 60 + "job: goodput 0.0%"
    long["lanes"][1]["marks"] = [{"t": T0 + 600, "text": "killed (no end recorded: SIGKILL, or its machine was lost)"}]
    long["lanes"][0]["marks"] = [{"t": T0 + 230, "text": "ended by the signal of workerpool1-0 (exit 137) " * 3}]
    svg, png = render_svg(long), render_png(long)
    width = goodput_plot.WIDTH
    for text in svg_texts(svg):
        w = max(0.6 * text["size"] * len(text["text"]),
                goodput_plot.bitmap_font.width(text["text"], 2 if text["size"] >= 14 else 1))
        left = text["x"] - {"start": 0, "middle": w / 2, "end": w}[text["anchor"]]
        assert left >= 0 and left + w <= width, text
        assert drawn(png, text), text
    end_mark = next(t for t in svg_texts(svg) if t["text"].startswith("killed"))
    assert end_mark["anchor"] == "end" and end_mark["text"].endswith("was lost)")  # whole, left of its line
    assert any(t["text"].startswith("job gs://a-bucket/deep/") and "..." in t["text"] for t in svg_texts(svg))


def test_a_plot_that_cannot_be_written_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for where in (tmp_path / "file" / "job.svg", Path("/proc/job.png")):
        with pytest.raises(ConfigError, match=rf"^--plot: {where} cannot be written \("):
            write_plot(str(where), timeline())
