"""Issue 37: kernel records read by their structure, the prefixes as the kernel and pasted reports print them,
and the rules and context that were missing. Every line here is made from a format string of the kernel or of the
driver (the source file is named beside it) and names only the `ffff` PCI domain. tests/security/
test_attack_kernel_lines.py makes the real kernel print the user-named lines."""

import json

import pytest

from gpuwarden.cli import main as cli
from gpuwarden.config.settings import ConfigError, parse
from gpuwarden.core.model import Event, Severity
from gpuwarden.kernel.classifier import Classifier
from gpuwarden.kernel.formats import parse_lines
from gpuwarden.kernel.records import KernelRecord, parse_kmsg
from gpuwarden.kernel.rules import Rule

I, W, C = Severity.INFO, Severity.WARNING, Severity.CRITICAL
GPU = "ffff:fe:1f.7"

# arch/x86/mm/fault.c show_signal_msg "%s%s[%d]: segfault at %lx ip %px sp %px error %lx", mm/memory.c
# print_vma_addr " in %s[%lx,%lx+%lx]", then " likely on CPU %d (core %d, socket %d)": the task's name and the
# mapped file's name are the user's (issue 37's three processes)
NAMED = [("NVRM: SMU fail\n", "ffff:fe:00.0"), ("BUG: \n", "NVRM (PCI:ffff:fe:00.0)"),
         ("a+0x0/0x0 [xe]", "ffff:fe:00.0")]


def segfault(name: str, pid: int, file: str) -> str:
    return (f"{name}[{pid}]: segfault at 0 ip 00007f0000001000 sp 00007ffc00000000 error 4 in {file}"
            f"[0,7f0000001000+1000] likely on CPU 0 (core 0, socket 0)")


def kmsg(text: str, seq: int, usec: int, level: int = 6) -> str:
    """A /dev/kmsg record as the kernel writes it: facility 0, a newline and any control character escaped."""
    escaped = "".join(f"\\x{ord(c):02x}" if ord(c) < 32 or c == "\\" else c for c in text)
    return f"{level},{seq},{usec},-;{escaped}"


def events_of(records: list[KernelRecord], classifier: Classifier | None = None) -> list[Event]:
    classifier = classifier or Classifier()
    bursts = [b for r in records for b in classifier.feed(r, 1000.0)]
    bursts += classifier.flush(1000.0, everything=True).new
    return [b.final for b in bursts]


def replay(tmp_path, text: str, capsys) -> list[dict]:
    """What `gpuwarden replay --jsonl` prints for a saved log."""
    (tmp_path / "gw.toml").write_text("")
    (tmp_path / "k.log").write_text(text)
    capsys.readouterr()
    cli.main(["replay", "--config", str(tmp_path / "gw.toml"), "--jsonl", str(tmp_path / "k.log")])
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def dmesg(stamp: float, text: str) -> str:
    """util-linux dmesg: a newline in a record is printed with the stamp's width of spaces after it."""
    prefix = f"[{stamp:12.6f}] "
    return prefix + text.replace("\n", "\n" + " " * len(prefix))


def console(stamp: float, text: str) -> str:
    """The console, /proc/kmsg and so syslog's kern.log: every line of a record gets the prefix."""
    return "\n".join(f"[{stamp:12.6f}] {line}" for line in text.split("\n"))


# --- a user's fields are fields -------------------------------------------------------------------------------

def test_kmsg_records_of_processes_named_like_faults_make_no_event():
    raw = [kmsg(segfault(name, 4240 + i, file), 100 + 2 * i, 5_000_000 + i)
           for i, (name, file) in enumerate(NAMED)]
    records = [parse_kmsg(r) for r in raw]
    assert "\n" in records[0].text and records[0].facility == 0  # the kernel's record, the newline inside it
    assert events_of(records) == []


def test_a_journal_entry_whose_message_holds_the_newline_makes_no_event():
    lines = [json.dumps({"MESSAGE": segfault(name, 4250 + i, file), "_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0",
                         "_SOURCE_MONOTONIC_TIMESTAMP": str(6_000_000 + i)}) for i, (name, file) in enumerate(NAMED)]
    records = parse_lines(lines).records
    assert len(records) == 3 and records[1].text.startswith("BUG: \n[4251]: segfault")
    assert events_of(records) == []


