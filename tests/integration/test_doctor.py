"""`gpuwarden doctor` on faithful fake sysfs trees with config-space files (no Radeon is here): each broken
board yields its finding and exit code 1; a sound board exits 0."""

import json
import subprocess

from helpers import GPUWARDEN, wait_for

from fakesysfs import (
    ATOMIC_COMPLETER,
    ATOMIC_ROUTING,
    DOWNSTREAM,
    ROOT_PORT,
    UPSTREAM,
    add_bridge,
    add_gpu,
)

GiB = 1 << 30
AMD_ROOT, RADEON_USP, RADEON_DSP = (0x1022, 0x1483), (0x1002, 0x1478), (0x1002, 0x1479)


def radeon_behind(root, port_bdf, bus, gpu_bdf, card="rdna3", root_port=AMD_ROOT, devcap2=ATOMIC_COMPLETER,
                  **gpu):
    """A CPU root port, the card's own switch (upstream and downstream port), then the GPU: as a 7900 XTX sits."""
    parent = add_bridge(root, "pci0000:00", port_bdf, *root_port, ROOT_PORT, devcap2=devcap2)
    parent = add_bridge(root, parent, f"0000:{bus:02x}:00.0", *RADEON_USP, UPSTREAM, devcap2=ATOMIC_ROUTING)
    parent = add_bridge(root, parent, f"0000:{bus + 1:02x}:00.0", *RADEON_DSP, DOWNSTREAM, devcap2=ATOMIC_ROUTING)
    return add_gpu(root, gpu_bdf, card, parent=parent, hwmon_index=bus, **gpu)


