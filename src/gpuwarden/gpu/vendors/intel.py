"""Intel: its GPUs are found (and guarded, and named in events) but not read: gpuwarden has no reader for i915/xe."""

from __future__ import annotations

from gpuwarden.gpu.vendors.base import GpuVendor

VENDOR = GpuVendor("intel", frozenset({"0x8086"}))
