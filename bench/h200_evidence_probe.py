"""Issue 23's acceptance on a real NVIDIA GPU (run once on an H200), gpuwarden's own code throughout:

1. the card's limits: what gpuwarden's NVML reader reports (slowdown/shutdown/memory-max temperatures, HBM
   temperature, VRAM used without the driver's reserve), what the telemetry rules make of them, beside NVML's
   raw answers and `nvidia-smi -q -d TEMPERATURE,MEMORY`;
2. a stranger's Xid: `gpuwarden run` watches one engine stand-in (bench/restart_probe.py's torch-backed engine,
   tests/integration/fake_engine.py's vLLM metrics) with kernel source "auto", [kernel.xid] "31" = "critical"
   and NVML on; another process makes a real illegal-address fault (a CuPy kernel writing through a wild
   pointer); the Xid events (`gpuwarden events --jsonl`), their decision, the merge of NVML's copy into the
   kernel's, and the engine's progress before and after are recorded.

    PYTHONPATH=src:tests/integration python3 bench/h200_evidence_probe.py --out DIR

Writes DIR/h200_evidence.json (and the logs beside it). Changes no GPU setting: the guard is off.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 18791
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests/integration")]  # gpuwarden's own code, also in-process
ENV = {**os.environ, "PYTHONUNBUFFERED": "1",  # carried wheels (README) stay on the path
       "PYTHONPATH": ":".join(filter(None, [f"{ROOT / 'src'}:{ROOT / 'tests/integration'}",
                                            os.environ.get("PYTHONPATH")]))}

FAULT = r"""
import cupy, os
print("stranger pid", os.getpid(), flush=True)
k = cupy.RawKernel(r'extern "C" __global__ void wild(int v) { *(volatile int *)0x7f0000000000ULL = v; }', 'wild')
k((1,), (1,), (cupy.int32(7),))
cupy.cuda.runtime.deviceSynchronize()
print("no fault?!")
"""


def sh(cmd: str, timeout: float = 60) -> str:
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout, env=ENV)
        return r.stdout + r.stderr
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"


# --- 1. the card's limits --------------------------------------------------------------------------------------


def limits() -> dict:
    from gpuwarden.config.settings import GpuConfig
    from gpuwarden.gpu import nvidia, rules, watch

    nvml = nvidia.load()
    if nvml is None:
        return {"error": "no NVML"}
    out: dict = {"driver": nvml.nvmlSystemGetDriverVersion(), "nvml": nvml.nvmlSystemGetNVMLVersion(), "gpus": {}}
    for pci, handle in nvidia.handles(nvml).items():
        sample = nvidia.read(nvml, handle, pci, time.time())
        raw: dict = {}
        for name in ("SLOWDOWN", "SHUTDOWN", "MEM_MAX", "GPU_MAX", "ACOUSTIC_MIN", "ACOUSTIC_CURR", "ACOUSTIC_MAX"):
            try:
                raw[f"threshold_{name.lower()}"] = nvml.nvmlDeviceGetTemperatureThreshold(
                    handle, getattr(nvml, f"NVML_TEMPERATURE_THRESHOLD_{name}"))
            except Exception as exc:
                raw[f"threshold_{name.lower()}"] = f"{type(exc).__name__}: {exc}"
        raw["temperature_gpu"] = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        raw["field_memory_temp"] = _field(nvidia, nvml, handle, "NVML_FI_DEV_MEMORY_TEMP")
        v1 = nvml.nvmlDeviceGetMemoryInfo(handle)
        raw["memory_v1"] = {"total": v1.total, "used": v1.used, "free": v1.free}
        try:
            v2 = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
            raw["memory_v2"] = {"total": v2.total, "reserved": v2.reserved, "used": v2.used, "free": v2.free}
        except Exception as exc:
            raw["memory_v2"] = f"{type(exc).__name__}: {exc}"
        raw["clocks_event_reasons"] = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        # what the telemetry rules judge the temperatures by: the card's own limits
        config = GpuConfig()
        judged = {sensor: rules.device_limits(
            {"gpu": (config.edge_warn_celsius, config.edge_critical_celsius),
             "mem": (config.mem_warn_celsius, config.mem_critical_celsius)}.get(sensor, (None, None)),
            sample.temperature_limits.get(sensor)) for sensor in sample.temperatures}
        series = {family.name: {"|".join(k): v for k, v in values.items()}
                  for family, values in watch.series_of({pci: sample}).items()
                  if family.name.endswith(("temperature_celsius", "temperature_limit_celsius", "vram_bytes",
                                           "throttle"))} if hasattr(watch, "series_of") else {}
        out["gpus"][pci] = {"gpuwarden_sample": dataclasses.asdict(sample), "nvml_raw": raw,
                            "rules_warn_critical_celsius": judged,
                            "configured_defaults": {"edge": [config.edge_warn_celsius, config.edge_critical_celsius],
                                                    "mem": [config.mem_warn_celsius, config.mem_critical_celsius]},
                            "exported": series}
    return out


def _field(nvidia, nvml, handle, name):
    return nvidia._field(nvml, handle, name)


# --- 2. a stranger's Xid -----------------------------------------------------------------------------------------


def tokens() -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    m = re.search(r"^vllm:generation_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def nvml_xids(into: list, seconds: float) -> None:
    """NVML's Xid events for `seconds`, through gpuwarden's reader, into `into`."""
    from gpuwarden.gpu import nvidia

    nvml = nvidia.load()
    if nvml is None:
        into.append("no NVML")
        return
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            into.extend([time.time(), pci, xid] for pci, xid in nvidia.xid_events(nvml, 500))
        except Exception as exc:
            into.append(f"{type(exc).__name__}: {exc}")
            return


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return stat != "Z"


def stranger_xid(out_dir: Path, cpu: bool = False) -> dict:
    res: dict = {"kmsg_exists": os.path.exists("/dev/kmsg"), "journalctl": shutil.which("journalctl"),
                 "journald_running": os.path.exists("/run/systemd/journal/socket"), "uname": os.uname().release}
    try:
        with open("/dev/kmsg", "rb") as f:
            os.set_blocking(f.fileno(), False)
            f.read(1)
        res["kmsg_readable"] = True
    except OSError as exc:
        res["kmsg_readable"] = f"{type(exc).__name__}: {exc}"
    state = Path(tempfile.mkdtemp(prefix="gw-state-"))
    cfg = state / "gpuwarden.toml"
    cfg.write_text(f"""
