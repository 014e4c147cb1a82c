"""Device memory for intermediates, assigned by liveness.

An intermediate lives from the launch that writes it to the last launch that reads it (both
included: a launch's outputs never share memory with its inputs). Intermediates whose lives do
not overlap share a slot, a device buffer as large as its largest tenant; slots hold one dtype
(Triton specialises a kernel on its pointers' element types). The assignment is greedy by size
(TFLite's "greedy by size" for shared objects): largest tensor first, each into the smallest
slot whose tenants are all dead while it lives, else a new slot. Peak bytes is the sum of the
slots; ``live_peak`` (the most bytes live at any launch) is the lower bound any assignment
needs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """One intermediate: its buffer id, the launches that write and last read it, its size."""

    buffer: int
    start: int
    end: int
    dtype: str
    numel: int
    nbytes: int

    def overlaps(self, other: Interval) -> bool:
        return not (self.end < other.start or other.end < self.start)


@dataclass(frozen=True)
class Slot:
    """A device buffer that intermediates share: ``numel`` elements of ``dtype``."""

    id: int
    dtype: str
    numel: int
    nbytes: int


def assign(intervals: Sequence[Interval]) -> tuple[dict[int, int], list[Slot]]:
    """(buffer id -> slot id, the slots): greedy by size over the intervals."""
    order = sorted(intervals, key=lambda i: (-i.nbytes, i.start, i.buffer))
    tenants: list[list[Interval]] = []
    sizes: list[Interval] = []  # each slot's first (largest) tenant
    where: dict[int, int] = {}
    for iv in order:
        best = None
        for k, first in enumerate(sizes):
            if first.dtype != iv.dtype or any(iv.overlaps(t) for t in tenants[k]):
                continue
            if best is None or first.nbytes < sizes[best].nbytes:
                best = k
        if best is None:
            best = len(sizes)
            sizes.append(iv)
            tenants.append([])
        tenants[best].append(iv)
        where[iv.buffer] = best
    slots = [Slot(k, first.dtype, first.numel, first.nbytes) for k, first in enumerate(sizes)]
    return where, slots


def live_peak(intervals: Sequence[Interval]) -> int:
    """The most bytes of intermediates alive at any one launch."""
    if not intervals:
        return 0
    events: dict[int, int] = {}
    for iv in intervals:
        events[iv.start] = events.get(iv.start, 0) + iv.nbytes
        events[iv.end + 1] = events.get(iv.end + 1, 0) - iv.nbytes
    peak = alive = 0
    for t in sorted(events):
        alive += events[t]
        peak = max(peak, alive)
    return peak
