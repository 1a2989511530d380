"""One kernel log message, whatever source it came from, and the /dev/kmsg record format."""

from __future__ import annotations

import re

from gpuwarden.core.model import normalize_pci
from gpuwarden.core.plain import plain

KMSG = "/dev/kmsg"


@plain
class KernelRecord:
    """One kernel log record, from whichever source."""

    text: str
    timestamp: float | None = None  # seconds on the source's clock (monotonic or wall); None if unknown
    device: str | None = None  # normalised PCI address from the record's device fields
    cursor: str | None = None  # where to resume after this record (journal cursor, or kmsg position)
    seq: int | None = None  # /dev/kmsg sequence number
    boot: str | None = None  # boot id of a journal entry or a positioned kmsg record: its timestamp counts from it
    wall: float | None = None  # when it was logged on the wall clock, where the source says (a journal entry)
    # The kernel's own metadata, where the format carries it (a /dev/kmsg record, a journal entry): whether it
    # does (`metadata`), the syslog facility (0: the kernel; user space writing /dev/kmsg gets 1 or more) and the
    # device's subsystem (`pci` with `device` for a line printed by dev_printk). kernel/classifier.unverified().
    metadata: bool = False
    facility: int | None = None
    subsystem: str | None = None


class MalformedRecord(ValueError):
    pass


_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def parse_kmsg(raw: str, boot: str | None = None) -> KernelRecord:
    """A /dev/kmsg record: `prio,seq,usec,flags[,more];text` plus ` KEY=value` dictionary lines; with `boot`
    (this boot's id), its position `kmsg:BOOT:SEQ:USEC` as its cursor.

    Unknown header fields (caller=, cpu=, ...) are ignored, as the ABI asks.
    """
    header, sep, rest = raw.partition(";")
    fields = header.split(",")
    if not sep or len(fields) < 4 or not (fields[0].isdigit() and fields[1].isdigit() and fields[2].isdigit()):
        raise MalformedRecord(raw[:200])
    text, *dictionary = rest.rstrip("\n").split("\n")
    device = subsystem = None
    for line in dictionary:
        key, _, value = line.strip().partition("=")
        if key == "DEVICE":
            device = pci_from_device_field(value)
        elif key == "SUBSYSTEM":
            subsystem = value
    if "\\x" in text:
        text = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
    seq, stamp = int(fields[1]), int(fields[2]) / 1e6
    return KernelRecord(text=text, timestamp=stamp, device=device, seq=seq, metadata=True,
                        facility=int(fields[0]) >> 3, subsystem=subsystem,
                        cursor=f"kmsg:{boot}:{seq}:{stamp:.6f}" if boot else None, boot=boot)


def pci_from_device_field(value: str) -> str | None:
    """`+pci:0000:03:00.0` (kmsg DEVICE=, journal _KERNEL_DEVICE) or a bare BDF (_UDEV_SYSNAME)."""
    value = value.removeprefix("+pci:")
    try:
        return normalize_pci(value) if value.count(":") >= 1 and "." in value else None
    except ValueError:
        return None
