from kernel_helpers import classify_text, kinds

from gpuwarden.config.settings import parse
from gpuwarden.core.model import Severity
from gpuwarden.kernel.classifier import PROCESS_WAIT, Classifier
from gpuwarden.kernel.records import KernelRecord
from gpuwarden.kernel.watch import classifier_for
from paths import CORPUS

C, W, I = Severity.CRITICAL, Severity.WARNING, Severity.INFO


def one(line: str, classifier: Classifier | None = None):
    events = classify_text(line, classifier)
    assert len(events) == 1, events
    return events[0]


def test_storm_of_identical_lines_is_one_event_with_a_count():
    text = "\n".join(f"[100.{i:06d}] amdgpu 0000:03:00.0: amdgpu: sq_intr: error, detail 0x0, wave_id {i % 8}"
                     for i in range(48))
    event = one(text)
    assert (event.kind, event.count, event.gpu) == ("sq_intr", 48, "0000:03:00.0")


def test_lines_further_apart_than_the_storm_window_are_separate_events():
    text = "[100.0] amdgpu: sq_intr: error, a\n[101.0] amdgpu: sq_intr: error, b\n[110.0] amdgpu: sq_intr: error, c"
    assert [e.count for e in classify_text(text)] == [2, 1]


def test_a_live_line_does_not_join_a_burst_of_history_lines():
    """A storm that goes on across the daemon's start: its lines logged before are history (never acted on); the
    first live one joined their burst, and the storm was acted on only once max_burst (a minute) started the next."""
    c = Classifier(storm_window=2.0)
    c.live_since = 101.0
    text = "\n".join(f"[{t}] amdgpu 0000:03:00.0: amdgpu: sq_intr: error, {t}" for t in (100.0, 100.5, 101.0, 101.5))
    assert [(e.count, e.evidence["line"]) for e in classify_text(text, c)] == [
        (2, "amdgpu 0000:03:00.0: amdgpu: sq_intr: error, 100.0"),
        (2, "amdgpu 0000:03:00.0: amdgpu: sq_intr: error, 101.0")]


def test_a_line_of_this_boot_does_not_join_a_burst_of_an_earlier_one():
    """A journal's catch-up across a reboot: the fault that preceded it (late in the earlier boot, its stamps large)
    and the same fault soon after the start (small stamps): a negative gap read as within the storm window, and the
    live line joined the earlier boot's history burst."""
    c = Classifier(storm_window=2.0)
    c.live_since = 90.0
    line = "amdgpu 0000:03:00.0: amdgpu: sq_intr: error"
    records = [KernelRecord(text=line, timestamp=50_000.0, boot="earlier"),
               KernelRecord(text=line, timestamp=95.0, boot="this")]
    started = [b for _, bursts in c.feed_all(records, 1000.0) for b in bursts]
    assert [(b.boot, b.first) for b in started] == [("earlier", 50_000.0), ("this", 95.0)]


def test_bursts_split_per_gpu():
    text = "[1.0] amdgpu 0000:03:00.0: amdgpu: sq_intr: error\n[1.0] amdgpu 0000:83:00.0: amdgpu: sq_intr: error"
    assert {e.gpu for e in classify_text(text)} == {"0000:03:00.0", "0000:83:00.0"}


def test_flush_reports_grown_bursts_for_their_stored_count():
    c = Classifier(storm_window=2.0)
    first = c.feed(KernelRecord("amdgpu: sq_intr: error", 10.0), now=100.0)[0]
    assert c.feed(KernelRecord("amdgpu: sq_intr: error", 10.5), now=100.5) == []
    assert c.flush(101.0).grown == []  # still inside the window
    grown = c.flush(103.0).grown
    assert grown == [first] and first.count == 2


