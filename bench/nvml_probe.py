"""Read every NVIDIA GPU once through gpuwarden's NVML reader and print what it saw, with timings: the proof
run on real hardware (README, "NVIDIA on real hardware").

    PYTHONPATH=src python3 bench/nvml_probe.py
"""

import dataclasses
import json
import time

from gpuwarden.gpu import nvidia

nvml = nvidia.load()
if nvml is None:
    raise SystemExit("no NVML here")
print("driver", nvml.nvmlSystemGetDriverVersion(), "nvml", nvml.nvmlSystemGetNVMLVersion())
for pci, handle in nvidia.handles(nvml).items():
    nvidia.read(nvml, handle, pci, time.time())  # warm
    times = []
    for _ in range(50):
        start = time.perf_counter()
        sample = nvidia.read(nvml, handle, pci, time.time())
        times.append(time.perf_counter() - start)
    print(json.dumps(dataclasses.asdict(sample), indent=1, default=str))
    print(f"read: median {sorted(times)[25] * 1000:.2f} ms, max {max(times) * 1000:.2f} ms over 50 reads")
start = time.perf_counter()
events = nvidia.xid_events(nvml, 500)
print(f"xid events in 0.5 s: {events} (waited {time.perf_counter() - start:.2f} s)")
