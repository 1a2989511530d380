"""The timeline picture as PNG for ntfy (store/timeline.png): made once by the real rsvg-convert, and none, said in
the log, where rsvg-convert is not installed (the message then goes without a picture)."""

from __future__ import annotations

import logging

from gpuwarden.store import timeline


def picture(tmp_path):
    path = tmp_path / "timeline.svg"
    path.write_text(f'<svg xmlns="http://www.w3.org/2000/svg" width="{timeline.WIDTH}" height="{timeline.HEIGHT}">'
                    '<rect width="100%" height="100%" fill="#ffffff"/><text x="80" y="40">tokens per second</text>'
                    '</svg>')
    return path


def test_the_png_is_made_once_from_the_svg(tmp_path):
    svg = picture(tmp_path)
    png = timeline.png(svg)
    assert png == tmp_path / "timeline.png" and png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    made = png.stat().st_mtime_ns
    assert timeline.png(svg) == png and png.stat().st_mtime_ns == made  # drawn from this picture already
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial file left


def test_without_rsvg_convert_there_is_no_png_and_the_log_says_why(tmp_path, monkeypatch, caplog):
    svg = picture(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with caplog.at_level(logging.WARNING):
        assert timeline.png(svg) is None
    assert "rsvg-convert is not installed" in caplog.text and not (tmp_path / "timeline.png").exists()
