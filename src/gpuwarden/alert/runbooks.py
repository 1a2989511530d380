"""What to do next, per runbook key. An event names its key in its evidence (kernel rules do), else its kind's
key in the catalog (kinds.py) applies."""

from gpuwarden.kinds import runbook

RUNBOOKS: dict[str, str] = {
    "device_lost": (
        "The GPU is gone until a reboot. Reboot and wait a full 10 minutes before judging it dead (it can take "
        "7). If it does not come back: shut down, switch the PSU off for 30-60 s, power on. Never unbind/bind "
        "the driver or write resource*_resize to \"rescue\" the card: that path ends in a kernel panic."),
    "reset": (
        "The driver reset the GPU: VRAM and GPU contexts were lost, so restart the engines on it. Repeated "
        "resets: find the request that triggered them; check firmware and kernel versions."),
    "gpu_fault": (
        "A GPU job faulted or hung. If the engine on this GPU stopped making progress, restart it now: a hung "
        "engine is how GPUs get lost. Watch for a reset or a device lost next."),
    "xid": (
        "Application Xids (13, 31, 43...): restart the process named in the line. Hardware Xids (48, 79, 95, "
        "119...): drain the GPU, then reset it (nvidia-smi -r) or reboot."),
    "gsp": "The GPU's firmware (GSP) stopped answering: drain the GPU, then reset it (nvidia-smi -r) or reboot.",
    "aer": (
        "PCIe errors. A few corrected ones are harmless. Uncorrected or recurring: reseat the card and riser, "
        "check the slot's link speed and the BIOS ASPM setting."),
    "ras": "Uncorrectable memory errors: drain the GPU and reboot; if they recur the card needs service.",
    "oops": (
        "A kernel oops in a GPU driver leaves it in an unknown state: drain the box and reboot soon; do not "
        "unload or reload the driver."),
    "stall": (
        "The engine stopped generating with requests in flight. gpuwarden killed it (or, with on_stall = "
        "\"alert\", left it to you): restart it, and find the request that hung in the engine's log at the time "
        "of this alert. If the GPU faults next, the kill came too late: lower min_stall."),
    "crash_loop": (
        "The engine keeps dying. A power cut during its first compile leaves zero-byte files in the torch, "
        "inductor or triton caches: look for them (find ~/.cache -size 0 -type f), move the cache aside (do not "
        "delete it) and let the engine recompile: `gpuwarden quarantine` does that for the configured caches."),
    "cache_poisoned": (
        "Zero-byte files in a compile cache are the mark of a write cut by a power loss; the engine dies on them. "
        "The cache was renamed to <dir>.BROKEN-<time>-<reason>, not deleted: restart the engine so it recompiles "
        "(the first start takes longer), then delete the BROKEN folder once it runs."),
    "kill_refused": ("gpuwarden did not kill the engine: its kill budget is spent, or its target named processes it "
                     "may not kill (the event says which and why). Look at it by hand now."),
    "thermal": "Check airflow, fan curves and dust; lower the power cap until the cause is fixed.",
    "power": "Check the power cap (and that it was set on every card) and what the PSU can feed all GPUs at once.",
    "fan": "A stopped fan on a hot GPU: stop the load on it now and check the fan and its header.",
    "clock": "Clocks stay low under load: check throttle reasons, temperatures, the power cap and perf level.",
    "pcie_link": "The link trains below its maximum under load: reseat the card and riser, check the slot in BIOS.",
    "asymmetry": (
        "Same-model GPUs differ in a setting: a setting written to several cards at once can reach only one. "
        "Write it to each card again and check per-card telemetry under load (the read-back can lie)."),
    "daemon": "gpuwarden itself had trouble: see `journalctl -u gpuwarden` and `gpuwarden events`.",
    "store": ("gpuwarden cannot write its database: free space in its state_dir, or end what holds the database "
              "(`fuser` on gpuwarden.db). Events are kept in memory meanwhile and written when it works again."),
    "kmsg": "Kernel messages were lost before gpuwarden read them: check `dmesg` by hand for GPU faults.",
    "refused_file": (
        "gpuwarden will not read this file: it is a FIFO, a device node, a symbolic link or another user's, which "
        "the engine's user can plant to freeze or fool root. Point the setting at a regular file owned by the "
        "engine's user or root; until then the engine's progress is not read from it."),
}


def runbook_for(kind: str, key: str | None = None) -> str | None:
    return RUNBOOKS.get(key or runbook(kind) or "")
