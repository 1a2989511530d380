"""Incident bundles and their picture: the JSON is complete and valid, the SVG is a real, non-trivial chart as a
real renderer draws it."""

import json
import shutil
import subprocess
import time
from pathlib import Path
from xml.etree import ElementTree

import pytest
from PIL import Image

from gpuwarden.core.model import Event, GpuSample, Severity
from gpuwarden.store import bundles as report
from gpuwarden.store import timeline

T0 = time.mktime((2026, 12, 2, 16, 22, 28, 0, 0, -1))
GPUS = ("0000:03:00.0", "0000:06:00.0")


def row(event_id, kind, severity, at, gpu=None, engine=None, message=""):
    return {"id": event_id, "time": at, "kind": kind, "severity": severity, "gpu": gpu, "engine": engine,
            "message": message or kind, "evidence": {}, "count": 1}


def samples(gpu, dies):
    """Two minutes of a GPU at 1 s: under load at 272 W, 54 °C; one of them drops off the bus at T0."""
    out = []
    for i in range(120):
        at = T0 - 90 + i
        gone = dies and at >= T0
        out.append(GpuSample(gpu, "amd", "Radeon RX 7900 XTX", at, state="gone" if gone else "ok",
                             power_watts=None if gone else 260 + (i % 7) * 2,
                             temperatures={} if gone else {"edge": 54.0, "junction": 67.0 + i % 3},
                             sclk_hz=None if gone else 2.4e9 + (i % 5) * 1e7, busy_ratio=0.97))
    return out


def incident():
    trigger = row(7, "device_lost", "critical", T0, gpu=GPUS[0], message="device lost from bus")
    events = [row(5, "sq_intr", "warning", T0 - 40, gpu=GPUS[0]), trigger,
              row(8, "reset_failed", "critical", T0 + 1, gpu=GPUS[0]),
              row(9, "engine_killed", "warning", T0 + 2, engine="vllm", message="killed vllm: 3 processes")]
    lines = [(T0 - 40, "amdgpu 0000:03:00.0: amdgpu: sq_intr: error, se 0, data 0x0"),
             (T0, "amdgpu 0000:03:00.0: amdgpu: device lost from bus!")]
    telemetry = {gpu: samples(gpu, gpu == GPUS[0]) for gpu in GPUS}
    engines = {"vllm": {"profile": "vllm", "running": 2.0, "generated": 10234.0}}
    return report.bundle(trigger, events, lines, telemetry, engines, "box1")


def test_the_bundle_holds_event_lines_telemetry_engines_and_actions():
    content = json.loads(json.dumps(incident()))  # what incident.json holds is plain JSON
    assert content["trigger"]["kind"] == "device_lost" and content["host"] == "box1"
    assert [e["kind"] for e in content["events"]] == ["sq_intr", "device_lost", "reset_failed"]
    assert [a["kind"] for a in content["actions"]] == ["engine_killed"]
    assert content["kernel_lines"][1]["line"].endswith("device lost from bus!")
    points = content["telemetry"][GPUS[0]]
    assert len(points) == 120 and points[0]["power_watts"] == 260 and points[0]["temperature_celsius"] == 67.0
    assert points[-1]["state"] == "gone" and points[-1]["power_watts"] is None
    assert content["engines"]["vllm"]["running"] == 2.0


def rasterised(svg_path, tmp_path) -> Image.Image:
    """The picture as a real SVG renderer draws it (librsvg, as a browser or a mail client would)."""
    rsvg = shutil.which("rsvg-convert")
    if not rsvg:
        pytest.fail("rsvg-convert is not installed (make test-deps installs Debian's librsvg2-bin)")
    png = tmp_path / "timeline.png"
    subprocess.run([rsvg, str(svg_path), "-o", str(png)], check=True, capture_output=True, timeout=60)
    return Image.open(png)


