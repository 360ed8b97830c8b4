"""``goodput --plot``: the timeline as SVG (parsed back) and as PNG (decoded back with the stdlib)."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

from entrypoint.errors import ConfigError
from entrypoint.outputs import goodput_plot
from entrypoint.outputs.goodput_plot import COLOURS, UNKNOWN, render_png, render_svg, write_plot

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
