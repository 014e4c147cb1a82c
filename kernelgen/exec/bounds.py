"""The call-time check of gathered indices: an index outside [-n, n-1] raises ``ArgumentError``
before the launch, as ONNX's Gather requires. Generated code clamps every gathered index into
its axis (``ir/indexing.py``), so a launch that skips this check (``Kernel.launch`` on device
buffers) reads a clamped element, never outside a buffer.

``index_checks(loop)`` is the plan, derived once per kernel from the loop IR: each input read
directly as indices (``Direct``: a load of the input, possibly widened by an integer cast), with
the flat positions the kernel reads; and whether some index is computed (a fused producer, a
narrowing or float cast, a nested gather), in which case the interpreter evaluates the index
expressions on the host (exact, and no more work than the index expressions themselves).
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import sympy

from ..dtypes import DType
from ..errors import ArgumentError
from ..ir import interp
from ..ir.expr import Cast, Expr, IndexCond, Load, Reduce, walk
from ..ir.indexing import raw_index
from ..ir.loop import LoopKernel
from ..mapping_types import evaluate

_WIDENING = {(DType.int32, DType.int64)}  # casts that keep every value


@dataclass(frozen=True)
class Direct:
    """Input ``input`` (its position in ``loop.inputs``, its name) holds indices into an axis of
    size ``extent``; the kernel reads its flat elements ``positions`` (None: all of them)."""

    input: int
    name: str
    extent: int
    positions: np.ndarray | None = field(default=None, compare=False)


@dataclass(frozen=True)
class IndexPlan:
    """What ``check_indices`` tests: direct index inputs, and whether the interpreter must
    evaluate computed indices."""

    direct: tuple[Direct, ...] = ()
    computed: bool = False

    def __bool__(self) -> bool:
        return bool(self.direct) or self.computed


def index_checks(loop: LoopKernel) -> IndexPlan:
    """The checks a call of ``loop`` needs (empty for a kernel that gathers nothing)."""
    inputs = {b.name: k for k, b in enumerate(loop.inputs)}
    extents = dict(loop.domain)
    for root in loop.roots():
        extents.update(a for node in walk(root) if isinstance(node, Reduce) for a in node.axes)
    direct: dict[tuple[int, int], Direct] = {}
    computed = False
    binders = [n for root in loop.roots() for n in walk(root) if isinstance(n, (Load, IndexCond))]
    for node in binders:
        for _, n, value in node.data:
            source = _direct_source(value, n, inputs)
            if source is None or not source.offset.free_symbols <= extents.keys():
                computed = True  # the interpreter evaluates it
                continue
            key = (inputs[source.buffer], n)
            positions = _positions(source, loop, extents)
            if key in direct:  # the same indices read twice: the union of the positions
                seen = direct[key].positions
                positions = None if seen is None or positions is None else \
                    np.union1d(seen, positions)
            direct[key] = Direct(key[0], source.buffer, n, positions)
    return IndexPlan(tuple(direct.values()), computed)


def check_indices(kernel_name: str, loop: LoopKernel, arrays: Sequence[np.ndarray],
                  plan: IndexPlan | None = None) -> None:
    """Raise ``ArgumentError`` when an index array (``arrays`` in ``loop.inputs`` order) holds
    an index outside [-n, n-1] for the axis of size n it gathers from. ``plan`` defaults to
    ``index_checks(loop)``, cached per kernel."""
    plan = _cached_plan(loop) if plan is None else plan
    if not plan:
        return
    for check in plan.direct:
        values = np.asarray(arrays[check.input]).reshape(-1)
        if check.positions is not None:
            values = values[check.positions]
        if values.size == 0:
            continue
        n = check.extent
        if values.min() < -n or values.max() > n - 1:
            bad = values[(values < -n) | (values > n - 1)][0]
            raise ArgumentError(f"kernel '{kernel_name}': index input '{check.name}' holds "
                                f"{bad}, outside [{-n}, {n - 1}] (a gathered axis of size {n})")
    if plan.computed:
        try:
            interp.check_indices(loop, *arrays)
        except ArgumentError as exc:  # the interpreter names the loop; the caller its kernel
            message = str(exc).replace(f"kernel '{loop.name}'", f"kernel '{kernel_name}'", 1)
            raise ArgumentError(message) from None


def _direct_source(value: Expr, n: int, inputs: dict[str, int]) -> Load | None:
    """The input load a gathered index reads unchanged (through widening casts), or None."""
    raw = raw_index(value, n)
    while isinstance(raw, Cast) and (raw.value.dtype, raw.dtype) in _WIDENING:
        raw = raw.value
    if isinstance(raw, Load) and raw.buffer in inputs and not raw.data and \
            raw.guard is sympy.true:
        return raw
    return None


def _positions(load: Load, loop: LoopKernel, extents: dict[sympy.Symbol, int]
               ) -> np.ndarray | None:
    """The flat elements ``load`` reads over every point of the axes (``extents``) its offset
    uses; None when that is all of the buffer."""
    symbols = sorted(load.offset.free_symbols, key=str)
    env = {s: np.arange(extents[s]).reshape([-1 if j == k else 1 for j in range(len(symbols))])
           for k, s in enumerate(symbols)}
    offsets = np.unique(np.asarray(evaluate(load.offset, env), dtype=np.int64))
    numel = next(b.numel for b in loop.inputs if b.name == load.buffer)
    return None if offsets.size == numel else offsets


_plans: dict[int, tuple[weakref.ref[LoopKernel], IndexPlan]] = {}


def _cached_plan(loop: LoopKernel) -> IndexPlan:
    """``index_checks(loop)``, once per kernel object (keyed by identity: hashing a loop IR
    walks all of it)."""
    entry = _plans.get(id(loop))
    if entry is not None and entry[0]() is loop:
        return entry[1]
    plan = index_checks(loop)
    key = id(loop)
    _plans[key] = (weakref.ref(loop, lambda _: _plans.pop(key, None)), plan)
    return plan