@pytest.mark.parametrize("form", [dmesg, console], ids=["dmesg", "kern.log"])
def test_replay_of_the_printed_lines_makes_no_event(tmp_path, capsys, form):
    text = "\n".join(form(7.0 + i, segfault(name, 4260 + i, file)) for i, (name, file) in enumerate(NAMED))
    assert replay(tmp_path, text + "\n", capsys) == []


def test_kern_log_lines_of_a_file_name_with_newlines_are_no_lines(tmp_path, capsys):
    """A file named `x\\nNVRM: Xid (PCI:ffff:fe:1f): 79, z\\nf+0x1/0x2 [amdgpu]\\ny`: where the console and syslog
    split the record (each line with its stamp), its lines are joined back to the fault they belong to."""
    name = "x\nNVRM: Xid (PCI:ffff:fe:1f): 79, z\nf+0x1/0x2 [amdgpu]\ny"
    text = console(9.5, "WARNING: CPU: 0 PID: 1 at kernel/sched/core.c:1 f+0x1/0x2") + "\n" \
        + console(9.5, segfault("a", 4300, name)) + "\n"
    assert replay(tmp_path, text, capsys) == []


def test_an_open_report_takes_no_frame_from_a_task_name():
    """A WARNING with no GPU driver in it is open when a process named like a frame of `xe` segfaults."""
    records = [parse_kmsg(kmsg(t, i, 8_000_000 + i)) for i, t in enumerate([
        "------------[ cut here ]------------",
        "WARNING: CPU: 1 PID: 77 at kernel/workqueue.c:1234 __queue_work+0x2a/0x3c0",
        " __queue_work+0x2a/0x3c0",
        segfault("a+0x0/0x0 [xe]", 4270, "ffff:fe:00.0"),
        " queue_work_on+0x3b/0x50",
        "---[ end trace 0000000000000000 ]---"])]
    assert events_of(records) == []


def test_a_report_header_naming_a_task_like_a_frame_names_no_module():
    """kernel/watchdog.c "BUG: soft lockup - CPU#%d stuck for %us! [%s:%d]\n": the name is the task's; the report's
    modules are its frames'."""
    records = [parse_kmsg(kmsg(t, i, 9_000_000 + i, 0)) for i, t in enumerate([
        "watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [a+0x0/0x0 [xe]:4280]",
        "RIP: 0010:native_queued_spin_lock_slowpath+0x6e/0x2e0",
        "Call Trace:",
        " _raw_spin_lock+0x2d/0x40",
        " do_syscall_64+0x58/0xc0"])]
    assert [(e.kind, e.severity, e.message) for e in events_of(records)] == [
        ("kernel_oops", W, "kernel oops outside the GPU drivers")]


def test_the_line_a_file_name_breaks_off_is_no_line():
    """A mapped file named `x\\nNVRM: Xid (PCI:ffff:fe:1f): 79, x`: a log that splits records has this line, which
    still ends with the mapping's address range."""
    line = "NVRM: Xid (PCI:ffff:fe:1f): 79, x[0,7f0000001000+1000] likely on CPU 0 (core 0, socket 0)"
    assert events_of([KernelRecord(line, 5.0)]) == []


def test_an_indented_line_of_a_text_log_sets_no_device():
    """dmesg prints a record's next lines indented: a file name's `\\nDEVICE=+pci:…` is text, not kmsg metadata."""
    [record] = parse_lines(dmesg(5.0, segfault("a", 4290, "x\nDEVICE=+pci:ffff:fe:00.0\ny")).splitlines()).records
    assert record.device is None and "\nDEVICE=+pci:ffff:fe:00.0\n" in record.text


def test_no_line_of_a_record_is_read_as_a_record_of_its_own():
    record = parse_kmsg(kmsg(f"\namdgpu {GPU}: amdgpu: device lost from bus!", 1, 1_000_000, 3))
    assert events_of([record]) == []


def test_check_refuses_a_rule_a_task_name_can_hold():
    with pytest.raises(ConfigError, match="too short to be specific"):
        parse('[[kernel.rule]]\npattern = "SMU fail"\nkind = "smu_error"\n')
    assert parse('[[kernel.rule]]\npattern = "firmware gave up for good"\nkind = "smu_error"\n').kernel.rule


