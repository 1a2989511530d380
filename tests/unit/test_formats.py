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