def doctor(tmp_path, sysfs):
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}/state"\n[gpu]\nsysfs_root = "{sysfs}"\nnvml = false\n'
                   f'[cache]\ndirs = ["{tmp_path}/cache"]\n')
    run = subprocess.run([*GPUWARDEN, "--config", str(cfg), "doctor", "--json"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode in (0, 1), run.stderr
    return run.returncode, json.loads(run.stdout)


def problems(findings):
    return [f for f in findings if f["severity"] != "info"]


def test_a_sound_two_gpu_board_exits_0(tmp_path):
    sysfs = tmp_path / "sys"
    radeon_behind(sysfs, "0000:00:01.1", 0x01, "0000:03:00.0")
    radeon_behind(sysfs, "0000:00:03.1", 0x04, "0000:06:00.0")
    code, findings = doctor(tmp_path, sysfs)
    assert problems(findings) == [] and code == 0
    bars = [f for f in findings if f["check"] == "bar"]
    assert [f["what"] for f in bars] == ["large BAR active: the CPU sees all 24 GiB of VRAM (BAR 24 GiB)"] * 2
    summary = next(f for f in findings if f["check"] == "gpu" and f["subject"] == "0000:03:00.0")
    assert "Radeon RX 7900 XTX" in summary["what"] and "NUMA node 0" in summary["what"]
    assert "root port 0000:00:01.1 (CPU)" in summary["what"]
    [iommu] = [f for f in findings if f["check"] == "iommu"]
    assert iommu["what"] == "IOMMU mode: no IOMMU group (0000:03:00.0, 0000:06:00.0)"


def test_gpus_split_over_numa_nodes_root_complexes_and_a_translating_iommu(tmp_path):
    sysfs = tmp_path / "sys"
    radeon_behind(sysfs, "0000:00:01.1", 0x01, "0000:03:00.0")
    parent = add_bridge(sysfs, "pci0000:80", "0000:80:01.1", *AMD_ROOT, ROOT_PORT, devcap2=ATOMIC_COMPLETER)
    add_gpu(sysfs, "0000:83:00.0", "rdna3", parent=parent, hwmon_index=7, overrides={"numa_node": 1})
    for bdf, group in (("0000:03:00.0", 12), ("0000:83:00.0", 40)):
        folder = sysfs / "kernel/iommu_groups" / str(group)
        folder.mkdir(parents=True)
        (folder / "type").write_text("DMA-FQ\n")
        (sysfs / "bus/pci/devices" / bdf / "iommu_group").symlink_to(folder)
    code, findings = doctor(tmp_path, sysfs)
    notes = {f["check"]: f for f in findings if f["subject"] == "host"}
    assert code == 0 and problems(findings) == []  # notes, not warnings: the layout may be deliberate
    assert notes["numa"]["what"] == ("the GPUs are split across 2 NUMA nodes (NUMA node 0: 0000:03:00.0; "
                                     "NUMA node 1: 0000:83:00.0)")
    assert "pci0000:00: 0000:03:00.0; root complex pci0000:80: 0000:83:00.0" in notes["root_complex"]["what"]
    assert notes["iommu"]["what"] == "IOMMU mode: DMA-FQ (0000:03:00.0, 0000:83:00.0)"
    assert "iommu=pt" in notes["iommu"]["advice"]


def test_a_256_mb_bar_against_a_full_32_gb_bar(tmp_path):
    sysfs = tmp_path / "sys"
    radeon_behind(sysfs, "0000:00:01.1", 0x01, "0000:03:00.0", bar0=256 << 20,
                  overrides={"mem_info_vram_total": 32 * GiB, "mem_info_vis_vram_total": 256 << 20})
    radeon_behind(sysfs, "0000:00:03.1", 0x04, "0000:06:00.0", bar0=32 * GiB,
                  overrides={"mem_info_vram_total": 32 * GiB, "mem_info_vis_vram_total": 32 * GiB})
    code, findings = doctor(tmp_path, sysfs)
    [small] = problems(findings)
    assert code == 1 and (small["check"], small["subject"]) == ("bar", "0000:03:00.0")
    assert small["what"] == "BAR is 256 MiB: the CPU sees 256 MiB of 32 GiB VRAM" and "VBIOS" in small["advice"]
    full = next(f for f in findings if f["check"] == "bar" and f["subject"] == "0000:06:00.0")
    assert full["severity"] == "info" and "BAR 32 GiB" in full["what"]


def test_a_gen2_switch_in_front_of_a_gen4_gpu(tmp_path):
    sysfs = tmp_path / "sys"
    parent = add_bridge(sysfs, "pci0000:00", "0000:00:01.1", *AMD_ROOT, ROOT_PORT, speed="5.0",
                        devcap2=ATOMIC_COMPLETER)
    parent = add_bridge(sysfs, parent, "0000:01:00.0", 0x10B5, 0x8747, UPSTREAM, speed="5.0", max_speed="5.0",
                        devcap2=ATOMIC_ROUTING)  # a PLX riser switch whose uplink is Gen2
    parent = add_bridge(sysfs, parent, "0000:02:08.0", 0x10B5, 0x8747, DOWNSTREAM, devcap2=ATOMIC_ROUTING)
    add_gpu(sysfs, "0000:03:00.0", "rdna3", parent=parent)
    code, findings = doctor(tmp_path, sysfs)
    [link] = problems(findings)
    assert code == 1 and link["check"] == "link"
    assert link["what"] == ("the link 0000:01:00.0 (upstream port) <-> 0000:00:01.1 (root port) can do at most "
                            "5.0 GT/s; the GPU can do 16.0 GT/s x16")
    assert link["advice"].startswith("0000:01:00.0 (upstream port, 10b5:8747) limits it")


def test_a_chipset_root_port_without_atomicop_completion(tmp_path):
    sysfs = tmp_path / "sys"
    radeon_behind(sysfs, "0000:00:01.1", 0x01, "0000:03:00.0")  # CPU-attached, sound
    parent = add_bridge(sysfs, "pci0000:00", "0000:00:02.1", *AMD_ROOT, ROOT_PORT, max_speed="16.0", width=4,
                        max_width=4, devcap2=0)  # the chipset uplink: completes no AtomicOps
    parent = add_bridge(sysfs, parent, "0000:10:00.0", 0x1022, 0x43F4, UPSTREAM, width=4, max_width=4,
                        devcap2=ATOMIC_ROUTING)
    parent = add_bridge(sysfs, parent, "0000:11:08.0", 0x1022, 0x43F5, DOWNSTREAM, width=4, max_width=4,
                        devcap2=ATOMIC_ROUTING)
    add_gpu(sysfs, "0000:12:00.0", "rdna3", parent=parent, hwmon_index=9)
    code, findings = doctor(tmp_path, sysfs)
    found = {(f["check"], f["subject"]): f for f in problems(findings)}
    assert code == 1 and set(found) == {("chipset", "0000:12:00.0"), ("atomics", "0000:12:00.0"),
                                        ("link", "0000:12:00.0")}  # the x4 chipset uplink, too
    assert "AMD chipset switch 0000:11:08.0" in found["chipset", "0000:12:00.0"]["what"]
    assert found["atomics", "0000:12:00.0"]["what"] == (
        "root port 0000:00:02.1 (chipset) does not complete 32/64-bit PCIe AtomicOps")
    assert "x4" in found["link", "0000:12:00.0"]["what"]


def test_same_model_cards_with_different_power_caps(tmp_path):
    sysfs = tmp_path / "sys"
    radeon_behind(sysfs, "0000:00:01.1", 0x01, "0000:03:00.0")
    radeon_behind(sysfs, "0000:00:03.1", 0x04, "0000:06:00.0", overrides={"power1_cap": 300000000})
    code, findings = doctor(tmp_path, sysfs)
    [asym] = problems(findings)
    assert code == 1 and asym["check"] == "asymmetry" and "power caps 327 W vs 300 W" in asym["what"]
    assert "Write it to each card again" in asym["advice"]


def test_zero_byte_cache_files_and_the_table_output(tmp_path):
    sysfs = tmp_path / "sys"
    radeon_behind(sysfs, "0000:00:01.1", 0x01, "0000:03:00.0")
    (tmp_path / "cache" / "triton").mkdir(parents=True)
    (tmp_path / "cache" / "triton" / "k.hsaco").touch()
    code, findings = doctor(tmp_path, sysfs)
    [cache] = problems(findings)
    assert code == 1 and cache["check"] == "cache" and cache["what"] == "1 zero-byte file, e.g. triton/k.hsaco"
    table = subprocess.run([*GPUWARDEN, "--config", str(tmp_path / "gw.toml"), "doctor"], capture_output=True,
                           text=True, timeout=60)
    assert table.returncode == 1 and "WARNING  cache" in table.stdout and "gpuwarden quarantine" in table.stdout
    assert "0 critical, 1 warning" in table.stdout


def test_an_aer_storm_on_a_pch_root_port_names_the_gpu_behind_it(daemon_factory, corpus, tmp_path):
    """Corpus 007: a fatal AER on Intel PCH root port 00:1c.4 ([8086:a114]) with an amdgpu at 06:00.0 below it."""
    sysfs = tmp_path / "sys"
    port = add_bridge(sysfs, "pci0000:00", "0000:00:1c.4", 0x8086, 0xA114, ROOT_PORT, speed="8.0", max_speed="8.0",
                      width=4, max_width=4)
    add_gpu(sysfs, "0000:06:00.0", "rdna3", parent=port)
    d = daemon_factory(f'[gpu]\nsysfs_root = "{sysfs}"\nnvml = false\n[guard]\nenabled = false\n').start()
    d.wait_serving()
    d.log_file.write_text((corpus / "kernel/007-amd-pcie-aer-uncorrected-fatal-malformed-tlp.log").read_text())
    events = wait_for(lambda: [e for e in d.events() if e["kind"] in ("pcie_aer", "device_lost")] or None, 15,
                      what="the AER events")
    assert {e["gpu"] for e in events} == {"0000:06:00.0"}
    assert all(e["evidence"]["pci"] == "0000:00:1c.4" and e["evidence"]["gpus_behind"] == ["0000:06:00.0"]
               for e in events)
    assert "(GPU 0000:06:00.0 behind it)" in events[0]["message"]
    assert d.stop() == 0
    code, findings = doctor(tmp_path, sysfs)
    chipset = next(f for f in findings if f["check"] == "chipset")
    assert code == 1 and {f["check"] for f in problems(findings)} == {"link", "atomics"}  # x4 Gen3, no AtomicOps
    assert chipset["severity"] == "info"  # a single GPU on a chipset port: a note
    assert chipset["what"].startswith("attached to a chipset port (Intel PCH root port 0000:00:1c.4)")