def test_a_burst_closed_by_the_next_line_is_reported_grown_too():
    """A flood's log time runs ahead of the reader's clock (50,000 lines a second, a thousand a log second): a burst
    that reaches max_burst, or a line past the storm window in log time, starts the next burst before flush's clock
    would close the first. Its count must still reach the store: once dropped, 8 of a flood's 9 storms were
    stored as x1."""
    c = Classifier(storm_window=2.0, max_burst=60.0)
    rows, now = {}, 100.0

    def stored(bursts, flushed):
        for burst in bursts + flushed.new:
            burst.ref = len(rows)
            rows[burst.ref] = burst.event.count  # stored as it was recorded: one line
        for burst in flushed.grown:
            rows[burst.ref] = burst.final.count

    for batch in range(50):  # 2,000 lines a batch, 2 log seconds of them, 0.04 s apart on the reader's clock
        bursts = [b for i in range(batch * 2000, (batch + 1) * 2000)
                  for b in c.feed(KernelRecord("amdgpu: sq_intr: error", i / 1000), now)]
        stored(bursts, c.flush(now))
        now += 0.04
    stored([], c.flush(now + 10.0))
    assert sum(rows.values()) == 100_000 and len(rows) == 2
    # past the storm window in log time while the reader's clock saw no gap: the next line starts a new burst
    c = Classifier(storm_window=2.0)
    first = c.feed(KernelRecord("amdgpu: sq_intr: error", 10.0), now=100.0)[0]
    c.feed(KernelRecord("amdgpu: sq_intr: error", 11.0), now=100.0)
    assert c.feed(KernelRecord("amdgpu: sq_intr: error", 20.0), now=100.1)
    assert c.flush(100.2).grown == [first] and first.count == 2


def test_xid_numbers_inside_the_text_are_not_new_xids():
    event = one("NVRM: Xid (PCI:0000:41:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
                "(GPU Reset Required), caused by previous Xid 149")
    assert (event.kind, event.evidence["xid"], event.gpu, event.severity) == ("xid", 154, "0000:41:00.0", C)


def test_xid_short_pci_form_and_nonzero_domain():
    assert one("NVRM: Xid (PCI:0001:3b:00): 13, pid=1, name=x, Graphics Exception").gpu == "0001:3b:00.0"


def test_a_lone_xid_79_also_means_the_gpu_is_lost():
    xid, lost = classify_text("NVRM: Xid (PCI:0001:3b:00): 79, pid=1, GPU has fallen off the bus.")
    assert (xid.kind, xid.evidence["xid"], xid.gpu) == ("xid", 79, "0001:3b:00.0")
    assert (lost.kind, lost.severity, lost.gpu) == ("device_lost", C, "0001:3b:00.0")


def test_unknown_xid_is_a_warning():
    assert one("NVRM: Xid (PCI:0000:01:00): 9999, something new").severity == W


def test_config_overrides_xid_and_kind_severity_and_adds_rules():
    cfg = parse('[kernel.xid]\n"13" = "critical"\n[kernel.severity]\npage_fault = "critical"\n'
                '[[kernel.rule]]\npattern = "mydrv: gave up for good"\nkind = "reset_failed"\nseverity = "critical"\n'
                'vendor = "amd"\n').kernel
    assert one("NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception", classifier_for(cfg)).severity == C
    assert one("amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0)", classifier_for(cfg)).severity == C
    user = one("amdgpu 0000:03:00.0: mydrv: gave up for good", classifier_for(cfg))
    assert (user.kind, user.severity, user.gpu) == ("reset_failed", C, "0000:03:00.0")


def test_failed_recovery_and_device_lost_are_critical():
    text = ("[5.0] amdgpu 0000:03:00.0: amdgpu: device lost from bus!\n"
            "[9.0] amdgpu 0000:03:00.0: amdgpu: GPU Recovery Failed: -19\n")
    events = classify_text(text)
    assert [(e.kind, e.severity) for e in events] == [("device_lost", C), ("reset_failed", C)]


def test_failed_ring_reset_then_successful_full_reset_is_not_a_failed_recovery():
    text = ("[1.0] amdgpu 0000:0c:00.0: Ring gfx_0.0.0 reset failed\n"
            "[1.1] amdgpu 0000:0c:00.0: GPU reset begin!. Source:  1\n"
            "[3.0] amdgpu 0000:0c:00.0: GPU reset succeeded, trying to resume\n")
    assert "reset_failed" not in kinds(classify_text(text))


def test_ring_timeouts_on_every_ring_type():
    for ring in ("gfx_0.0.0", "comp_1.0.0", "sdma0", "vcn_dec_0", "vce0", "kiq_2.1.0", "mes_kiq_3.1.0"):
        event = one(f"[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring {ring} timeout, signaled seq=1, emitted seq=2")
        assert event.kind == "ring_timeout", ring


def test_benign_ring_lines_are_not_timeouts():
    assert classify_text("amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 uses VM inv eng 0 on hub 0") == []


