"""Symbolic tensors and operators: the data every later stage (fusion, emitters, the graph
compiler) works from."""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import sympy

from ..dtypes import DType, as_dtype
from ..errors import ShapeError
from ..mapping_types import IndexMap, MappingType, classify
from ..mapping_types.classify import keeps_runs, offset_folds
from ..shapes import as_int, prod
from .expr import Expr, Read, Reduce

Shape = tuple[int, ...]

_names = itertools.count()

# Ordered so that an operator's type is the type of its most direct input: Add(x, bias) is
# One-to-One through x even though the broadcast bias is One-to-Many.
_DIRECTNESS = (MappingType.ONE_TO_ONE, MappingType.REORGANIZE, MappingType.SHUFFLE,
               MappingType.ONE_TO_MANY, MappingType.MANY_TO_MANY)


@dataclass(frozen=True)
class MathProperties:
    """Algebraic facts the graph rewriter (DNNFusion Table 4) may use."""

    associative: bool = False
    commutative: bool = False
    distributes_over: tuple[str, ...] = ()  # e.g. Mul distributes over ("Add", "Sub")


@dataclass(eq=False)
class Value:
    """A symbolic tensor: a name, a concrete shape and a dtype. Compared by identity."""

    name: str
    shape: Shape
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(eq=False)
class Placeholder(Value):
    """A kernel input supplied by the caller."""

    def __repr__(self) -> str:
        return f"tensor({self.name!r}, {self.shape}, {self.dtype})"


@dataclass(eq=False)
class Constant(Placeholder):
    """An input whose value is known when the graph is built (weights). Kernels still take it
    as an argument; graph rewrites (Conv-BN folding) read ``value``."""

    value: Any = None

    def __repr__(self) -> str:
        return f"constant({self.name!r}, {self.shape}, {self.dtype})"


@dataclass(eq=False)
class Op(Value):
    """One operator: its inputs, its scalar body over ``Read`` leaves, and its algebra.

    ``body`` gives the output element at the output index ``o0..o{rank-1}``; reductions appear as
    ``Reduce`` nodes inside it. ``index_maps`` and ``mapping_type`` are derived from the body.
    """

    kind: str = ""
    inputs: tuple[Value, ...] = ()
    body: Expr | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    properties: MathProperties = MathProperties()

    def __repr__(self) -> str:
        ins = ", ".join(v.name for v in self.inputs)
        return f"{self.kind}({ins}) -> {self.name}: {self.shape} {self.dtype}"

    @cached_property
    def index_maps(self) -> tuple[IndexMap, ...]:
        """Per input, the index map of its widest read (the one inside the most reductions)."""
        assert self.body is not None
        best: dict[int, IndexMap] = {}
        for read, axes in _reads_with_axes(self.body):
            data = tuple((s, n) for s, n, _ in read.data)
            m = IndexMap(self.shape, self.inputs[read.slot].shape, read.exprs, axes, data,
                         read.guard)
            if read.slot not in best or len(m.reduce) > len(best[read.slot].reduce):
                best[read.slot] = m
        return tuple(best[k] if k in best else _unread(self, k) for k in range(len(self.inputs)))

    @cached_property
    def input_mapping_types(self) -> tuple[MappingType, ...]:
        return tuple(classify(m) for m in self.index_maps)

    @cached_property
    def free_reshapes(self) -> tuple[bool, ...]:
        """Per input, whether it is read through a reshape whose offset folds back to the flat
        offset (``mapping_types.folds_to_flat``): an edge the fusion table takes as
        One-to-One."""
        return tuple(t is MappingType.REORGANIZE and offset_folds(m)
                     for m, t in zip(self.index_maps, self.input_mapping_types))

    @cached_property
    def kept_runs(self) -> tuple[bool, ...]:
        """Per input, whether it is read through a remap that moves whole innermost runs
        (``mapping_types.keeps_runs``): a Many-to-Many producer's edge the fusion table takes
        as green (``run_rule``)."""
        return tuple(t in (MappingType.REORGANIZE, MappingType.SHUFFLE) and keeps_runs(m)
                     for m, t in zip(self.index_maps, self.input_mapping_types))

    @cached_property
    def mapping_type(self) -> MappingType:
        """The operator's type: Many-to-Many when it reduces over an input (a Conv or Gemm
        with a broadcast bias is still a contraction), else that of its most direct input
        (see ``_DIRECTNESS``)."""
        types = self.input_mapping_types or (MappingType.ONE_TO_ONE,)
        if MappingType.MANY_TO_MANY in types:
            return MappingType.MANY_TO_MANY
        return min(types, key=_DIRECTNESS.index)

    @property
    def reduction(self) -> str | None:
        """The combiner when the whole body is one reduction (ReduceSum -> 'sum')."""
        return self.body.kind if isinstance(self.body, Reduce) else None


