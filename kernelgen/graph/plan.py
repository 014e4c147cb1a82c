"""A compiled model's plan as plain data: which kernel runs when, on which buffers, and where
each buffer lives. No Python callables: ``to_dict()`` is JSON, so a host program in another
language (the C deployment on the roadmap) can run a model from the plan and the kernels'
sources and metadata alone.

Buffers are numbered. Inputs are copied in per run; constants are uploaded once when the model
is compiled (``resident``; a constant a convolution program folded into its own transformed
copy is not); outputs get buffers of their own; intermediates live in shared ``slots`` assigned
by liveness (``memory.py``), each tenant at offset 0 of its slot, except views (``view_of``):
a contiguous part of another intermediate, at an element offset into it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .ios import Schedule
from .memory import Slot


@dataclass(frozen=True)
class BufferSpec:
    """One tensor the launches read or write. ``role``: 'input', 'constant', 'output' or
    'intermediate'; ``slot`` (intermediates): the slot it lives in."""

    id: int
    name: str
    role: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    slot: int | None = None
    resident: bool = False  # a constant uploaded to the device at compile time
    # an intermediate that is a contiguous part of another (a view block's output): that
    # buffer's id and the element offset; it has no slot of its own
    view_of: int | None = None
    offset: int = 0


@dataclass(frozen=True)
class KernelSpec:
    """One compiled executable: a single kernel, or a program of stages (a Winograd or im2col
    convolution, padded operands). Blocks of the same structure share one (``uses``)."""

    id: int
    name: str
    kind: str  # 'kernel' or 'program'
    uses: int
    schedule: str
    algorithm: str | None = None


@dataclass(frozen=True)
class Launch:
    """Run kernel ``kernel`` on buffers ``args`` (its inputs, then its outputs), computing the
    graph operators ``ops``."""

    kernel: int
    ops: tuple[str, ...]
    args: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    backend: str
    buffers: tuple[BufferSpec, ...]
    slots: tuple[Slot, ...]
    kernels: tuple[KernelSpec, ...]
    launches: tuple[Launch, ...]
    inputs: tuple[int, ...]              # buffer ids, in the graph's input order
    outputs: tuple[tuple[str, int], ...]  # (output name, buffer id)
    live_peak: int                       # bytes of intermediates alive at once, at most
    # the stages the launches run in (IOS, ``ios.py``; groups hold launch indices); None: one
    # after another in order
    schedule: Schedule | None = None

    def role(self, role: str) -> list[BufferSpec]:
        return [b for b in self.buffers if b.role == role]

    def memory(self) -> dict[str, int]:
        """Bytes: every intermediate added up, the slots that hold them (the peak this plan
        allocates), the lower bound (most bytes alive at once), and the resident constants."""
        return {"intermediates_total": sum(b.nbytes for b in self.role("intermediate")),
                "intermediates_peak": sum(s.nbytes for s in self.slots),
                "intermediates_live_peak": self.live_peak,
                "constants_resident": sum(b.nbytes for b in self.role("constant")
                                          if b.resident),
                "outputs": sum(b.nbytes for b in self.role("output"))}

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-serialisable data."""
        out = asdict(self)
        out["memory"] = self.memory()
        return out

    def __str__(self) -> str:
        mem = self.memory()
        names = {b.id: b.name for b in self.buffers}
        lines = [f"plan on {self.backend}: {len(self.launches)} launches, {len(self.kernels)} "
                 f"kernels, {len(self.slots)} slots; intermediates {mem['intermediates_peak']:,}"
                 f" bytes peak of {mem['intermediates_total']:,} total (live peak "
                 f"{mem['intermediates_live_peak']:,})"]
        for k, launch in enumerate(self.launches):
            kernel = self.kernels[launch.kernel]
            args = ", ".join(names[a] for a in launch.args)
            lines.append(f"  {k:4d} k{kernel.id} {kernel.name} ({kernel.schedule}): {args}")
        if self.schedule is not None:
            lines.append(format_schedule(self.schedule))
        return "\n".join(lines)


def format_schedule(schedule: Schedule) -> str:
    """A schedule's stages, one line each: strategy, groups of launch indices, latency."""
    total = schedule.latency_ms
    lines = [f"schedule '{schedule.name}': {len(schedule.stages)} stages"
             + (f", {total:.3f} ms measured" if total is not None else "")]
    for k, st in enumerate(schedule.stages):
        groups = " | ".join(" ".join(map(str, g)) for g in st.groups)
        ms = f"{st.latency_ms:8.3f} ms" if st.latency_ms is not None else " " * 11
        lines.append(f"  stage {k:3d} {st.strategy:8s} {ms}  {groups}")
    return "\n".join(lines)