def test_aer_severities():
    assert one("pcieport 0000:00:01.1: AER: Correctable error message received from 0000:00:01.1").severity == I
    assert one("pcieport 0000:00:01.1: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=TL").severity == W
    fatal = one("pcieport 0000:00:01.1: AER: Uncorrected (Fatal) error received: 0000:01:00.0")
    assert (fatal.severity, fatal.gpu, fatal.evidence["pci"]) == (C, None, "0000:00:01.1")
    # A failed recovery alone names a port, not a GPU: it is a warning; with the GPU's driver unable to recover
    # (no error_detected callback) the GPU is lost.
    assert (one("pcieport 0000:00:01.1: AER: device recovery failed").severity) == W


def test_failed_aer_recovery_loses_the_gpu_whose_driver_cannot_recover():
    text = ("[1.0] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)\n"
            "[1.0] pcieport 0000:00:03.0: AER: device recovery failed\n")
    lost = [e for e in classify_text(text) if e.kind == "device_lost"]
    assert [(e.gpu, e.severity) for e in lost] == [("0000:03:00.0", C)]
    usb = ("[1.0] xhci_hcd 0000:97:00.0: AER: can't recover (no error_detected callback)\n"
           "[1.0] pcieport 0000:80:1b.4: AER: device recovery failed\n")
    assert {e.kind for e in classify_text(usb)} == {"pcie_aer"}


def test_reset_whose_own_ring_test_fails_is_a_failed_reset_in_either_order():
    kiq = "[drm:amdgpu_ring_test_helper [amdgpu]] *ERROR* ring kiq_2.1.0 test failed (-110)"
    after = (f"[1.0] amdgpu 0000:0a:00.0: amdgpu: GPU reset begin!\n[1.5] amdgpu 0000:0a:00.0: {kiq}\n"
             f"[1.6] amdgpu 0000:0a:00.0: {kiq}\n")
    before = f"[1.0] amdgpu 0000:1d:00.0: {kiq}\n[2.0] amdgpu 0000:1d:00.0: GPU BACO reset\n"
    for text, gpu in ((after, "0000:0a:00.0"), (before, "0000:1d:00.0")):
        failed = [e for e in classify_text(text) if e.kind == "reset_failed"]
        assert [(e.gpu, e.severity, e.evidence["runbook"]) for e in failed] == [(gpu, C, "device_lost")]
        assert len(failed[0].evidence["lines"]) == 2


def test_failed_ring_reset_falling_back_to_mode1_or_mode2_is_critical_but_not_to_baco():
    def worst(method):
        return max(e.severity for e in classify_text(
            "[1.0] amdgpu 0000:c5:00.0: amdgpu: Ring gfx_0.0.0 reset failed\n"
            "[1.1] amdgpu 0000:c5:00.0: amdgpu: GPU reset begin!\n"
            f"[2.0] amdgpu 0000:c5:00.0: amdgpu: {method} reset\n"))
    assert (worst("MODE2"), worst("MODE1"), worst("BACO")) == (C, C, W)


def test_xid_caused_by_a_known_xid_carries_it_and_its_severity():
    event = one("NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=python3, Ch 00000001 caused by previous Xid 149")
    assert (event.evidence["xid"], event.evidence["caused_by"], event.severity) == (45, 149, W)
    assert one("NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=python3, Ch 00000001").severity == I


def test_ghes_pcie_record_takes_the_severity_of_its_own_record():
    text = ("{7}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1\n"
            "{7}[Hardware Error]: event severity: recoverable\n"
            "{8}[Hardware Error]: event severity: corrected\n"
            "{7}[Hardware Error]:   section_type: PCIe error\n")
    assert [(e.kind, e.severity) for e in classify_text(text)] == [("pcie_aer", W)]


def test_driver_stack_dump_is_not_an_oops_but_a_gsp_report_when_it_is_the_gsp_poll():
    gsp = ("[5.0] Call Trace:\n[5.0]  dump_stack_lvl+0x76/0xa0\n[5.0]  os_dump_stack+0xe/0x20 [nvidia]\n"
           "[5.0]  _kgspRpcRecvPoll+0x650/0x820 [nvidia]\n")
    assert [(e.kind, e.severity) for e in classify_text(gsp)] == [("gsp_error", C)]
    debug = "[5.0] Call Trace:\n[5.0]  dump_stack_lvl+0x48/0x66\n[5.0]  amdgpu_do_asic_reset+0x28/0x45c [amdgpu]\n"
    assert classify_text(debug) == []


