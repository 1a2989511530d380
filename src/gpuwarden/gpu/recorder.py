"""The flight recorder: the last `window` seconds of samples per GPU, in memory, for incident reports.

A GpuSample object costs ~830 B (its slots, a float object per reading, its dicts); 8 GPUs over a 900 s window
were 6 MB, most of the daemon's growth after its start. So the ring keeps the last sample whole (`latest`, read
every round) and each sample packed as a delta from the one before it: which values changed (a bit mask), the
changed floats as raw doubles, and any other changed value (None, an int, a string, a dict...) by reference, so
what equals the previous sample's is shared, not copied: ~115 B a sample. `history` (an incident, rare) rebuilds
the samples, equal field by field to what was added; `frozen` is a copy to rebuild them from off the event loop."""

from __future__ import annotations

import struct
from array import array
from collections import deque
from dataclasses import fields
from itertools import count
from operator import attrgetter

from gpuwarden.core.model import GpuSample

# a sample as a flat row: its fields but gpu, time and temperatures (in the order GpuSample takes them, which has
# gpu first, then time, then temperatures), then the temperature sensors' names (one tuple), then their values
_FIELDS = [f.name for f in fields(GpuSample)]
_NAMES = tuple(name for name in _FIELDS if name not in ("gpu", "time", "temperatures"))
_row = attrgetter(*_NAMES)
_TIME, _TEMPERATURES = _FIELDS.index("time") - 1, _FIELDS.index("temperatures") - 2  # where they go back in
_SENSORS = len(_NAMES)  # the row's index of the sensors' names
_HEADER = struct.Struct("<H")  # the masks' length in bytes


def _flat(sample: GpuSample) -> tuple:
    temperatures = sample.temperatures
    return (*_row(sample), tuple(temperatures), *temperatures.values())


class _Layouts:
    """A row's layout: its header (the changed mask and the float mask), where its floats and its other values go,
    the struct of its doubles. The same values change every second, so a layout is worked out once, found by the
    changed indices (adding: a float's index i, another value's ~i) or by the header (reading). A cache: cleared
    when it grows past LIMIT, as the rows carry their own header."""

    LIMIT = 1024

    def __init__(self) -> None:
        self._by_key: dict[tuple[int, ...], tuple] = {}
        self._by_header: dict[bytes, tuple] = {}

    def of_key(self, key: tuple[int, ...]) -> tuple[bytes, tuple[int, ...], tuple[int, ...], struct.Struct]:
        layout = self._by_key.get(key)
        if layout is None:
            changed = sum(1 << (i if i >= 0 else ~i) for i in key)
            floats = sum(1 << i for i in key if i >= 0)
            size = (changed.bit_length() + 7) // 8
            layout = self._made(_HEADER.pack(size) + changed.to_bytes(size, "little") + floats.to_bytes(size, "little"))
            self._by_key[key] = layout
        return layout

    def of_header(self, rows: bytearray, position: int) -> tuple:
        (size,) = _HEADER.unpack_from(rows, position)
        header = bytes(rows[position:position + _HEADER.size + 2 * size])
        return self._by_header.get(header) or self._made(header)

    def _made(self, header: bytes) -> tuple[bytes, tuple[int, ...], tuple[int, ...], struct.Struct]:
        if len(self._by_header) >= self.LIMIT:
            self._by_key.clear(), self._by_header.clear()
        size = (len(header) - _HEADER.size) // 2
        changed = int.from_bytes(header[_HEADER.size:_HEADER.size + size], "little")
        floats = int.from_bytes(header[_HEADER.size + size:], "little")
        indices = [i for i in range(changed.bit_length()) if changed >> i & 1]
        fidx = tuple(i for i in indices if floats >> i & 1)
        layout = self._by_header[header] = (header, fidx, tuple(i for i in indices if not floats >> i & 1),
                                            struct.Struct(f"<{len(fidx)}d"))
        return layout


_layouts = _Layouts()