def test_a_config_rule_matches_only_after_a_drivers_prefix():
    rule = Rule("config_0", "firmware gave up for good", "smu_error", W, "any", "m", "gpu_fault")
    texts = ["firmware gave up for good", f"amdgpu {GPU}: firmware gave up for good",
             "mydrv: firmware gave up for good"]
    got = [[e.kind for e in events_of([KernelRecord(t, 1.0)], Classifier(extra_rules=(rule,)))] for t in texts]
    assert got == [[], ["smu_error"], ["smu_error"]]


# --- prefixes as the kernel and pasted reports print them ---------------------------------------------------------

def test_a_ras_report_with_its_event_id_is_read():
    """amdgpu/amdgpu_ras.c amdgpu_ras_event_log_print: dev_printk "{%llu}%pV" with "socket: %d, die: %d, %lld new
    uncorrectable hardware errors detected in %s block\\n"; ras/ (6.17+) puts a space after the id."""
    for text in (f"amdgpu {GPU}: amdgpu: {{7}}socket: 0, die: 1, 2 new uncorrectable hardware errors detected "
                 "in umc block",
                 f"amdgpu {GPU}: amdgpu: {{8}} socket: 0, die: 1, 2 new uncorrectable hardware errors detected "
                 "in umc block",
                 f"amdgpu {GPU}: amdgpu: {{9}}uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!"):
        record = parse_kmsg(f"{kmsg(text, 1, 1_000_000, 6)}\n SUBSYSTEM=pci\n DEVICE=+pci:{GPU}\n")
        [event] = events_of([record])
        assert (event.kind, event.severity, event.gpu, event.evidence["verified"]) == ("ras_error", C, GPU, True)


XID = "NVRM: Xid (PCI:ffff:fe:1f): 13, pid=4242, name=python3, Graphics Exception: ESR 0x4041b0=0x0"


def test_replay_reads_quoted_lines_and_a_live_file_does_not(tmp_path, capsys):
    text = f"> [ 5.000000] {XID}\n>> [ 6.000000] {XID.replace('13,', '31,')}\n"
    assert [(r["kind"], r["xid"]) for r in replay(tmp_path, text, capsys)] == [("xid", 13), ("xid", 31)]
    assert events_of(parse_lines(text.splitlines()).records) == []  # a followed file stays anchored


def test_replay_reads_an_indented_block(tmp_path, capsys):
    text = (f"    [ 5.000000] amdgpu {GPU}: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=2\n"
            f"    [ 5.000100] amdgpu {GPU}: amdgpu:  Process vllm pid 4242 thread vllm pid 4243\n"
            f"    Dec 05 08:00:01 box kernel: amdgpu {GPU}: amdgpu: GPU reset begin!\n")
    rows = replay(tmp_path, text, capsys)
    assert [(r["kind"], r["gpu"]) for r in rows] == [("ring_timeout", GPU), ("gpu_reset", GPU)]


def test_replay_joins_a_line_the_paste_wrapped(tmp_path, capsys):
    text = (f"[ 5.000000] amdgpu {GPU}: [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0\n"
            "timeout, signaled seq=228661, emitted seq=228662\n"
            f"[ 6.000000] amdgpu {GPU}: amdgpu: VRAM is lost due to GPU reset!\n"
            "[...]\n")
    rows = replay(tmp_path, text, capsys)
    assert [r["kind"] for r in rows] == ["ring_timeout", "gpu_reset"]
    assert rows[0]["line"].endswith("ring gfx_0.0.0 timeout, signaled seq=228661, emitted seq=228662")



def test_replay_reads_a_prefix_alone_whose_trailing_space_the_paste_dropped(tmp_path, capsys):
    # amdgpu/amdgpu.h pr_fmt "amdgpu: " with old powerplay's pm/powerplay/smumgr/smu7_smumgr.c
    # pr_info("\n failed to send message %x ret is %d \n"): the record's first line is the prefix and its space,
    # which a paste drops
    record = "amdgpu: \n failed to send message 16a ret is 0 "
    for form in (dmesg, console):
        text = "\n".join(line.rstrip() for line in form(3.5, record).split("\n")) + "\n"
        assert [r["kind"] for r in replay(tmp_path, text, capsys)] == ["smu_error"], form