def test_aer_on_the_gpu_itself_names_the_gpu():
    assert one("amdgpu 0000:03:00.0: PCIe Bus Error: severity=Uncorrected (Fatal)").gpu == "0000:03:00.0"


def test_oops_outside_gpu_drivers_is_only_a_warning_and_warnings_without_gpu_are_ignored():
    oops = "\n".join(["BUG: kernel NULL pointer dereference, address: 0000000000000008",
                      "RIP: 0010:ext4_write+0x12/0x60 [ext4]", " vfs_write+0x2a5/0x480"])
    assert [(e.kind, e.severity) for e in classify_text(oops)] == [("kernel_oops", W)]
    warn = "WARNING: CPU: 3 PID: 1 at fs/ext4/inode.c:1 ext4_x+0x1/0x2\n ext4_x+0x1/0x2 [ext4]"
    assert classify_text(warn) == []


def test_oops_in_a_gpu_driver_is_critical():
    oops = "\n".join(["[10.0] general protection fault, probably for non-canonical address 0xdead",
                      "[10.0] RIP: 0010:amdgpu_vm_update+0x12/0x60 [amdgpu]", "[10.0]  drm_ioctl+0x1/0x2 [drm]",
                      "[10.0] ---[ end trace 0000000000000000 ]---"])
    event = one(oops)
    assert (event.kind, event.severity, event.evidence["modules"]) == ("kernel_oops", C, ["amdgpu"])


def test_a_line_that_reads_as_a_frame_and_a_header_is_the_header_in_an_open_report():
    """An open report's frames take a short way in (classifier._FRAME_ONLY): a line that is a frame and also a
    `word: BUG: ` header still raises the report to critical, and a report that ends at its end line is closed."""
    warn = ["[10.0] ------------[ cut here ]------------", "[10.0]  amdgpu_job_run+0x1/0x2 [amdgpu]"]
    header = "[10.0] amdgpu_fence+0x1/0x2: BUG: unable to handle page fault"
    end = "[10.0] ---[ end trace 0000000000000000 ]---"
    assert [(e.kind, e.severity) for e in classify_text("\n".join([*warn, end]))] == [("kernel_oops", W)]
    event = one("\n".join([*warn, header, "[10.0]  drm_ioctl+0x1/0x2 [drm]", end]))
    assert (event.kind, event.severity, event.evidence["modules"]) == ("kernel_oops", C, ["amdgpu"])
    assert event.evidence["lines"][-1] == end[len("[10.0] "):]  # closed by its end line, not by a flush


def test_a_gpu_fault_printed_while_another_drivers_warning_report_is_open_is_not_lost_in_it():
    """A benign WARNING's report stays open for its frames (up to 120 lines, 2 s); a fault line of a GPU printed
    meanwhile (another CPU) is a fault of its own, not a line of that report: it once vanished with it."""
    warn = ["[10.0] WARNING: CPU: 3 PID: 1 at fs/ext4/inode.c:1 ext4_x+0x1/0x2", "[10.0]  ext4_x+0x1/0x2 [ext4]"]
    fault = "[10.0] amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=2"
    rest = ["[10.0]  vfs_write+0x2a5/0x480", "[10.0] ---[ end trace 0000000000000000 ]---"]
    events = classify_text("\n".join([*warn, fault, *rest]))
    assert [(e.kind, e.gpu) for e in events] == [("ring_timeout", "0000:03:00.0")]
    xid = "[10.0] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert kinds(classify_text("\n".join([*warn, xid, *rest]))) == {"xid:79", "device_lost"}


def test_reset_after_wave_errors_on_the_same_gpu_is_escalated():
    text = ("[1.0] amdgpu 0000:03:00.0: amdgpu: sq_intr: error, detail 0x0\n"
            "[30.0] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n"
            "[31.0] amdgpu 0000:83:00.0: amdgpu: GPU reset begin!\n")
    resets = [e for e in classify_text(text) if e.kind == "gpu_reset"]
    assert {(e.gpu, e.severity) for e in resets} == {("0000:03:00.0", C), ("0000:83:00.0", W)}


