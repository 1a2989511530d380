"""What to do next, per runbook key, and in which order for one incident. An event names its key in its evidence
(kernel rules do), else its kind's key in the catalog (kinds.py) applies.

The order is the order a person must act in: a GPU that is gone needs a reboot before anything else, and then
every step that only makes sense on a live GPU (restart the engine, `nvidia-smi -r`) is left out. What to do
about an engine follows from what gpuwarden decided about it (`evidence["decision"]`): the message never tells
the reader to do what the daemon already did, nor hedges about what it did."""

from gpuwarden.core.eventkinds import runbook
from gpuwarden.core.registry import register_runbooks

RUNBOOKS: dict[str, str] = {
    "device_lost": (
        "Reboot, then wait a full 10 minutes before judging the GPU dead (it can take 7). Never unbind/bind the "
        "driver or write resource*_resize to \"rescue\" the card: that path ends in a kernel panic. If it does "
        "not come back: shut down, switch the PSU off for 30-60 s, power on. After the reboot gpuwarden compares "
        "the GPUs with how they were before and tells you."),
    "reset": (
        "The driver reset the GPU: VRAM and GPU contexts were lost, so restart the engines on it. Repeated "
        "resets: find the request that triggered them; check firmware and kernel versions."),
    "gpu_fault": (
        "A GPU job faulted or hung; a hung engine is how GPUs get lost. Watch for a reset or a device lost next. "
        "If it repeats, find the request that triggers it in the engine's log at the time of this alert."),
    "xid": (
        "Application Xids (13, 31, 43...): restart the process named in the line. Hardware Xids (48, 95, "
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
        "Find the request that hung in the engine's log at the time of this alert: retried, it may hang the "
        "engine again. If the GPU faults after a stall, lower min_stall so that the kill comes sooner."),
    "crash_loop": (
        "The engine keeps dying. A power cut during its first compile leaves zero-byte files in the torch, "
        "inductor or triton caches, and the engine dies on them: `gpuwarden quarantine` finds them in the "
        "configured caches and moves each such cache aside (renamed, never deleted); the engine recompiles at its "
        "next start. No zero-byte file: its own log says why it dies."),
    "cache_poisoned": (
        "Zero-byte files in a compile cache are the mark of a write cut by a power loss; the engine dies on them. "
        "The cache was renamed (its new name ends in .BROKEN-, with the time and the reason), not deleted: restart "
        "the engine so it recompiles (the first start takes longer), then delete the BROKEN folder once it runs."),
    "kill_refused": ("gpuwarden did not kill the engine (the page says why): look at it by hand now, and kill or "
                     "restart it yourself if it is stuck."),
    "kill_not_done": (
        "gpuwarden decided to kill the engine and could not: the event says why (none of its processes found, the "
        "look at them late, a signal refused). It tries again at each look until the kill is done, its kill budget "
        "is spent or the engine works again; stop it by hand now (`systemctl kill` its unit, `docker kill` its "
        "container, or kill its processes)."),
    "not_answering": (
        "The engine does not answer where gpuwarden reads it. Is it running? A unit or container that is stopped "
        "or failed: start it and read its own log for why it stopped. Running: is metrics_url's port the one it "
        "listens on (`ss -ltnp`)? `gpuwarden check` reads the configuration."),
    "restart_failed": (
        "The engine did not come back after it was started again: no real completion within restart_timeout. "
        "Read its own log for why it does not load, and check its GPU (`gpuwarden doctor`) before starting it by "
        "hand; gpuwarden will not restart it again."),
    "restart_retrying": (
        "The engine's supervisor did not start it when asked (dockerd or systemd did not answer, or its start "
        "failed: the page says which, and the exact command). Nothing to do yet: gpuwarden asks again with "
        "backoff until restart_timeout and pages again either way. If it goes on, look at the supervisor itself "
        "(`systemctl status docker` and `journalctl -u docker` for dockerd; the unit's `systemctl status`)."),
    "restart_not_started": (
        "The engine's supervisor never started it within restart_timeout, however often gpuwarden asked (the "
        "page says how often, the last answer and the command). Look at the supervisor first (`systemctl status "
        "docker` and `journalctl -u docker` for dockerd; the unit's `systemctl status` and `journalctl -u`), then "
        "start the engine by hand with the command on the page; gpuwarden will not restart it again."),
    "gpus_missing": (
        "A GPU is still missing after the reboot. Shut down, switch the PSU off for 30-60 s, power on (a warm "
        "reboot does not always bring a card back). Still missing: reseat the card, check its power cables and "
        "riser. Never unbind/bind the driver or rescan the bus to \"rescue\" it."),
    "gpus_changed": (
        "A GPU came back different. A narrower or slower link: reseat the card and riser, check the slot's BIOS "
        "setting. A smaller BAR: the firmware setup lost Above 4G decoding / Re-Size BAR. AtomicOps gone: the "
        "card moved behind a port that does not complete them. A different driver: check which one bound it."),
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
register_runbooks(RUNBOOKS)  # config checks runbook names against these (registry.py)

# The order in which runbooks apply when several do: the worst state of the hardware first.
_ORDER = ["device_lost", "gpus_missing", "gpus_changed", "oops", "ras", "gsp", "xid", "reset", "restart_failed",
          "restart_not_started", "restart_retrying", "kill_refused", "kill_not_done", "not_answering", "crash_loop",
          "cache_poisoned", "gpu_fault", "stall"]
# Meaningless, or harmful, once the GPU is gone: they restart engines on it or reset it in place.
_LIVE_GPU_ONLY = frozenset({"reset", "gpu_fault", "stall", "xid", "gsp", "pcie_link", "clock"})
# Chosen by the message from what happened, not named by a kind: a missing GPU among those that came back
SITUATIONAL = frozenset({"gpus_missing", "restart_not_started"})  # the latter: a restart never started (actuator)
HARDWARE = frozenset(_ORDER[:_ORDER.index("restart_failed")])  # these come before the steps for each engine
OFF_THE_BUS_XIDS = frozenset({79})  # "GPU has fallen off the bus": a reboot, never nvidia-smi -r


def runbook_for(kind: str, key: str | None = None, xid: int | None = None) -> str | None:
    return RUNBOOKS.get(key_for(kind, key, xid) or "")


def key_for(kind: str, key: str | None = None, xid: int | None = None) -> str | None:
    if kind == "xid" and xid in OFF_THE_BUS_XIDS:
        return "device_lost"
    return key or runbook(kind)


def ordered(keys: list[str]) -> list[str]:
    """The runbook keys to show, worst first, each once; with the GPU gone, only what applies to a gone GPU."""
    keys = list(dict.fromkeys(k for k in keys if k in RUNBOOKS))
    if "device_lost" in keys or "gpus_missing" in keys:
        keys = [k for k in keys if k not in _LIVE_GPU_ONLY]
    return sorted(keys, key=lambda k: _ORDER.index(k) if k in _ORDER else len(_ORDER))


def engine_step(decision: dict, gpu_gone: bool, restart: str | None = None) -> str | None:
    """What the person must do about one engine, after what gpuwarden decided about it (None: nothing);
    `restart`: the command that starts it again, where the daemon knows it (context.Runs)."""
    engine, reason, action = decision.get("engine") or "the engine", decision.get("reason") or "", \
        decision.get("action")
    how = f": {restart}" if restart else ""
    if gpu_gone and action in ("kill", "restart", "alert_only"):
        return None  # nothing runs on that GPU before the reboot; the reboot step says what follows
    if decision.get("dry_run") and action in ("kill", "restart"):
        return f"Restart {engine} yourself if it is stuck{how}. This is a dry run: gpuwarden killed nothing."
    if action == "kill":
        unit = " (a systemd unit with Restart=on-failure stays down after SIGTERM)" if "systemctl" in how else ""
        return (f"Check that {engine} runs again, and start it if not{how}. gpuwarden killed it and does not "
                f"start it{unit}.")
    if action == "restart":
        return (f"Nothing to do for {engine} yet: gpuwarden is restarting it and follows up on this incident when "
                "a real completion succeeds, or pages again if it does not come back.")
    if action == "alert_only":
        return f"Restart {engine} now{how}. gpuwarden left it running ({reason})."
    if action == "refuse" and decision.get("by_hand"):
        return f"Look at {engine} by hand now, and restart it yourself if it is stuck{how}: gpuwarden did not kill it."
    if action == "suspect":
        return f"Watch {engine}: gpuwarden is checking it closely ({reason}) and kills it only on proof."
    return None
