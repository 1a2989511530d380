"""Run the doctor's PCI reading on a real machine and print what it saw: each GPU's chain of links up to its
root port with what config space says of each hop, its BARs, NUMA node and IOMMU domain, then the findings.
The proof run on real hardware (README, "The doctor").

    PYTHONPATH=src python3 bench/doctor_probe.py
"""

import dataclasses
import json
from pathlib import Path

from gpuwarden.cli import doctor
from gpuwarden.config.settings import Config
from gpuwarden.gpu import pci
from gpuwarden.gpu.discovery import discover
from gpuwarden.gpu.watch import read_once

SYS = Path("/sys")
config = Config()
gpus = discover(SYS)
print(f"{len(gpus)} GPU(s):", [dataclasses.asdict(g) for g in gpus])
for gpu in gpus:
    path = pci.device_dir(SYS, gpu.pci)
    print(f"\n{gpu.pci}: {path}")
    for node in pci.upstream(SYS, gpu.pci):
        size = (pci.device_dir(SYS, node.bdf) / "config").stat().st_size
        print(f"  {node.bdf} {node.vendor or 0:04x}:{node.device or 0:04x} class {node.pci_class or 0:06x} "
              f"link {node.speed_gts} GT/s x{node.width} of {node.max_speed_gts} GT/s x{node.max_width} "
              f"config {size} bytes: {node.pcie}")
    print("  BARs:", pci.bar_sizes((path / "resource").read_text()))
    print("  root complex", pci.root_complex(SYS, gpu.pci), "iommu", pci.iommu_type(SYS, gpu.pci))
facts = doctor.collect(config, read_once(config.gpu, gpus))
findings = doctor.diagnose(facts, config.gpu)
print(json.dumps([{**dataclasses.asdict(f), "severity": str(f.severity)} for f in findings], indent=1))
print("exit code would be", 1 if doctor.worst(findings) >= doctor.W else 0)
