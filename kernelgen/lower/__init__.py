"""From a fused block to the loop IR, through named passes:

    flatten -> merge_reductions -> hoist -> stage_producers -> stage_shared_terms
    -> merge_axes -> split_groups

``flatten`` turns the block's ``Read`` leaves into ``Load``s of kernel buffers at flat offsets;
``merge_reductions`` turns a reduction's axes that every load reads as one run into one axis;
``hoist`` lifts the reductions keyed by a few domain axes out of the per-element work;
``stage_producers`` computes a fused producer's row once per group point (AGO's attention
pattern, ``staging.py``); ``stage_shared_terms`` does so for a costly term a row's reduction
and its stores share (the softmax's exp); ``merge_axes`` merges contiguous domain axes so that
indices need no division; ``split_groups`` splits an axis that reads its channel groups (a
grouped conv's output channels) into the group and the channel within it. Also here: the
analyses backends share (``contraction``) and the unrolling of several domain points per
work-item (``unroll``).
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from ..fusion import FusedBlock
from ..ir.loop import LoopKernel
from .passes import flatten, hoist, merge_axes, merge_reductions, split_groups
from .staging import stage_producers, stage_shared_terms

PIPELINE: tuple[tuple[str, Callable[[LoopKernel], LoopKernel]], ...] = (
    ("merge_reductions", merge_reductions),
    ("hoist", hoist),
    ("stage_producers", stage_producers),
    ("stage_shared_terms", stage_shared_terms),
    ("merge_axes", merge_axes),
    ("split_groups", split_groups),
)

# Lowered kernels per block and name: emitting, tuning and the algorithm choice all ask for the
# same block's loop, and a block never changes after ``fuse``.
_lowered: weakref.WeakKeyDictionary[FusedBlock, dict[str, LoopKernel]] = \
    weakref.WeakKeyDictionary()
_lock = threading.Lock()


def lower(block: FusedBlock, name: str | None = None) -> LoopKernel:
    """The loop IR of ``block`` (named ``name``, by default the block's name), lowered once."""
    name = name or block.name
    with _lock:
        hit = _lowered.get(block, {}).get(name)
    if hit is not None:
        return hit
    kernel = flatten(block, name)
    for _, pass_fn in PIPELINE:
        kernel = pass_fn(kernel)
    with _lock:
        _lowered.setdefault(block, {})[name] = kernel
    return kernel


__all__ = ["PIPELINE", "lower"]