def test_journal_device_field_names_the_gpu_for_gpu_rules_only():
    c = Classifier()
    assert c.feed(KernelRecord("[drm] ring gfx_0.0.0 timeout", 1.0, device="0000:03:00.0"), 0) == []  # it waits
    aer = "pcieport 0000:00:01.1: AER: Uncorrected (Fatal) error received"
    gpu, port = (b.event for b in c.feed(KernelRecord(aer, 1.0, device="0000:00:01.1"), 0))  # not a process line
    assert gpu.gpu == "0000:03:00.0"
    assert port.gpu is None and port.evidence["pci"] == "0000:00:01.1"


def test_nvidia_multiline_fallen_off_the_bus():
    text = ("[1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
            "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
            "               NVRM: fallen off the bus and is not responding to commands.\n")
    event = one(text)
    assert (event.kind, event.gpu, event.severity) == ("device_lost", "0000:b3:00.0", C)


def test_gsp_timeout_and_rm_init_failure():
    assert one("NVRM: GPU4 GSP: Timeout after 6s of waiting for RPC response from GPU4 GSP!").kind == "gsp_error"
    assert one("NVRM: RmInitAdapter failed! (0x22:0x56:884)").kind == "gpu_missing"


def test_a_function_offset_in_an_ordinary_message_does_not_open_an_oops():
    line = ("[3540.4] amdgpu 0000:03:00.0: PM: pci_pm_suspend_noirq(): amdgpu_pmops_suspend_noirq+0x0/0x40 [amdgpu]"
            " returns -22")
    assert "kernel_oops" not in kinds(classify_text(line))


# --- the process a fault belongs to -------------------------------------------------------------------------

def _corpus(name: str) -> str:
    return (CORPUS / "kernel" / name).read_text()


def test_a_ring_timeout_takes_the_process_of_the_information_line_after_it():
    events = classify_text(_corpus("012-amd-ring-gfx-timeout-baco-reset2-succeeded.log"))
    timeout = next(e for e in events if e.kind == "ring_timeout")
    assert timeout.evidence["process"] == {"pid": 3503, "name": "cosmic-comp"}
    # the kernel's own job (no task): pid 0, the GPU's own hang
    sdma = next(e for e in classify_text(_corpus("116-amd-sdma0-timeout-mode2-reset-resume-no-stamps.log"))
                if e.kind == "ring_timeout")
    assert sdma.evidence["process"] == {"pid": 0, "name": ""}


def test_a_page_fault_takes_its_process_from_its_own_line_or_the_next_one():
    inline = [e for e in classify_text(_corpus("004-amd-gfxhub-page-fault-mi210.log")) if e.kind == "page_fault"]
    # the log starts inside an earlier report: its status lines name no process
    assert [e.evidence.get("process") for e in inline] == [None, {"pid": 2919831, "name": "pt_main_thread"}]
    split = [e for e in classify_text(_corpus("143-amd-gfx1151-no-retry-fault-process-on-own-line.log"))
             if e.kind == "page_fault"]
    # the status lines of the report name no process: they join its burst, they are no fault of their own
    assert [(e.evidence["process"]["pid"], e.evidence["rule"]) for e in split] == [(12924, "amd_page_fault")]
    assert split[0].count > 1
    # the line that names the process is in the evidence beside the fault's own (the alert shows both)
    fault_line, process_line = split[0].evidence["lines"]
    assert fault_line == split[0].evidence["line"] and "pid 12924" in process_line


def test_faults_of_two_processes_in_one_burst_are_two_events():
    """An attacker's faults must not swallow the engine's own fault into their burst, nor the other way."""
    line = "[5.{:03d}] amdgpu ffff:fe:1f.7: amdgpu: [gfxhub0] no-retry page fault (src_id:0 ring:24 vmid:{} " \
           "pasid:{}, for process {} pid {} thread {} pid {})"
    text = "\n".join((line.format(1, 3, 32769, "evil", 666, "evil", 666),
                      "[5.002] amdgpu ffff:fe:1f.7: amdgpu: VM_L2_PROTECTION_FAULT_STATUS:0x00301031",
                      line.format(3, 4, 32770, "vllm", 4242, "vllm", 4243),
                      line.format(4, 3, 32769, "evil", 666, "evil", 666)))
    events = [e for e in classify_text(text) if e.kind == "page_fault"]
    assert [(e.evidence["process"]["pid"], e.count) for e in events] == [(666, 3), (4242, 1)]