def test_replay_reads_journal_lines_with_a_blank_host_field(tmp_path, capsys):
    text = (f"Jan 02 21:35:19  kernel: amdgpu {GPU}: amdgpu: GPU reset begin!\n"
            "Jan 02 21:35:19  (udev-worker)[17488]: devcd1: Process 'cat' failed with exit code 1.\n"
            "Jan 02 21:35:20  NVRM: Xid (PCI:ffff:fe:1f): 13, pid=4242, name=python3, Graphics Exception\n")
    rows = replay(tmp_path, text, capsys)  # the last: grep output, a date and the kernel's text (no host, no pid)
    assert [(r["kind"], r["gpu"]) for r in rows] == [("gpu_reset", GPU), ("xid", "ffff:fe:1f.0")]


@pytest.mark.parametrize("stamp", ["二 1月 27 18:45:00 2026", "mar. janv. 27 18:45:00 2026",
                                   "Tue Jan 27 18:45:00 2026"])
def test_dmesg_T_stamps_in_any_locale_are_read(tmp_path, capsys, stamp):
    """util-linux dmesg -T: strftime("%a %b %e %H:%M:%S %Y") in the reader's locale."""
    text = f"[{stamp}] amdgpu {GPU}: amdgpu: [gfxhub] page fault (src_id:0 ring:153 vmid:8 pasid:32770)\n"
    assert [(r["kind"], r["gpu"]) for r in replay(tmp_path, text, capsys)] == [("page_fault", GPU)]

# --- the missing rules, each from the driver's format ---------------------------------------------------------------

def _one(text: str, device: str | None = GPU) -> Event:
    meta = f"\n SUBSYSTEM=pci\n DEVICE=+pci:{device}\n" if device else ""
    [event] = events_of([parse_kmsg(kmsg(text, 1, 1_000_000, 3) + meta)])
    return event


def test_the_smu_not_answering_is_an_smu_error():
    # pm/swsmu/smu_cmn.c (7.x) "%s msg_reg: %x resp_reg: %x" with "SMU: No response"
    event = _one(f"amdgpu {GPU}: SMU: No response msg_reg: 6 resp_reg: 0")
    assert (event.kind, event.severity, event.gpu) == ("smu_error", W, GPU)


def test_the_smu_failing_to_start_is_critical():
    # pm/swsmu/amdgpu_smu.c smu_hw_init and smu_resume: "Failed to setup smc hw!\n"
    event = _one(f"amdgpu {GPU}: Failed to setup smc hw!")
    assert (event.kind, event.severity, event.evidence["rule"]) == ("smu_error", C, "amd_smu_resume_failed")


def test_old_powerplay_failing_to_send_a_message_in_each_form(tmp_path, capsys):
    # pm/powerplay/smumgr/smu7_smumgr.c (before 5.x): pr_info("\n failed to send message %x ret is %d \n"): the
    # record holds the newline after the prefix "amdgpu: [powerplay] "
    record = "amdgpu: [powerplay] \n failed to send message 16a ret is 0 "
    event = _one(record, device=None)
    assert (event.kind, event.severity) == ("smu_error", W)
    for form in (dmesg, console):
        assert [r["kind"] for r in replay(tmp_path, form(3.5, record) + "\n", capsys)] == ["smu_error"]



def test_the_old_drivers_gpu_at_address_has_fallen_off_the_bus():
    # the closed RM of drivers 295 to 390: "NVRM: GPU at %04x:%02x:%02x.%x has fallen off the bus.\n"
    event = _one(f"NVRM: GPU at {GPU} has fallen off the bus.", device=None)
    assert (event.kind, event.severity, event.gpu) == ("device_lost", C, GPU)

def test_nvidia_modeset_failing_to_query_the_display_channels():
    # src/nvidia-modeset/src/nvkms-evo1.c "Failed to query display engine channel state: 0x%08x:%d:%d:0x%08x"
    event = _one("nvidia-modeset: ERROR: GPU:0: Failed to query display engine channel state: 0x0000c57e:4:0:"
                 "0x0000000f", device=None)
    assert (event.kind, event.severity, event.evidence["rule"]) == ("ring_timeout", W, "nv_modeset_channel_state")


# --- context -----------------------------------------------------------------------------------------------------

def _hung(start: float) -> list[str]:
    """kernel/hung_task.c: a task blocked in the core kernel, no GPU frame in its trace."""
    return [f"[{start:12.6f}] INFO: task python3:4242 blocked for more than 120 seconds.",
            f"[{start:12.6f}]       Not tainted 6.8.0 #1",
            f"[{start:12.6f}] Call Trace:",
            f"[{start:12.6f}]  schedule+0x27/0xd0",
            f"[{start:12.6f}]  schedule_timeout+0x15d/0x170"]


