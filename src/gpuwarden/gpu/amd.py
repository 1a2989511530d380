"""Read one amdgpu GPU from sysfs and hwmon (amdgpu registers hwmon on the PCI device, so everything is found
from the PCI address, never a card or hwmon index). Synchronous and possibly blocking: the
caller runs it off the event loop with a deadline.

A missing file means "not supported" (amdgpu creates only what the ASIC supports). EBUSY, EPERM and EAGAIN
mean "not readable now" (reset, suspend, runtime-suspended); EREMOTEIO, ETIME and ENODEV mean "gone".
"""

from __future__ import annotations

import errno
import os
import re
import weakref
from collections.abc import Callable
from pathlib import Path

from gpuwarden.core.model import GpuSample
from gpuwarden.gpu.pci import link_speed, link_width

BUSY = {errno.EBUSY, errno.EPERM, errno.EAGAIN}
GONE = {errno.EREMOTEIO, errno.ETIME, errno.ENODEV, errno.EIO}
_LEVEL = re.compile(r"^\s*\d+:\s*(\d+(?:\.\d+)?)\s*mhz\s*(\*)?\s*$", re.I)
_OD_VALUE = re.compile(r"^\s*(?:(\d+):\s*)?(-?\d+(?:\.\d+)?)\s*(?:mhz|mv)\b", re.I)


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def _state(exc: OSError) -> str:
    if exc.errno in GONE:
        return "gone"
    return "busy" if exc.errno in BUSY else f"error {errno.errorcode.get(exc.errno, exc.errno)}"


def _number(raw: str | None, scale: float = 1.0) -> float | None:
    try:
        return float(raw) * scale if raw is not None else None
    except ValueError:
        return None


def hwmon_dir(device: Path) -> Path | None:
    for hwmon in sorted(device.glob("hwmon/hwmon*")):
        if (hwmon / "name").is_file() and (hwmon / "name").read_text().strip() == "amdgpu":
            return hwmon
    return None


# sample field <- (file in the hwmon directory or, with a leading "/", in the device directory, scale)
_NUMBERS = {
    "power1_average": ("power1_average", 1e-6), "power1_input": ("power1_input", 1e-6),
    "power_cap_watts": ("power1_cap", 1e-6), "power_cap_max_watts": ("power1_cap_max", 1e-6),
    "fan_rpm": ("fan1_input", 1.0), "pwm": ("pwm1", 1.0),
    "busy": ("/gpu_busy_percent", 1.0), "vram_total_bytes": ("/mem_info_vram_total", 1.0),
    "vram_used_bytes": ("/mem_info_vram_used", 1.0), "vram_visible_total_bytes": ("/mem_info_vis_vram_total", 1.0),
}
_TEXTS = {"current_link_speed", "max_link_speed", "current_link_width", "max_link_width",
          "power_dpm_force_performance_level", "pp_od_clk_voltage", "pp_dpm_sclk", "pp_dpm_mclk"}
# Settings rather than readings: read every SLOW_EVERY-th round, the last values kept in between.
_SLOW = {"power_cap_watts", "power_cap_max_watts", "vram_total_bytes", "vram_visible_total_bytes",
         "max_link_speed", "max_link_width", "power_dpm_force_performance_level", "pp_od_clk_voltage"}
SLOW_EVERY = 10


