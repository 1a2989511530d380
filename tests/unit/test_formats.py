import pytest

from gpuwarden.kernel.formats import parse_lines
from gpuwarden.kernel.records import MalformedRecord, parse_kmsg

MSG = "amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=2"


@pytest.mark.parametrize("line", [
    f"[  942.180230] {MSG}",  # dmesg
    f"[Tue Dec  9 17:04:31 2025] {MSG}",  # dmesg -T
    f"2025-01-21T04:41:44,283302+00:00 {MSG}",  # dmesg --time-format iso
    f"kern  :err   : [  942.180230] {MSG}",  # dmesg -x
    f"[  +0.000316] {MSG}",  # dmesg -H
    f"Jul 24 12:26:16 macross kernel: {MSG}",  # syslog / journalctl short
    f"maj 08 19:27:35 RX-78-FPC kernel: {MSG}",  # another language's month
    f"Aug 09 11:36:30.370347 kernel: {MSG}",  # short-precise without host
    f"2024-09-10T09:37:08+0200 host kernel: {MSG}",  # journalctl -o short-iso
    f"2024-09-10T09:37:08.123456+02:00 host kernel: {MSG}",  # short-iso-precise
    f'{{"MESSAGE": "{MSG}", "_TRANSPORT": "kernel", "__MONOTONIC_TIMESTAMP": "942180230"}}',  # -o json
    f"3,1234,942180230,-;{MSG}",  # raw /dev/kmsg
    MSG,  # no timestamp at all
    f"/var/log/syslog:Jul 24 12:26:16 macross kernel: {MSG}",  # grep -r over /var/log
    f"/var/log/kern.log.1:1234:Jul 24 12:26:16 macross kernel: [  942.180230] {MSG}",  # grep -rn
])
def test_every_format_yields_the_message(line):
    result = parse_lines([line])
    assert [r.text for r in result.records] == [MSG]
    assert result.malformed == 0


def test_timestamps():
    stamps = [r.timestamp for r in parse_lines([
        "[  10.5] a", "[  +0.5] b", "kern  :warn  : 2025-01-21T04:41:44,500000+00:00 c"]).records]
    assert stamps[:2] == [10.5, 11.0]
    assert stamps[2] == pytest.approx(1737434504.5)


def test_lines_of_other_programs_are_skipped():
    result = parse_lines(["May 26 18:09:55 fedora kwin_wayland[2209]: kwin_scene_opengl: A graphics reset",
                          "May 26 18:09:55 fedora kernel: amdgpu: Failed to quiesce KFD"])
    assert [r.text for r in result.records] == ["amdgpu: Failed to quiesce KFD"]
    assert result.skipped == 1


def test_json_byte_array_message_device_and_cursor():
    line = ('{"MESSAGE": [104, 105], "_TRANSPORT": "kernel", "_KERNEL_DEVICE": "+pci:0000:03:00.0", '
            '"__CURSOR": "s=1;i=2"}')
    record = parse_lines([line]).records[0]
    assert (record.text, record.device, record.cursor) == ("hi", "0000:03:00.0", "s=1;i=2")


def test_malformed_json_is_counted_and_skipped():
    result = parse_lines(['{"MESSAGE": "broken', "[1.0] next line"])
    assert result.malformed == 1
    assert [r.text for r in result.records] == ["next line"]


def test_kmsg_dictionary_and_escapes():
    record = parse_kmsg("3,77,5000000,-,caller=T12;amdgpu 0000:03:00.0: a\\x5cb\n"
                        " SUBSYSTEM=pci\n DEVICE=+pci:0000:03:00.0\n")
    assert (record.text, record.timestamp, record.device) == ("amdgpu 0000:03:00.0: a\\b", 5.0, "0000:03:00.0")
    with pytest.raises(MalformedRecord):
        parse_kmsg("not a record")