def _reads_with_axes(body: Expr) -> list[tuple[Read, tuple[tuple[sympy.Symbol, int], ...]]]:
    """Every Read in ``body`` with the reduction axes it sits inside and depends on."""
    found: list[tuple[Read, tuple[tuple[sympy.Symbol, int], ...]]] = []

    def visit(node: Expr, axes: tuple[tuple[sympy.Symbol, int], ...]) -> None:
        if isinstance(node, Read):
            used = set(node.guard.free_symbols).union(*(e.free_symbols for e in node.exprs))
            found.append((node, tuple((s, n) for s, n in axes if s in used)))
        if isinstance(node, Reduce):
            axes = axes + node.axes
        for child in node.children():
            visit(child, axes)

    visit(body, ())
    return found


def _unread(op: Op, slot: int) -> IndexMap:
    # An input the body never reads (Shape-only uses) maps nothing; treat it as a broadcast.
    raise ShapeError(op.kind, op.inputs[slot].name, "an input the operator reads", "unused input")


def new_name(prefix: str) -> str:
    return f"{prefix.lower()}_{next(_names)}"


def rewire(ops: Sequence[Op], swaps: Sequence[tuple[Value, Value]]) -> list[Op]:
    """Copies of ``ops`` (in order, each after the ops it reads) reading ``new`` where they
    read ``old`` for each ``(old, new)`` in ``swaps``, and one another's copies where they read
    one another; an op that reads nothing swapped is kept as it is."""
    swap: dict[int, Value] = {id(old): new for old, new in swaps}
    out = []
    for op in ops:
        inputs = tuple(swap.get(id(v), v) for v in op.inputs)
        copy = replace(op, inputs=inputs) if inputs != op.inputs else op
        swap[id(op)] = copy
        out.append(copy)
    return out


def constant(name: str, value: Any) -> Constant:
    """A tensor with a known value (a weight), e.g. ``kg.constant("w", np.ones((4, 3, 3, 3)))``."""
    array = np.ascontiguousarray(value)
    if array.ndim == 0 or 0 in array.shape:
        raise ShapeError("constant", name, "a non-empty array of rank >= 1", array.shape)
    return Constant(name, tuple(array.shape), as_dtype(array.dtype, "constant", name), array)


def tensor(name: str, shape: tuple[int, ...] | list[int], dtype: DType | str = "float32") -> Value:
    """A symbolic input tensor."""
    if not isinstance(name, str):
        raise TypeError(f"tensor: the name must be a str, got {type(name).__name__} {name!r}")
    try:
        given = tuple(shape) if not isinstance(shape, str) else None
    except TypeError:
        given = None
    if given is None:
        raise ShapeError("tensor", name, "a shape: a tuple or list of int sizes", repr(shape))
    sizes: list[int] = []
    for axis, s in enumerate(given):
        n = as_int(s)
        if n is None:  # 2.5 was truncated to 2
            raise ShapeError("tensor", name, "int sizes (not floats, bools or strings)",
                             repr(given), axis)
        if n < 1:
            raise ShapeError("tensor", name, "every dimension >= 1", given, axis)
        sizes.append(n)
    return Placeholder(name, tuple(sizes), as_dtype(dtype, "tensor", name))
