"""Read one amdgpu GPU from sysfs and hwmon (platform-facts §1). Synchronous and possibly blocking: the
caller runs it off the event loop with a deadline.

A missing file means "not supported" (amdgpu creates only what the ASIC supports). EBUSY, EPERM and EAGAIN
mean "not readable now" (reset, suspend, runtime-suspended); EREMOTEIO, ETIME and ENODEV mean "gone".
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

from gpuwarden.model import GpuSample

BUSY = {errno.EBUSY, errno.EPERM, errno.EAGAIN}
GONE = {errno.EREMOTEIO, errno.ETIME, errno.ENODEV, errno.EIO}
_LEVEL = re.compile(r"^\s*\d+:\s*(\d+(?:\.\d+)?)\s*mhz\s*(\*)?\s*$", re.I)
_OD_VALUE = re.compile(r"^\s*(?:(\d+):\s*)?(-?\d+(?:\.\d+)?)\s*(?:mhz|mv)\b", re.I)
_SPEED = re.compile(r"^(\d+(?:\.\d+)?)\s*GT/s")


class _Reader:
    """File reads that record why a file could not be read."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.problems: dict[str, str] = {}

    def text(self, path: Path) -> str | None:
        try:
            with open(path, "rb", buffering=0) as f:
                return f.read(65536).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return None  # not supported on this ASIC
        except OSError as exc:
            name = str(path.relative_to(self.base)) if path.is_relative_to(self.base) else str(path)
            self.problems[name] = "gone" if exc.errno in GONE else "busy" if exc.errno in BUSY else \
                f"error {errno.errorcode.get(exc.errno, exc.errno)}"
            return None

    def number(self, path: Path, scale: float = 1.0) -> float | None:
        raw = self.text(path)
        try:
            return float(raw) * scale if raw is not None else None
        except ValueError:
            self.problems[path.name] = "unparsable"
            return None


def hwmon_dir(device: Path) -> Path | None:
    for hwmon in sorted(device.glob("hwmon/hwmon*")):
        if (hwmon / "name").is_file() and (hwmon / "name").read_text().strip() == "amdgpu":
            return hwmon
    return None


def read(device: Path, pci: str, now: float, model: str | None = None) -> GpuSample:
    r = _Reader(device)
    hw = hwmon_dir(device)
    values: dict = {}
    if hw is not None:
        values["temperatures"] = _labelled(r, hw, "temp", 0.001)
        average, instant = r.number(hw / "power1_average", 1e-6), r.number(hw / "power1_input", 1e-6)
        if average is not None:
            values.update(power_watts=average, power_source="power1_average", power_instant_watts=instant)
        elif instant is not None:
            values.update(power_watts=instant, power_source="power1_input", power_instant_watts=instant)
        values["power_cap_watts"] = r.number(hw / "power1_cap", 1e-6)
        values["power_cap_max_watts"] = r.number(hw / "power1_cap_max", 1e-6)
        values["fan_rpm"] = r.number(hw / "fan1_input")
        pwm = r.number(hw / "pwm1")
        values["fan_pwm_ratio"] = pwm / 255 if pwm is not None else None
        clocks = _labelled(r, hw, "freq", 1.0)
        values["sclk_hz"], values["mclk_hz"] = clocks.get("sclk"), clocks.get("mclk")
        volts = _labelled(r, hw, "in", 1.0)
        values["voltage_mv"] = volts.get("vddgfx", next(iter(volts.values()), None))
    current, highest = _dpm(r, device / "pp_dpm_sclk")
    values["sclk_hz"] = values.get("sclk_hz") or current
    values["sclk_max_hz"] = highest
    if values.get("mclk_hz") is None:
        values["mclk_hz"] = _dpm(r, device / "pp_dpm_mclk")[0]
    busy = r.number(device / "gpu_busy_percent")
    values["busy_ratio"] = busy / 100 if busy is not None else None
    values["vram_total_bytes"] = r.number(device / "mem_info_vram_total")
    values["vram_used_bytes"] = r.number(device / "mem_info_vram_used")
    values["vram_visible_total_bytes"] = r.number(device / "mem_info_vis_vram_total")
    values["pcie_speed_gts"] = _speed(r.text(device / "current_link_speed"))
    values["pcie_max_speed_gts"] = _speed(r.text(device / "max_link_speed"))
    values["pcie_width"] = _int(r.text(device / "current_link_width"))
    values["pcie_max_width"] = _int(r.text(device / "max_link_width"))
    values["perf_level"] = r.text(device / "power_dpm_force_performance_level")
    od = r.text(device / "pp_od_clk_voltage")
    values["overdrive"] = parse_overdrive(od) if od else {}
    problems = r.problems
    state = "gone" if "gone" in problems.values() else "not_readable" if "busy" in problems.values() else "ok"
    return GpuSample(gpu=pci, vendor="amd", model=model or r.text(device / "product_name"), time=now, state=state,
                     problems=problems, **{k: v for k, v in values.items() if v is not None})


def _labelled(r: _Reader, hw: Path, prefix: str, scale: float) -> dict[str, float]:
    """`temp2_input` with `temp2_label` = junction -> {"junction": value * scale}."""
    out = {}
    for path in sorted(hw.glob(f"{prefix}*_input")):
        index = path.name[len(prefix):-len("_input")]
        label = r.text(hw / f"{prefix}{index}_label") or f"{prefix}{index}"
        value = r.number(path, scale)
        if value is not None:
            out[label] = value
    return out


def _dpm(r: _Reader, path: Path) -> tuple[float | None, float | None]:
    """(current, highest) level of a pp_dpm_* file, in Hz."""
    text = r.text(path)
    if not text:
        return None, None
    levels = [(float(m.group(1)) * 1e6, bool(m.group(2))) for line in text.splitlines() if (m := _LEVEL.match(line))]
    if not levels:
        return None, None  # e.g. "unavailable" after a RAS interrupt
    return next((mhz for mhz, star in levels if star), None), max(mhz for mhz, _ in levels)


def parse_overdrive(text: str) -> dict[str, dict[str, float]]:
    """pp_od_clk_voltage by section: {"OD_SCLK": {"0": 500, "1": 2800}, "OD_SCLK_OFFSET": {"": 0}, ...}.

    Handles the indexed and the un-indexed (RDNA4, 2025) OD_SCLK_OFFSET layouts; OD_RANGE is skipped.
    """
    sections: dict[str, dict[str, float]] = {}
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":") and stripped[:-1].replace("_", "").isalnum():
            current = stripped[:-1]
            if current != "OD_RANGE":
                sections[current] = {}
            continue
        if current in (None, "OD_RANGE"):
            continue
        if m := _OD_VALUE.match(stripped):
            sections[current][m.group(1) or ""] = float(m.group(2))
    return sections


def _speed(text: str | None) -> float | None:
    m = _SPEED.match(text or "")
    return float(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None