class _Ring:
    """One GPU's samples: their times, their packed rows in one buffer, the non-float values they changed. Every
    BLOCK-th row is whole (all its values changed): the oldest block goes as one once the window has passed all
    of it, so the rows a block begins with can be read without what came before. `head` is the oldest sample
    still in the window (counted from the ring's first); those before it wait for their block to go."""

    BLOCK = 64

    __slots__ = ("added", "blocks", "head", "latest", "objects", "previous", "rows", "times")

    def __init__(self) -> None:
        self.times = array("d")  # of the rows held
        self.rows = bytearray()  # per sample: header (changed mask, float mask), the changed floats
        self.objects: deque = deque()  # the changed values that are not floats, in row order
        self.blocks: deque[tuple[int, int, int]] = deque()  # each block's first (sample, byte, object), counted
        self.added = [0, 0, 0]  # samples, bytes and objects added, counted from the ring's first
        self.head = 0
        self.previous: tuple = ()  # the newest sample's flat row
        self.latest: GpuSample | None = None

    def add(self, sample: GpuSample) -> None:
        flat, previous, added = _flat(sample), self.previous, self.added
        if len(flat) == len(previous) and added[0] - self.blocks[-1][0] < self.BLOCK:
            key = tuple([i if type(value) is float else ~i for i, value, old in zip(count(), flat, previous)
                         if value is not old and (type(value) is not type(old) or value != old)])
        else:  # a block's first row, or the sensors changed: all of it
            key = tuple([i if type(value) is float else ~i for i, value in enumerate(flat)])
            self.blocks.append((added[0], added[1], added[2]))
        header, floats, others, doubles = _layouts.of_key(key)
        self.rows += header
        self.rows += doubles.pack(*[flat[i] for i in floats])
        self.objects.extend([flat[i] for i in others])
        self.times.append(sample.time)
        added[0] += 1
        added[1] += len(header) + doubles.size
        added[2] += len(others)
        self.previous, self.latest = flat, sample

    def copy(self) -> _Ring:
        other = _Ring()
        other.times, other.rows, other.objects = array("d", self.times), bytearray(self.rows), deque(self.objects)
        other.blocks, other.added, other.head = deque(self.blocks), list(self.added), self.head
        other.previous, other.latest = self.previous, self.latest
        return other

    def trim(self, now: float, window: float) -> None:
        """As a deque of samples would: drop the oldest while `now` is more than `window` after it."""
        times, held = self.times, self.added[0] - len(self.times)
        while self.head < self.added[0] and now - times[self.head - held] > window:
            self.head += 1
        blocks = self.blocks
        while len(blocks) > 1 and blocks[1][0] <= self.head:
            (sample, byte, obj), (next_sample, next_byte, next_obj) = blocks.popleft(), blocks[0]
            del times[:next_sample - sample]
            del self.rows[:next_byte - byte]
            for _ in range(next_obj - obj):
                self.objects.popleft()

    def history(self, gpu: str, since: float | None) -> list[GpuSample]:
        state, position, out = [], 0, []
        take = iter(self.objects).__next__
        skip = self.head - (self.added[0] - len(self.times))  # held, out of the window
        for n, t in enumerate(self.times):
            position = _apply(state, self.rows, position, take)
            if n >= skip and (since is None or t >= since):
                temperatures = dict(zip(state[_SENSORS], state[_SENSORS + 1:], strict=False))
                out.append(GpuSample(gpu, *state[:_TIME], t, *state[_TIME:_TEMPERATURES], temperatures,
                                     *state[_TEMPERATURES:_SENSORS]))
        return out


def _apply(state: list, rows: bytearray, position: int, take) -> int:
    """Apply the row at `position` to `state` (a flat row, in place); the next row's position. Its other values
    come from `take()`. Values past the sensors of a row that has fewer stay: unused, and overwritten when a
    sensor comes back (the row that brings it back is a whole one)."""
    header, floats, others, doubles = _layouts.of_header(rows, position)
    position += len(header)
    room = (len(header) - _HEADER.size) * 4  # the masks' bits
    if len(state) < room:
        state.extend([None] * (room - len(state)))
    for i, value in zip(floats, doubles.unpack_from(rows, position), strict=True):
        state[i] = value
    for i in others:
        state[i] = take()
    return position + doubles.size


class FlightRecorder:
    def __init__(self, window: float = 900.0) -> None:
        self.window = window
        self._rings: dict[str, _Ring] = {}

    def add(self, sample: GpuSample) -> None:
        ring = self._rings.get(sample.gpu)
        if ring is None:
            ring = self._rings[sample.gpu] = _Ring()
        ring.add(sample)
        ring.trim(sample.time, self.window)

    def latest(self) -> dict[str, GpuSample]:
        return {gpu: ring.latest for gpu, ring in self._rings.items() if ring.head < ring.added[0]}

    def history(self, gpu: str, since: float | None = None) -> list[GpuSample]:
        ring = self._rings.get(gpu)
        return ring.history(gpu, since) if ring else []

    def forget(self, gpu: str) -> None:
        self._rings.pop(gpu, None)

    def frozen(self) -> FlightRecorder:
        """What it holds now, in a copy later samples do not change (the packed buffers copied, ~80 KB a GPU): its
        history rebuilt off the event loop (~6 ms a GPU for a full window)."""
        copy = FlightRecorder(self.window)
        copy._rings = {gpu: ring.copy() for gpu, ring in self._rings.items()}
        return copy