def test_a_process_line_of_another_gpu_is_not_the_faults():
    c = Classifier()
    assert c.feed(KernelRecord("amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=3",
                               1.0), 0) == []
    other = "amdgpu ffff:fe:1f.6: amdgpu:  Process vllm pid 4242 thread vllm pid 4243"
    [timeout] = [b.event for b in c.feed(KernelRecord(other, 1.0), 0)]
    assert "process" not in timeout.evidence and timeout.gpu == "ffff:fe:1f.7"


def test_a_fault_line_waits_for_its_process_line_across_reads_and_not_longer():
    timeout = KernelRecord("amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=3", 1.0)
    process = KernelRecord("amdgpu ffff:fe:1f.7: amdgpu:  Process vllm pid 4242 thread vllm pid 4243", 1.0)
    c = Classifier()
    assert c.feed(timeout, 100.0) == [] and c.flush(100.0).new == []  # the read ended between the two lines
    [event] = [b.event for b in c.feed(process, 100.1)]
    assert event.evidence["process"] == {"pid": 4242, "name": "vllm"}
    c = Classifier()
    c.feed(timeout, 100.0)
    assert c.flush(100.0 + PROCESS_WAIT / 2).new == []
    [late] = [b.event for b in c.flush(100.0 + PROCESS_WAIT * 2).new]  # never lost: released without a process
    assert late.kind == "ring_timeout" and "process" not in late.evidence


def test_an_xid_names_its_process_only_when_it_is_an_applications_own():
    events = classify_text(_corpus("020-nv-xid-13-and-43-sm-exceptions.log"))
    by_xid = {e.evidence["xid"]: e for e in events}
    assert by_xid[43].evidence["process"] == {"pid": 2924364, "name": "pt_main_thread"}
    assert by_xid[13].evidence["process"] == {"pid": 0, "name": "<unknown>"}
    gsp = [e for e in classify_text(_corpus("019-nv-xid-119-gsp-rpc-timeout.log")) if e.kind == "xid"]
    # the GSP stopped answering while nvidia-smi asked it something: the GPU's fault, not nvidia-smi's
    assert gsp and all("process" not in e.evidence for e in gsp)
    assert gsp[0].evidence["context_process"] == {"pid": 2024380, "name": "nvidia-smi"}


def test_an_xid_after_the_gsp_stopped_answering_is_critical():
    """Severity from the combination: Xid 109 alone is a warning (a context switch timeout); after the GSP's
    heartbeat timed out on that GPU it is the GPU that needs a reset."""
    gsp = "[100.0] NVRM: GPU 0000:41:00.0: _kgspRpcRecvPoll: GSP RM heartbeat timed out\n"
    xid = "[101.0] NVRM: Xid (PCI:0000:41:00): 109, pid=77, name=python3, Ch 00000008, errorString CTX SWITCH\n"
    alone = classify_text(xid)
    assert [(e.evidence["xid"], e.severity) for e in alone if e.kind == "xid"] == [(109, W)]
    after = next(e for e in classify_text(gsp + xid) if e.kind == "xid")
    assert after.severity == C and "GSP" in after.evidence["escalated"]


def test_a_line_acts_only_when_the_kernels_own_record_proves_it():
    """/dev/kmsg records as the kernel hands them out: facility 0 and dev_printk's device metadata prove a driver's
    line; user space's facility, or a device prefix without that device's metadata, make it evidence only, at most
    a warning; a text log proves nothing (its severity kept)."""
    from gpuwarden.kernel.records import parse_kmsg

    line = "amdgpu ffff:fe:1f.7: amdgpu: device lost from bus!"
    meta = "\n SUBSYSTEM=pci\n DEVICE=+pci:ffff:fe:1f.7"

    def judged(raw):
        [event] = [b.event for b in Classifier().feed(parse_kmsg(raw), 1.0)]
        return event.severity, event.evidence["verified"], event.evidence.get("unverified", "")

    assert judged(f"2,7,100,-;{line}{meta}") == (C, True, "")
    severity, verified, why = judged(f"10,7,100,-;{line}{meta}")  # <10>: LOG_USER, from user space
    assert (severity, verified) == (W, False) and "user space (facility 1)" in why
    severity, verified, why = judged(f"2,7,100,-;{line}")  # no metadata: no dev_printk printed it
    assert (severity, verified) == (W, False) and "no kernel device metadata" in why
    severity, verified, why = judged(f"2,7,100,-;{line}\n SUBSYSTEM=pci\n DEVICE=+pci:ffff:fe:1f.6")
    assert (severity, verified) == (W, False)  # another device's metadata
    nvrm = "NVRM: Xid (PCI:ffff:fe:1f): 79, pid=1, name=x, GPU has fallen off the bus."
    assert {(e.kind, e.severity, e.evidence["verified"]) for e in
            (b.event for b in Classifier().feed(parse_kmsg(f"2,8,100,-;{nvrm}"), 1.0))} == {
        ("xid", C, True), ("device_lost", C, True)}  # NVRM prints without a device: facility and prefix prove it
    [text] = classify_text(line)
    assert (text.severity, text.evidence["verified"]) == (C, False)