def _classify(lines: list[str]) -> list[Event]:
    return events_of(parse_lines(lines).records)


def test_a_hung_task_right_after_an_xid_45_storm_is_kept():
    # nvidia (nvErrorLog) "Xid (PCI:%s): %u, pid=%d, name=%s, %s": Xid 45 is the cleanup of a process's channels
    storm = [f"[{100 + i / 10:12.6f}] NVRM: Xid (PCI:ffff:fe:1f): 45, pid=4242, name=python3, Ch 0000000{i}"
             for i in range(6)]
    [*xids, hung] = _classify(storm + _hung(292.0))
    assert {(e.kind, e.severity) for e in xids} == {("xid", I)}
    assert (hung.kind, hung.severity, hung.gpu) == ("kernel_oops", W, "ffff:fe:1f.0")
    assert _classify(_hung(292.0)) == []  # no GPU fault before it: not ours
    assert [e.kind for e in _classify(storm + _hung(900.0))] == ["xid"]  # long after: not ours either


def test_a_line_user_space_wrote_to_kmsg_is_no_context_for_a_hung_task():
    """Facility 1 (user space wrote it to /dev/kmsg): stored as unproven evidence, it makes no hung task the GPU's."""
    xid = parse_kmsg("11,1,100000000,-;NVRM: Xid (PCI:ffff:fe:1f): 45, pid=1, name=x, Ch 00000001")
    hung = [parse_kmsg(kmsg(t, 2 + i, 200_000_000 + i, 3)) for i, t in enumerate(
        ["INFO: task python3:4242 blocked for more than 120 seconds.", "Call Trace:", " schedule+0x27/0xd0"])]
    assert [e.kind for e in events_of([xid, *hung])] == ["xid"]


def _drm_warning(modules: str) -> list[str]:
    # lib/bug.c __warn "WARNING: CPU: %d PID: %d at %pS" (before 6.x "at %s:%d %pS"), print_modules
    return [f"[ 50.000000] {line}" for line in (
        "------------[ cut here ]------------",
        "WARNING: CPU: 3 PID: 1234 at drivers/gpu/drm/drm_atomic_helper.c:1682 "
        "drm_atomic_helper_wait_for_vblanks.part.0+0x25d/0x270 [drm_kms_helper]",
        f"Modules linked in: {modules}",
        "RIP: 0010:drm_atomic_helper_wait_for_vblanks.part.0+0x25d/0x270 [drm_kms_helper]",
        "Call Trace:",
        " drm_atomic_helper_commit_tail+0x5a/0x80 [drm_kms_helper]",
        " commit_tail+0xa6/0x1a0 [drm_kms_helper]",
        "---[ end trace 0000000000000000 ]---")]


def test_a_warning_in_the_drm_core_with_a_gpu_driver_loaded_is_kept():
    [event] = _classify(_drm_warning("snd_hda_intel amdgpu(OE+) amdxcp drm_kms_helper drm"))
    assert (event.kind, event.severity) == ("kernel_oops", W) and "amdgpu" in event.message
    assert _classify(_drm_warning("virtio_gpu drm_kms_helper drm")) == []  # no GPU driver of ours loaded


def test_a_mode2_reset_at_boot_is_info_and_after_a_fault_a_warning():
    # amdgpu/soc21.c, nv.c, soc15.c "MODE2 reset\n": amdgpu_device_init resets an APU as it starts it
    boot = _classify([f"[ 6.015646] amdgpu {GPU}: amdgpu: Trusted Memory Zone (TMZ) feature enabled",
                      f"[ 6.015652] amdgpu {GPU}: amdgpu: MODE2 reset"])
    assert [(e.kind, e.severity) for e in boot] == [("gpu_reset", I)]
    hang = _classify([f"[ 257.1] amdgpu {GPU}: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=2",
                      f"[ 257.2] amdgpu {GPU}: amdgpu: GPU reset begin!",
                      f"[ 257.3] amdgpu {GPU}: amdgpu: MODE2 reset"])
    # the reset begin and the MODE2 reset: one burst of a warning (a MODE2 reset at info would be an event apart)
    assert [(e.kind, e.severity, e.count) for e in hang if e.kind == "gpu_reset"] == [("gpu_reset", W, 2)]