def test_the_timeline_picture_is_a_real_chart(tmp_path):
    folder = tmp_path / "incident"
    folder.mkdir()
    assert report.draw(folder, incident())
    out = folder / report.PICTURE
    root = ElementTree.parse(out).getroot()  # well-formed SVG
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and (root.get("width"), root.get("height")) == ("1100", "800")
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "device_lost on 0000:03:00.0" in texts and "(box1)" in texts
    assert all(kind in texts for kind in ("sq_intr", "reset_failed", "engine_killed", "hottest sensor"))
    assert "0000:03:00.0 unreadable" in texts
    assert "0000:06:00.0" not in texts  # a GPU's fault: that GPU's readings, not the box's
    image = rasterised(out, tmp_path)
    assert image.size == (1100, 800)
    rgb = image.convert("RGB")
    colours = rgb.getcolors(maxcolors=1 << 20)
    assert len(colours) > 200  # lines, text, anti-aliasing: not a blank or flat image
    background = max(colours)[1]
    assert background == (255, 255, 255) and max(colours)[0] < 0.95 * 1100 * 800
    red = sum(n for n, (r, g, b) in colours if r > 180 and g < 80 and b < 80)  # the trigger's line
    assert red > 500


def test_an_engine_stall_plots_the_engines_tokens_and_requests_to_its_end(tmp_path):
    """A stall: the engine's own signal (tokens per second, requests), not the GPU's, and the axis runs past the
    kill and the restart to "back" and the incident's close."""
    content = incident()
    stall = row(7, "engine_stall", "critical", T0, engine="vllm")
    content["trigger"] = stall
    content["events"] = [stall]
    content["actions"] = [row(9, "engine_killed", "critical", T0 + 2, engine="vllm"),
                          row(10, "engine_restarting", "warning", T0 + 3, engine="vllm"),
                          row(11, "engine_back", "info", T0 + 200, engine="vllm")]
    content["incident"] = {"closed": T0 + 260}
    tokens = [2000.0 * i for i in range(60)] + [118_000.0] * 61 + [0.0] * 70 + [1500.0 * i for i in range(40)]
    content["engine_history"] = {"vllm": [
        {"time": T0 - 120 + i * 2, "state": "ok", "running": 0.0 if 120 <= i < 190 else 4.0, "waiting": 1.0,
         "generated": t, "progress": t} for i, t in enumerate(tokens)]}
    out = tmp_path / "timeline.svg"
    out.write_text(timeline.svg(content))
    root = ElementTree.parse(out).getroot()
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert {"tokens generated per second", "requests running", "requests waiting"} <= set(texts)
    assert not {"power (W)", "hottest sensor (°C)"} & set(texts)  # not the GPU's readings
    assert all(k in " ".join(texts) for k in ("engine_killed", "engine_restarting", "engine_back"))
    line = [float(p.split(",")[1]) for p in next(root.iter("{http://www.w3.org/2000/svg}polyline")).get(
        "points").split()]
    assert max(line) - min(line) > 100  # the tokens per second fall to nothing in the stall: drawn, not flat
    ticks = [t for t in texts if t.count(":") == 2 and len(t) == 8]  # the time axis
    assert ticks[-1] >= time.strftime("%H:%M:%S", time.localtime(T0 + 240))  # to the incident's end
    assert rasterised(out, tmp_path).size == (1100, 800)


