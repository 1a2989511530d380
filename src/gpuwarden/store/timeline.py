"""An incident's timeline picture as SVG text, written directly (no plotting library: matplotlib and what it
pulls in were 169 MB of the 209 MB installed, for this one picture).

Pure: an incident bundle in (report.bundle's dict), the SVG document out. The panels share the time axis and
plot the signal that broke: for an engine's trouble (a stall, no answer) the engine's own tokens per second and
requests running and waiting, from its scrapes; for a GPU's, its power, hottest sensor and shader clock (the
faulted GPU's, where the recorder has it; every GPU's otherwise). Unreadable samples are crosses on the axis;
each event is a vertical line across all panels (red: the trigger, orange: other events, green dashed: what
gpuwarden did; solid when critical), labelled with its kinds. The axis runs to the incident's end: the last
event (the kill, the restart, "back") or its close, whichever is later.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WIDTH, HEIGHT = 1100, 800
LEFT, RIGHT, TOP, BOTTOM, GAP = 80, 20, 70, 40, 14  # margins of the panel area, and between panels
GPU_COLOURS = ("#1f77b4", "#9467bd", "#8c564b", "#7f7f7f", "#bcbd22", "#17becf", "#e377c2", "#000000")
RED, ORANGE, GREEN, GRID = "#d62728", "#ff7f0e", "#2ca02c", "#e6e6e6"
PANELS = (("power_watts", "power (W)", 1.0), ("temperature_celsius", "hottest sensor (°C)", 1.0),
          ("sclk_hz", "shader clock (MHz)", 1e-6))
ENGINE_PANELS = (("tokens_per_second", "tokens generated per second", 1.0),
                 ("running", "requests running", 1.0), ("waiting", "requests waiting", 1.0))
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def png(picture: Path, timeout: float = 10.0) -> Path | None:
    """The picture as PNG beside it (timeline.png), for a channel that shows images but no SVG (ntfy on a
    phone): drawn once, by rsvg-convert (librsvg2-bin), bounded by `timeout`. None where rsvg-convert is not
    installed or fails (said in the log): the message then goes without a picture."""
    out = picture.with_suffix(".png")
    try:
        if out.stat().st_mtime_ns >= picture.stat().st_mtime_ns:  # drawn from this picture already
            return out
    except FileNotFoundError:
        pass
    import shutil  # here: only a picture for ntfy needs it, and `run` starts without it

    tool = shutil.which("rsvg-convert")
    if tool is None:
        log.warning("no PNG of %s for the targets that show no SVG: rsvg-convert is not installed "
                    "(apt install librsvg2-bin)", picture)
        return None
    partial = out.with_name(f".{out.name}.{os.getpid()}")
    try:
        subprocess.run([tool, "--format=png", f"--output={partial}", str(picture)], check=True, timeout=timeout,
                       capture_output=True, stdin=subprocess.DEVNULL)
        os.replace(partial, out)  # whole, or not there: a reader never sends half a PNG
        return out
    except (OSError, subprocess.SubprocessError) as exc:
        said = exc.stderr.decode(errors="replace").strip() if isinstance(exc, subprocess.CalledProcessError) else ""
        log.warning("no PNG of %s: rsvg-convert failed: %s", picture, said or exc)
        partial.unlink(missing_ok=True)
        return None


def svg(content: dict[str, Any]) -> str:
    trigger = content["trigger"]
    telemetry, panels, nothing = _signal(content)
    marks = _marks(content)
    times = [p["time"] for _, points in telemetry for p in points] + [second for (second, _), _, _ in marks]
    closed = (content.get("incident") or {}).get("closed")
    start = min([*times, trigger["time"] - 60])
    end = max([*times, trigger["time"] + 30, *([closed] if closed else [])])  # never a zero-width axis
    height = (HEIGHT - TOP - BOTTOM - GAP * (len(panels) - 1)) / len(panels)
    x = _scale(start, end, LEFT, WIDTH - RIGHT)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>']
    when = datetime.fromtimestamp(trigger["time"]).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    subject = trigger["gpu"] or trigger["engine"] or content["host"]
    out.append(_text(WIDTH / 2, 24, f"{trigger['kind']} on {subject} at {when} ({content['host']})", size=14,
                     anchor="middle"))
    zone = datetime.fromtimestamp(trigger["time"]).astimezone().strftime("%Z")
    out.append(_text(WIDTH / 2, 44, f"red: the event; orange: other events; green: what gpuwarden did; times {zone}",
                     size=12, anchor="middle"))
    for i, (key, label, factor) in enumerate(panels):
        top = TOP + i * (height + GAP)
        out += _panel(telemetry, key, label, factor, x, top, height, last=i == len(panels) - 1, start=start, end=end)
    bottom = TOP + len(panels) * height + GAP * (len(panels) - 1)
    placed: list[tuple[float, float]] = []  # (x, lowest y) of the labels so far
    for (second, colour), kinds, critical in marks:
        dash = ' stroke-dasharray="6,4"' if colour == GREEN else "" if critical else ' stroke-dasharray="2,3"'
        width = 2 if colour == RED else 1
        at = round(x(second)) + width % 2 / 2  # on whole pixels: crisp, not smeared over two columns
        out.append(f'<line x1="{at:.1f}" y1="{TOP}" x2="{at:.1f}" y2="{bottom:.1f}" stroke="{colour}" '
                   f'stroke-width="{width}"{dash}/>')
        # read bottom to top, hanging from the top: the trigger's label right of its line, the others left;
        # a label that would cross a near one starts below it
        base, label = (at + 12 if colour == RED else at - 3), ", ".join(kinds)
        start = max([TOP + 4.0, *(low + 8 for other, low in placed if abs(other - base) < 12)])
        placed.append((base, start + 6 * len(label)))
        out.append(f'<text x="{base:.1f}" y="{start:.1f}" fill="{colour}" font-size="10" text-anchor="end" '
                   f'transform="rotate(-90 {base:.1f} {start:.1f})">{escape(label)}</text>')
    if not any(points for _, points in telemetry):
        middle = TOP + height + GAP + height / 2
        out.append(_text((LEFT + WIDTH - RIGHT) / 2, middle, nothing, colour="#808080", anchor="middle"))
    out += _legend(telemetry)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _signal(content: dict[str, Any]) -> tuple[list, tuple, str]:
    """What to plot: the series, its panels, and what to say when it holds nothing."""
    trigger = content["trigger"]
    engine, history = trigger.get("engine"), content.get("engine_history") or {}
    if engine and trigger["kind"].startswith("engine_") and history.get(engine):
        return [(engine, _rates(history[engine]))], ENGINE_PANELS, "no scrape of the engine recorded"
    telemetry = sorted(content["telemetry"].items())
    faulted = [(gpu, points) for gpu, points in telemetry if gpu == trigger.get("gpu")]
    return faulted or telemetry, PANELS, "no GPU telemetry recorded"


def _rates(points: list[dict]) -> list[dict]:
    """An engine's scrapes with its tokens per second between each and the one before (a counter that went
    down is a new instance: no rate across it)."""
    out, before = [], None
    for p in points:
        rate = None
        counter = p.get("generated") if p.get("generated") is not None else p.get("progress")
        if before is not None and counter is not None and p["time"] > before[0] and counter >= before[1]:
            rate = (counter - before[1]) / (p["time"] - before[0])
        out.append({**p, "tokens_per_second": rate})
        before = (p["time"], counter) if counter is not None else None
    return out


def _marks(content: dict[str, Any]) -> list[tuple[tuple[int, str], list[str], bool]]:
    """Events of one second share one line and one label: ((second, colour), kinds, any critical)."""
    grouped: dict[tuple[int, str], list[dict]] = {}
    for e in content["events"]:
        colour = RED if e["id"] == content["trigger"]["id"] else ORANGE
        grouped.setdefault((int(e["time"]), colour), []).append(e)
    for a in content["actions"]:
        grouped.setdefault((int(a["time"]), GREEN), []).append(a)
    return [(key, list(dict.fromkeys(e["kind"] for e in events)), any(e["severity"] == "critical" for e in events))
            for key, events in sorted(grouped.items())]


def _panel(telemetry, key: str, label: str, factor: float, x, top: float, height: float, last: bool,
           start: float, end: float) -> list[str]:
    values = [p[key] * factor for _, points in telemetry for p in points if p.get(key) is not None]
    ticks = _ticks(max(values, default=1.0) or 1.0)
    y = _scale(0.0, ticks[-1], top + height, top)
    out = [f'<rect x="{LEFT}" y="{top:.1f}" width="{WIDTH - LEFT - RIGHT}" height="{height:.1f}" fill="none" '
           f'stroke="#000000" stroke-width="0.8"/>']
    for tick in ticks:
        out.append(f'<line x1="{LEFT}" y1="{y(tick):.1f}" x2="{WIDTH - RIGHT}" y2="{y(tick):.1f}" stroke="{GRID}"/>')
        out.append(_text(LEFT - 6, y(tick) + 4, f"{tick:g}", anchor="end"))
    middle = top + height / 2
    out.append(f'<text x="16" y="{middle:.1f}" text-anchor="middle" transform="rotate(-90 16 {middle:.1f})">'
               f"{escape(label)}</text>")
    for second in _time_ticks(start, end):
        out.append(f'<line x1="{x(second):.1f}" y1="{top:.1f}" x2="{x(second):.1f}" y2="{top + height:.1f}" '
                   f'stroke="{GRID}"/>')
        if last:
            out.append(_text(x(second), top + height + 16, datetime.fromtimestamp(second).strftime("%H:%M:%S"),
                             anchor="middle"))
    for (_gpu, points), colour in zip(telemetry, GPU_COLOURS * 2, strict=False):
        for run in _runs(points, key):
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.4" points="'
                       + " ".join(f"{x(p['time']):.1f},{y(p[key] * factor):.1f}" for p in run) + '"/>')
        for p in points:
            if p["state"] != "ok":  # readings that failed: the GPU was busy resetting, or gone
                at, base = x(p["time"]), y(0.0)
                out.append(f'<path d="M{at - 3:.1f},{base - 3:.1f}l6,6m0,-6l-6,6" stroke="{colour}"/>')
    return out


def _legend(telemetry) -> list[str]:
    entries = sum(1 + any(p["state"] != "ok" for p in points) for _, points in telemetry)
    out, row = [f'<rect x="{LEFT + 4}" y="{TOP + 4}" width="210" height="{entries * 15 + 6}" fill="#ffffff" '
                'fill-opacity="0.85" stroke="#cccccc"/>'] if entries else [], 0
    for (gpu, points), colour in zip(telemetry, GPU_COLOURS * 2, strict=False):
        entries = [(gpu, "")] + ([(f"{gpu} unreadable", "x")] if any(p["state"] != "ok" for p in points) else [])
        for name, marker in entries:
            top = TOP + 8 + row * 15
            if marker:
                out.append(f'<path d="M{LEFT + 15:.1f},{top}l6,6m0,-6l-6,6" stroke="{colour}"/>')
            else:
                out.append(f'<line x1="{LEFT + 8}" y1="{top + 3}" x2="{LEFT + 28}" y2="{top + 3}" stroke="{colour}" '
                           'stroke-width="1.4"/>')
            out.append(_text(LEFT + 34, top + 7, name, size=10))
            row += 1
    return out


def _runs(points: list[dict], key: str) -> list[list[dict]]:
    """The stretches of readable values: a missing reading breaks the line instead of bridging it."""
    runs: list[list[dict]] = [[]]
    for p in points:
        if p.get(key) is None:
            runs.append([])
        else:
            runs[-1].append(p)
    return [run for run in runs if run]


def _scale(lo: float, hi: float, out_lo: float, out_hi: float):
    span = (hi - lo) or 1.0
    return lambda v: out_lo + (v - lo) / span * (out_hi - out_lo)


def _ticks(top: float) -> list[float]:
    """0 up to a round value at or above `top`, in 3 to 7 round steps."""
    raw = top / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [round(i * step, 10) for i in range(math.ceil(top / step - 1e-9) + 1)]


def _time_ticks(start: float, end: float) -> list[int]:
    step = next((s for s in _TIME_STEPS if (end - start) / s <= 10), _TIME_STEPS[-1])
    first = math.ceil(start / step) * step
    return list(range(int(first), int(end) + 1, step))


def _text(x: float, y: float, text: str, size: int = 11, colour: str = "#000000", anchor: str = "start") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{colour}" text-anchor="{anchor}">'
            f"{escape(text)}</text>")


def escape(text: str) -> str:
    """Text for SVG: xml.sax.saxutils' escape without its import (urllib.request, http.client, email: 4 MB that
    the daemon would carry for three replacements)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