def test_a_process_line_written_from_user_space_does_not_name_a_drivers_faults_process():
    """Right after a real ring timeout, a line written to /dev/kmsg that spells the process line would pin the
    fault on a process of the writer's choosing (an engine, to be killed): it is not taken."""
    from gpuwarden.kernel.records import parse_kmsg

    meta = "\n SUBSYSTEM=pci\n DEVICE=+pci:ffff:fe:1f.7"
    fault = parse_kmsg(f"3,1,100,-;amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1{meta}")
    forged = parse_kmsg(f"11,2,100,-;amdgpu ffff:fe:1f.7: amdgpu:  Process vllm pid 4242 thread vllm pid 4242{meta}")
    real = parse_kmsg(f"3,2,100,-;amdgpu ffff:fe:1f.7: amdgpu:  Process vllm pid 4242 thread vllm pid 4242{meta}")
    c = Classifier()
    assert c.feed(fault, 1.0) == []
    [event] = [b.event for b in c.feed(forged, 1.0)]
    assert event.evidence["verified"] and "process" not in event.evidence
    c = Classifier()
    c.feed(fault, 1.0)
    [event] = [b.event for b in c.feed(real, 1.0)]
    assert event.evidence["process"] == {"pid": 4242, "name": "vllm"}


class _Counted:
    """A compiled expression that counts its matches (the classifier's own, wrapped: nothing is mocked)."""

    def __init__(self, regex) -> None:
        self.regex, self.calls = regex, 0

    def match(self, text: str):
        self.calls += 1
        return self.regex.match(text)


def test_a_storm_line_that_joins_its_open_burst_is_counted_without_matching_the_rules_again():
    """Issue 40: a flood of fault lines cost a core because every line was judged in full (~20 expressions). A line
    whose text was judged before, while its burst is open, is counted from what its text decided: the rules'
    expression runs once per distinct text, and the events are those of judging each line in full."""
    lines = [f"amdgpu ffff:fe:1f.7: amdgpu: sq_intr: error, detail 0x00000000, type 1, wave_id {i % 5}"
             for i in range(200)] + [f"NVRM: Xid (PCI:ffff:fe:1f): 13, pid=4242, name=python3, GPC {i % 3}"
                                     for i in range(200)]
    records = [KernelRecord(text, 100.0 + i * 0.001) for i, text in enumerate(lines)]
    counted = Classifier()
    counted._combined = _Counted(counted._combined)
    started = [b for _, bursts in counted.feed_all(records, 1000.0) for b in bursts]
    assert counted._combined.calls == 5 + 3
    assert [(b.event.kind, b.count, b.last) for b in started] == [("sq_intr", 200, records[199].timestamp),
                                                                   ("xid", 200, records[399].timestamp)]
    # each burst's evidence is its first line's, as when every line was judged in full
    assert [b.event.evidence["line"] for b in started] == [lines[0], lines[200]]
    assert started[1].event.evidence["process"] == {"pid": 4242, "name": "python3"}


def test_the_cheaper_automaton_before_the_gate_finds_a_piece_of_every_gate_literal():
    """A driver line the pre-gate finds nothing in is refused without the gate: so every literal of the gate must
    hold one of the pre-gate's words, or a rule's line would be refused. Its words start with fewer characters than
    the gate's (what makes it cheaper per character)."""
    c = Classifier()
    gate, pregate = list(c._gate.keys()), list(c._pregate.keys())
    assert len(gate) > 100 and all(any(piece in word for piece in pregate) for word in gate)
    assert len({w[0] for w in pregate}) < len({w[0] for w in gate}) / 2