def test_a_picture_of_odd_names_and_no_telemetry_is_still_valid_svg(tmp_path):
    content = incident()
    content["host"], content["telemetry"] = 'box <&> "1"', {}
    content["trigger"]["gpu"] = None
    content["trigger"]["engine"] = "vllm</text><script>"
    out = tmp_path / "timeline.svg"
    out.write_text(timeline.svg(content))
    texts = [t.text for t in ElementTree.parse(out).getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert any("vllm</text><script> at" in (t or "") for t in texts) and "no GPU telemetry recorded" in texts
    assert rasterised(out, tmp_path).size == (1100, 800)


def test_listing_and_a_failed_render(tmp_path):
    folder = tmp_path / "incidents" / "20261202-162228-device_lost"
    folder.mkdir(parents=True)
    (folder / report.BUNDLE).write_text(json.dumps(incident()))
    (folder / report.FAILED).write_text("boom")
    (tmp_path / "incidents" / "broken").mkdir()
    rows = report.listing(tmp_path / "incidents")
    assert [r["kind"] for r in rows] == ["device_lost", "?"]
    assert rows[0]["picture"] is None and rows[0]["events"] == 3 and rows[0]["subject"] == GPUS[0]
    assert report.picture(folder) is False


def test_folder_names_are_time_and_kind():
    event = Event("device_lost", Severity.CRITICAL, "x", T0, gpu=GPUS[0])
    assert report.folder_name(event) == "20261202-162228-device_lost"


def test_only_the_newest_bundles_are_kept_and_nothing_else_is_touched(tmp_path):
    """[daemon] incidents_keep: writing a new bundle deletes the oldest real bundle folders beyond it; a link
    named like a bundle, a file, another folder, and what a link inside a bundle points to all stay."""
    incidents, outside = tmp_path / "incidents", tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    names = [f"2026120{day}-162228-device_lost" for day in range(1, 6)] + ["20261201-162228-device_lost-2"]
    for name in names:
        (incidents / name).mkdir(parents=True)
        (incidents / name / report.BUNDLE).write_text("{}")
    (incidents / "20261201-162228-device_lost" / "link").symlink_to(outside)  # inside the oldest one
    (incidents / "20261130-000000-device_lost").symlink_to(outside, target_is_directory=True)  # oldest name
    (incidents / "20261129-000000-device_lost").write_text("a file")
    (incidents / "notes").mkdir()
    newest = incidents / report.folder_name(Event("device_lost", Severity.CRITICAL, "x", T0 + 86400 * 5))

    report.write(newest, incident(), keep=3)

    assert sorted(p.name for p in incidents.iterdir()) == [
        "20261129-000000-device_lost", "20261130-000000-device_lost", "20261204-162228-device_lost",
        "20261205-162228-device_lost", newest.name, "notes"]
    assert (outside / "precious").read_text() == "keep me" and newest.name == "20261207-162228-device_lost"
    report.write(newest, incident(), keep=1)  # written again (the window's end): no new folder
    assert (incidents / "20261204-162228-device_lost").is_dir()


def test_the_bundle_being_written_is_never_deleted_even_when_older(tmp_path):
    """Bundles of an older gpuwarden (no order.json) come before any written now, by name among themselves."""
    incidents = tmp_path / "incidents"
    for name in ("20261203-000000-device_lost", "20261204-000000-device_lost"):
        (incidents / name).mkdir(parents=True)
    spare = incidents / "20261201-000000-gpu_reset"
    report.write(spare, incident(), keep=2)
    assert sorted(p.name for p in incidents.iterdir()) == [spare.name, "20261204-000000-device_lost"]
    report.prune(incidents, 1, spare)
    assert [p.name for p in incidents.iterdir()] == [spare.name]


def test_bundles_are_pruned_in_the_order_they_were_written_whatever_the_wall_clock_said(tmp_path):
    """Issue 36: the wall clock stepped back a day (the host's clock cannot be stepped in a test on a shared
    machine: the events' times are what a stepped clock gives, and they name the folders). Each new bundle,
    named a day before the ones already there, deleted the one written just before it; the newest kept are
    the last written, and the listing shows them in that order."""
    incidents = tmp_path / "incidents"
    before = [Event("device_lost", Severity.CRITICAL, "x", T0 + 60 * i, gpu=GPUS[0]) for i in range(3)]
    after = [Event("gpu_reset", Severity.CRITICAL, "x", T0 - 86400 + 60 * i, gpu=GPUS[0]) for i in range(3)]
    for event in before + after:
        report.write(incidents / report.folder_name(event), incident(), keep=3)
    written = [report.folder_name(e) for e in after]
    assert sorted(p.name for p in incidents.iterdir()) == written
    assert [Path(r["folder"]).name for r in report.listing(incidents)] == written
    orders = [json.loads((incidents / name / report.ORDER).read_text()) for name in written]
    assert [o["sequence"] for o in orders] == [4, 5, 6] and all(o["written"] > T0 for o in orders)