class AmdReader:
    """Reads one GPU. The files it has are found once (amdgpu creates only what the ASIC supports) and looked
    for again every `replan_seconds`, or when one vanished. Each file stays open and a round reads it again at
    offset 0 (kernfs then regenerates it): one pread per file instead of open, read and close. A descriptor of a
    removed node answers ENODEV: that is "gone", and the next round plans afresh."""

    def __init__(self, device: Path, pci: str, replan_seconds: float = 60.0) -> None:
        self.device, self.pci, self.replan_seconds = device, pci, replan_seconds
        self._planned_at: float | None = None
        self._fds: dict[str, int] = {}
        weakref.finalize(self, _close_all, self._fds)

    def _read(self, path: str, problems: dict[str, str]) -> str | None:
        fd = self._fds.get(path)
        try:
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(fd, 65536, 0).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return None  # not supported on this ASIC (or the GPU went away: the next plan will say)
        except OSError as exc:
            problems[os.path.basename(path)] = _state(exc)
            if exc.errno in GONE:
                self._planned_at = None
            return None

    def _plan(self, now: float) -> None:
        """What a round reads: the files this GPU has, from one listing of its device folder and one of its hwmon
        folder (an exists() of each file name and a glob of each sensor family were 1 ms a GPU, every minute)."""
        _close_all(self._fds)
        hw = hwmon_dir(self.device)
        hw_files, device_files = _listing(hw) if hw else set(), _listing(self.device)
        self.numbers = {}
        for field, (name, scale) in _NUMBERS.items():
            if name.startswith("/"):
                if name[1:] in device_files:
                    self.numbers[field] = (f"{self.device}{name}", scale)
            elif name in hw_files:
                self.numbers[field] = (f"{hw}/{name}", scale)
        self.labelled = {prefix: self._labels(hw, hw_files, prefix) for prefix in ("temp", "freq", "in")} if hw else {}
        self.limits = self._temperature_limits(hw_files, self.labelled["temp"]) if hw else {}
        self.texts = {name: f"{self.device}/{name}" for name in _TEXTS if name in device_files}
        self.model = _text(self.device / "product_name") if "product_name" in device_files else None
        # what a round reads: the readings every round, the settings (_SLOW) every SLOW_EVERY-th
        self.fast_numbers = [(f, spec) for f, spec in self.numbers.items() if f not in _SLOW]
        self.slow_numbers = [(f, spec) for f, spec in self.numbers.items() if f in _SLOW]
        self.fast_texts = [(name, path) for name, path in self.texts.items() if name not in _SLOW]
        self.slow_texts = [(name, path) for name, path in self.texts.items() if name in _SLOW]
        self._labelled_paths = [(prefix, label, path) for prefix, paths in self.labelled.items()
                                for label, path in paths.items()]
        self._texts: dict[str, tuple[str | None, object]] = {}  # file -> (its last text, that text parsed)
        self._planned_at = now
        self._rounds = 0
        self._slow_n: dict[str, float | None] = {}  # the settings' last values
        self._slow_t: dict[str, str | None] = {}

    @staticmethod
    def _labels(hw: Path, files: set[str], prefix: str) -> dict[str, str]:
        """label -> path of `<prefix>N_input`, with `<prefix>N_label` read once."""
        out = {}
        for name in _inputs(files, prefix):
            index = name[len(prefix):-len("_input")]
            label = f"{prefix}{index}_label"
            out[(_text(hw / label) if label in files else None) or f"{prefix}{index}"] = f"{hw}/{name}"
        return out

    @staticmethod
    def _temperature_limits(files: set[str],
                            temperatures: dict[str, str]) -> dict[str, tuple[float | None, float | None]]:
        """label -> (temp<N>_crit, temp<N>_emergency) in °C of each temperature sensor (`_labels`' label -> path of
        temp<N>_input): where the SMU throttles and where it shuts the ASIC down (amdgpu_pm.c; settings of the ASIC,
        read once per plan)."""
        out = {}
        for label, path in temperatures.items():
            stem = path[:-len("_input")]
            limits = tuple(_celsius(Path(f"{stem}_{kind}")) if f"{os.path.basename(stem)}_{kind}" in files else None
                           for kind in ("crit", "emergency"))
            if limits != (None, None):
                out[label] = limits
        return out

    def read(self, now: float) -> GpuSample:
        if self._planned_at is None or now - self._planned_at > self.replan_seconds:
            self._plan(now)
        problems: dict[str, str] = {}
        read = self._read
        if self._rounds % SLOW_EVERY == 0:
            self._slow_n = {field: _number(read(path, problems), scale) for field, (path, scale) in self.slow_numbers}
            self._slow_t = {name: read(path, problems) for name, path in self.slow_texts}
            od = self._slow_t.get("pp_od_clk_voltage")
            self._overdrive = self._parsed("pp_od_clk_voltage", od, parse_overdrive) if od else {}
        self._rounds += 1
        n = {field: _number(read(path, problems), scale) for field, (path, scale) in self.fast_numbers}
        n.update(self._slow_n)
        t = {name: read(path, problems) for name, path in self.fast_texts}
        t.update(self._slow_t)
        labelled: dict[str, dict[str, float]] = {prefix: {} for prefix in self.labelled}
        for prefix, label, path in self._labelled_paths:
            if (v := _number(read(path, problems))) is not None:
                labelled[prefix][label] = v
        if any(n[field] is None for field in self.numbers) and not problems:
            self._planned_at = None  # a file vanished: look again next round
        values: dict = {"temperatures": {k: v / 1000 for k, v in labelled.get("temp", {}).items()},
                        "temperature_limits": self.limits}
        if n.get("power1_average") is not None:
            values.update(power_watts=n["power1_average"], power_source="power1_average",
                          power_instant_watts=n.get("power1_input"))
        elif n.get("power1_input") is not None:
            values.update(power_watts=n["power1_input"], power_source="power1_input",
                          power_instant_watts=n["power1_input"])
        for field in ("power_cap_watts", "power_cap_max_watts", "fan_rpm", "vram_total_bytes", "vram_used_bytes",
                      "vram_visible_total_bytes"):
            values[field] = n.get(field)
        values["fan_pwm_ratio"] = n["pwm"] / 255 if n.get("pwm") is not None else None
        values["busy_ratio"] = n["busy"] / 100 if n.get("busy") is not None else None
        clocks, volts = labelled.get("freq", {}), labelled.get("in", {})
        # the texts change seldom (a DPM level, a link retrained): parsed again only when they did
        current, highest = self._parsed("pp_dpm_sclk", t.get("pp_dpm_sclk"), _dpm)
        values["sclk_hz"] = clocks.get("sclk") or current
        values["sclk_max_hz"] = highest
        values["mclk_hz"] = clocks.get("mclk") or self._parsed("pp_dpm_mclk", t.get("pp_dpm_mclk"), _dpm)[0]
        values["voltage_mv"] = volts.get("vddgfx", next(iter(volts.values()), None))
        values["pcie_speed_gts"] = self._parsed("current_link_speed", t.get("current_link_speed"), link_speed)
        values["pcie_max_speed_gts"] = self._parsed("max_link_speed", t.get("max_link_speed"), link_speed)
        values["pcie_width"] = link_width(t.get("current_link_width"))
        values["pcie_max_width"] = link_width(t.get("max_link_width"))
        values["perf_level"] = t.get("power_dpm_force_performance_level")
        values["overdrive"] = self._overdrive
        state = "gone" if "gone" in problems.values() else "not_readable" if "busy" in problems.values() else "ok"
        return GpuSample(gpu=self.pci, vendor="amd", model=self.model, time=now, state=state, problems=problems,
                         **{k: v for k, v in values.items() if v is not None})

    def _parsed(self, name: str, text: str | None, parse: Callable):
        """parse(text), from the last round's result when the file's text is the same."""
        last = self._texts.get(name)
        if last is not None and last[0] == text:
            return last[1]
        value = parse(text)
        self._texts[name] = (text, value)
        return value


def _listing(folder: Path) -> set[str]:
    """The names in `folder` (none when it cannot be listed: a GPU gone meanwhile)."""
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def _inputs(files: set[str], prefix: str) -> list[str]:
    """`<prefix>*_input` of `files`, in order (as a glob of them gave)."""
    return sorted(n for n in files if n.startswith(prefix) and n.endswith("_input")
                  and len(n) >= len(prefix) + len("_input"))


def _text(path: Path) -> str | None:
    """A small sysfs file's text, stripped; None when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _celsius(path: Path) -> float | None:
    """A hwmon limit file in millidegrees; None when absent or unreadable (amdgpu gives none on some ASICs)."""
    try:
        return int(path.read_text().strip()) / 1000
    except (OSError, ValueError):
        return None


def read(device: Path, pci: str, now: float) -> GpuSample:
    """One reading of one GPU (for one-off use; the daemon keeps an AmdReader per GPU)."""
    return AmdReader(device, pci).read(now)


def _dpm(text: str | None) -> tuple[float | None, float | None]:
    """(current, highest) level of a pp_dpm_* file, in Hz."""
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

