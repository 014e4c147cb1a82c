"""OpenCL's 'columns' schedule: on a CPU, a kernel whose output elements each reduce on their
own ('item' otherwise: LRN's window over channels, a reduction along a strided axis, a MaxPool
too long for the 'window' schedule) runs a chunk of its last axis a work-item as explicit
vectors, each element's reduction a lane of a vector accumulator. When it applies, in which
vectors (``opencl_columns``); ``emit.py`` prints it through the shared group body."""
from __future__ import annotations

from functools import lru_cache

from ...ir.loop import LoopKernel
from ..base import Capabilities
from ..c.vectorizable import columns_plan
from .language import vector_syntax

# PoCL does not vectorise 'item' across work-items whose taps are loads under guards of their
# own: LRN over 192x55x55 took 0.96-1.01 ms as generated and 0.20-0.24 with a float16 a
# work-item, a copy of the same tensor 0.09 (hand-written variants, round-robin in one
# process). The vectors a work-item computes and its work-group, generated and timed
# round-robin (medians, ms, 'item' first): LRN 192x55x55 1.09, 0.27 with 4 vectors in groups
# of 8 or 32, 0.26-0.31 at 1, 2 and 8 vectors; 64x55x55 0.47, 0.12 (0.12-0.15); 96x27x27
# 0.085, 0.057 (0.057-0.066); ReduceMean over the 256 channels of 56x56 1.07, 0.27 in groups
# of 8, 0.31-0.39 in groups of 32-128 (49 chunks: a big group leaves a core idle).
COLUMNS_VECTORS = 4
COLUMNS_LOCAL = 8
COLUMNS_MIN_WIDTH = 4  # narrower vectors leave 'item' (and PoCL's own lanes) in charge


def opencl_columns(loop: LoopKernel, caps: Capabilities) -> tuple[LoopKernel, int] | None:
    """The 'columns' plan of ``loop`` (``c.vectorizable.columns_plan``) in the widest vectors of at
    least ``COLUMNS_MIN_WIDTH`` lanes that it fits, and that width; None where none does."""
    return _columns(loop, caps.vector_widths)


@lru_cache(maxsize=256)  # asked by the kind's choice, the schedule and the tuner, per emit
def _columns(loop: LoopKernel, widths: tuple[int, ...]) -> tuple[LoopKernel, int] | None:
    for w in widths:
        plan = columns_plan(loop, vector_syntax(w, stride2=True)) \
            if w >= COLUMNS_MIN_WIDTH else None
        if plan is not None:
            return plan, w
    return None


def columns_or_refuse(loop: LoopKernel, caps: Capabilities) -> tuple[LoopKernel, int]:
    """``opencl_columns``, or a ValueError naming the kernel and what the schedule needs."""
    columns = opencl_columns(loop, caps)
    if columns is None:
        raise ValueError(f"schedule 'columns' needs every output element to reduce on its "
                         f"own and every store as float32 vectors of at least "
                         f"{COLUMNS_MIN_WIDTH} lanes along the last axis (contiguous or "
                         f"padded loads, two vectors long); kernel '{loop.name}' has none")
    return columns