[daemon]
state_dir = "{state}"
log_level = "info"
[exporter]
enabled = true
port = 10461
[kernel]
source = "auto"
lookback = "1s"
[kernel.xid]
"31" = "critical"
[engines]
discover = false
[[engine]]
name = "probe"
metrics_url = "http://127.0.0.1:{PORT}/metrics"
profile = "vllm"
scrape_interval = "1s"
min_stall = "10s"
kill_grace = "5s"
canary_timeout = "10s"
[gpu]
nvml = true
interval = "2s"
[guard]
enabled = false
""")
    res["config"] = cfg.read_text()
    engine_log = open(out_dir / "engine.log", "w")  # noqa: SIM115 - closed in the finally below
    engine = subprocess.Popen([sys.executable, str(ROOT / "bench/restart_probe.py"), "engine", "--port", str(PORT),
                               "--load", "0", "--gib", "2", *(["--cpu"] if cpu else [])], env=ENV,
                              stdout=engine_log, stderr=subprocess.STDOUT, start_new_session=True)
    res["engine_pid"] = engine.pid
    daemon_log = open(out_dir / "daemon.log", "w")  # noqa: SIM115 - closed in the finally below
    daemon = None
    t0 = time.monotonic()
    progress: list = []

    def mark(what: str) -> None:
        progress.append([round(time.monotonic() - t0, 2), what, tokens(), alive(engine.pid)])
        print(progress[-1], flush=True)

    try:
        deadline = time.monotonic() + 90
        while tokens() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        mark("engine serving")
        daemon = subprocess.Popen([sys.executable, "-m", "gpuwarden", "--config", str(cfg), "run"], env=ENV,
                                  stdout=daemon_log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        for _ in range(15):  # the daemon starts, learns the engine's GPU, scrapes it a few times
            time.sleep(1)
        mark("before the fault")
        res["status_before"] = sh(f"cd {ROOT} && {sys.executable} -m gpuwarden --config {cfg} "
                                  "status --json", 30)[-6000:]
        seen_by_nvml: list = []  # this process's own NVML event set: does NVML report the Xid at all?
        listener = threading.Thread(target=nvml_xids, args=(seen_by_nvml, 12.0), daemon=True)
        listener.start()
        time.sleep(1.5)  # the event set registered before the fault
        fault_at = time.time()
        fault = subprocess.run([sys.executable, "-c", FAULT], env=ENV, capture_output=True, text=True, timeout=60)
        res["fault"] = {"rc": fault.returncode, "stdout": fault.stdout[-1000:], "stderr": fault.stderr[-1500:],
                        "seconds": round(time.time() - fault_at, 2)}
        mark("fault made")
        listener.join(15)
        res["nvml_xids_seen_by_probe"] = seen_by_nvml
        for i in range(25):  # the engine must still progress, past min_stall and the NVML merge window
            time.sleep(1)
            if i % 5 == 4:
                mark("after the fault")
        res["engine_alive_at_end"] = alive(engine.pid)
        res["daemon_alive_at_end"] = daemon.poll() is None
        res["kernel_log_nvrm"] = sh("dmesg 2>&1 | grep -iE 'NVRM|Xid' | tail -20", 20)
        rows = sh(f"cd {ROOT} && {sys.executable} -m gpuwarden --config {cfg} events --jsonl "
                  "--since 10m", 30)
        (out_dir / "events.jsonl").write_text(rows)
        events = []
        for line in rows.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        res["events"] = events
        res["xid_events"] = [e for e in events if e.get("kind") == "xid"]
        res["kills"] = [e for e in events if e.get("kind") in ("engine_killed", "kill_refused", "engine_stall",
                                                               "engine_unresponsive")]
        res["metrics_xid"] = sh("curl -s http://127.0.0.1:10461/metrics | grep -iE 'xid|kernel_events|merge' "
                                "| head -40", 20)
    finally:
        res["progress"] = progress
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
        try:
            os.killpg(engine.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        daemon_log.close()
        engine_log.close()
    ok = [p for p in progress if p[1] == "after the fault"]
    res["engine_progressing_after_fault"] = bool(ok) and all(p[3] for p in ok) and \
        all(b[2] is not None and a[2] is not None and b[2] > a[2] for a, b in itertools.pairwise(ok))
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--cpu", action="store_true", help="no GPU: a dry run of the flow (the fault fails)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"nvidia_smi_q": sh("nvidia-smi -q -d TEMPERATURE,MEMORY")}
    try:
        result["limits"] = limits()
    except Exception as exc:
        result["limits"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result["limits"], indent=1, default=str)[:6000], flush=True)
    result["stranger_xid"] = stranger_xid(args.out, args.cpu)
    text = json.dumps(result, indent=1, default=str)
    (args.out / "h200_evidence.json").write_text(text)
    sx = result["stranger_xid"]
    print(json.dumps({k: sx.get(k) for k in ("kmsg_exists", "kmsg_readable", "journalctl", "fault",
                                             "engine_alive_at_end", "engine_progressing_after_fault", "progress",
                                             "xid_events", "kills", "kernel_log_nvrm", "metrics_xid")},
                     indent=1, default=str))


if __name__ == "__main__":
    main()