def test_kmsg_dictionary_lines_in_saved_files():
    result = parse_lines(["6,1,100,-;[drm] message", " SUBSYSTEM=pci", " DEVICE=+pci:0000:0a:00.0"])
    assert [(r.text, r.device) for r in result.records] == [("[drm] message", "0000:0a:00.0")]


def test_indented_lines_continue_the_previous_message():
    result = parse_lines(["[1.0] NVRM: The NVIDIA GPU 0000:b3:00.0", "      NVRM: fallen off the bus."])
    assert [r.text for r in result.records] == ["NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: fallen off the bus."]


def test_newest_first_output_with_reboot_markers_is_put_back_in_order():
    lines = ["Jul 24 12:26:19 h kernel: third", "Jul 24 12:26:17 h kernel: second", "-- Reboot --",
             "Jul 24 12:26:16 h kernel: first"]
    assert [r.text for r in parse_lines(lines).records] == ["first", "second", "third"]


def test_printk_level_prefixes_caller_ids_and_inner_kernel_stamps():
    records = parse_lines([
        "<4> <1>BUG: unable to handle kernel NULL pointer dereference at virtual address 00000014",
        "<4>[   12.500000] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!",
        "[   36.117975][  T291] pcieport 0000:00:00.0: AER: Multiple Correctable error message received",
        "Aug 10 17:25:59 haru kernel: [10409.645057] BUG: kernel NULL pointer dereference, address: 00000000000002b4",
        "kernel: [  279.726475] [drm] IP block:gfx_v8_0 is hung!",
        "kernel: NVRM: GPU at PCI:0000:01:00: GPU-d4ccf738",
    ]).records
    assert [r.text[:12] for r in records] == ["BUG: unable ", "amdgpu 0000:", "pcieport 000", "BUG: kernel ",
                                               "[drm] IP blo", "NVRM: GPU at"]
    assert [r.timestamp for r in records] == [None, 12.5, 36.117975, 10409.645057, 279.726475, None]


def test_grep_output_with_a_date_but_no_host_is_kernel_text_and_other_programs_are_not():
    records = parse_lines([
        "Sep 18 20:07:01 NVRM: Xid (PCI:0000:02:00): 109, pid=8494, name=RenderThread, CTX SWITCH TIMEOUT",
        "Mar 24 11:53:48 pandemonium nvidia-persistenced: Started (1640)",
        "Feb 15 12:31:57.623047 systemd-modules-load[1054]: Failed to insert module 'nvidia_uvm'",
    ]).records
    assert [r.text[:9] for r in records] == ["NVRM: Xid"]


def test_talos_console_format():
    (record,) = parse_lines(["192.168.11.119: kern: warning: [2026-04-22T21:27:51.291660856Z]: NVRM: "
                             "kflcnCoreDumpNondestructive_IMPL: TRACE: 08 = 0x0000000004d4b1a0"]).records
    assert record.text.startswith("NVRM: kflcnCoreDump") and record.timestamp == 1776893271.29166


def test_kmsg_records_carry_the_kernels_own_metadata():
    """Facility (user space writing /dev/kmsg gets 1 or more) and the device dev_printk adds."""
    kernel = parse_kmsg(f"3,1,2,-;{MSG}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:03:00.0")
    assert (kernel.metadata, kernel.facility, kernel.subsystem, kernel.device) == (True, 0, "pci", "0000:03:00.0")
    assert parse_kmsg(f"11,1,2,-;{MSG}").facility == 1  # <11>: LOG_USER, error
    [saved] = parse_lines([f"3,1,2,-;{MSG}", " SUBSYSTEM=pci", " DEVICE=+pci:0000:03:00.0"]).records
    assert (saved.metadata, saved.facility, saved.subsystem, saved.device) == (True, 0, "pci", "0000:03:00.0")
    [text] = parse_lines([f"Jul 24 12:26:16 macross kernel: {MSG}"]).records
    assert not text.metadata and text.facility is None
