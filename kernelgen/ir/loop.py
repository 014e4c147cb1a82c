"""The loop IR every backend emits from.

A ``LoopKernel`` is a parallel loop nest over ``domain`` (the shared output shape, after merging
contiguous axes). At each domain point it stores one value per output. Values are scalar
expressions whose leaves ``Load`` input buffers at flat offsets (SymPy, over the domain symbols and
the symbols of enclosing ``Reduce`` nodes). ``hoisted`` lists the reductions that depend only on the
``group`` axes of the domain: a backend computes each once per group point (cooperatively, e.g. one
work-group per row), then computes the stores of the group's elements (single-kernel softmax).
``staged`` rows are computed per group point before them: a fused producer's row that several
reductions read (the attention pattern's score row); ``inline_staged`` says what they mean.

The passes that build a ``LoopKernel`` from a fused block are in ``kernelgen.lower``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy

from ..dtypes import DType
from ..shapes import prod
from .expr import Axis, Call, Cast, Const, Expr, IndexCond, Load, Reduce, Select, transform, walk
from .substitute import specialise


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: DType

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class Store:
    buffer: str
    value: Expr


@dataclass(frozen=True)
class Staged:
    """A producer row computed once per group point into ``buffer`` (scratch the backend
    allocates per group point: a private or local array, never a kernel argument): ``value`` at
    ``row`` = 0 .. extent-1 (``row`` a symbol of the staged value alone). Loads of ``buffer``
    read it back (AGO's attention: the score row QK^T of one query, which the softmax's max,
    its sum and the second MatMul all read)."""

    buffer: Buffer
    row: sympy.Symbol
    value: Expr


@dataclass(frozen=True)
class LoopKernel:
    """One kernel: parallel ``domain`` axes (outermost first), stores at each point, and the
    reductions hoisted out of the per-element work."""

    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    domain: tuple[Axis, ...]
    stores: tuple[Store, ...]
    hoisted: tuple[Reduce, ...] = ()
    group: tuple[int, ...] = ()  # positions in ``domain`` that key the hoisted reductions
    staged: tuple[Staged, ...] = ()  # computed per group point before the hoisted reductions
    ranges: dict[sympy.Symbol, int] = field(default_factory=dict, compare=False)
    # the math library's expansions in this kernel (``lower/fastmath.py``): each expansion's
    # root -> (function, arguments) of the call it computes, which the printers name in a comment
    origins: dict[Expr, tuple[str, tuple[Expr, ...]]] = field(default_factory=dict,
                                                              compare=False)
    # the inputs whose values are fixed when the kernel is built (``kg.constant``, a model's
    # initializers): a schedule may lay them out once for every launch (a packed operand)
    constants: frozenset[str] = frozenset()

    @property
    def numel(self) -> int:
        return prod(e for _, e in self.domain)

    @property
    def needs_long_index(self) -> bool:
        """Whether some buffer, or the domain, has 2**31 elements or more (64-bit indices)."""
        sizes = [b.numel for b in self.inputs + self.outputs] + [self.numel]
        return max(sizes) >= 2**31

    @property
    def store_offset(self) -> sympy.Expr:
        """Flat row-major offset of the domain point in every output buffer."""
        offset, stride = sympy.Integer(0), 1
        for s, n in reversed(self.domain):
            offset += stride * s
            stride *= n
        return offset

    @property
    def grouped(self) -> bool:
        """Whether each group point does work before its elements: hoisted reductions or
        staged rows (a kernel may stage rows and hoist nothing)."""
        return bool(self.hoisted or self.staged)

    @property
    def element_axes(self) -> tuple[int, ...]:
        return tuple(k for k in range(len(self.domain)) if k not in self.group)

    def roots(self) -> list[Expr]:
        """Every expression the kernel evaluates: the staged rows' values and the stores'."""
        return [st.value for st in self.staged] + [st.value for st in self.stores]

    def loads(self) -> list[Load]:
        return [n for root in self.roots() for n in walk(root) if isinstance(n, Load)]

    def bytes_moved(self) -> int:
        """Each input read once and each output written once (the roofline's byte count)."""
        return sum(b.numel * b.dtype.itemsize for b in self.inputs + self.outputs)

    def flops(self) -> int:
        """Arithmetic operations per kernel run, counted on the IR: primitive calls and
        reduction combines, with each hoisted reduction counted once per group point."""
        hoisted = set(self.hoisted)

        def count(node: Expr, seen: set[int], stop: set[Reduce]) -> int:
            if id(node) in seen or node in stop:
                return 0
            seen.add(id(node))
            if isinstance(node, Reduce):
                return prod(e for _, e in node.axes) * (count(node.body, set(), stop) + 1)
            own = 1 if isinstance(node, Call) else 0
            return own + sum(count(c, seen, stop) for c in node.children())

        per_point = sum(count(st.value, set(), hoisted) for st in self.stores)
        per_group = sum(count(r, set(), hoisted - {r}) for r in self.hoisted)
        per_group += sum(st.buffer.numel * count(st.value, set(), hoisted) for st in self.staged)
        groups = prod(self.domain[k][1] for k in self.group)
        return self.numel * per_point + groups * per_group

    def __str__(self) -> str:
        """A readable listing: buffers, domain, hoisted reductions and stores."""
        lines = [f"kernel {self.name}"]
        lines += [f"  in  {b.name}: {b.dtype}{list(b.shape)}" for b in self.inputs]
        lines += [f"  out {b.name}: {b.dtype}{list(b.shape)}" for b in self.outputs]
        lines.append("  domain: " + ", ".join(f"{s} < {n}" for s, n in self.domain))
        lines += [f"  staged: {st.buffer.name}[{st.row} < {st.buffer.shape[0]}] = "
                  f"{_text(st.value)}" for st in self.staged]
        lines += [f"  hoisted: {_text(r)}" for r in self.hoisted]
        lines += [f"  {st.buffer}[{self.store_offset}] = {_text(st.value)}" for st in self.stores]
        return "\n".join(lines)


def _text(node: Expr) -> str:
    """One expression as text: loads as ``buffer[offset]``, guards after ``if``."""
    if isinstance(node, Load):
        guard = "" if node.guard is sympy.true else f" if {node.guard}"
        return f"{node.buffer}[{node.offset}{guard}]"
    if isinstance(node, Const):
        return repr(node.value)
    if isinstance(node, IndexCond):
        return f"({node.cond})"
    if isinstance(node, Call):
        return f"{node.fn}({', '.join(_text(a) for a in node.args)})"
    if isinstance(node, Reduce):
        axes = ", ".join(f"{s} < {n}" for s, n in node.axes)
        return f"{node.kind}[{axes}]({_text(node.body)})"
    if isinstance(node, Select):
        return f"({_text(node.cond)} ? {_text(node.if_true)} : {_text(node.if_false)})"
    if isinstance(node, Cast):
        return f"{node.dtype}({_text(node.value)})"
    return f"{type(node).__name__}(...)"


def inline_staged(kernel: LoopKernel) -> LoopKernel:
    """``kernel`` with every load of a staged row replaced by the producer it stands for (the
    inlined form, which recomputes it): what a staged row means. The hoisted reductions are
    left as they were; ``lower.staging.unstage`` hoists again."""
    if not kernel.staged:
        return kernel
    values = {st.buffer.name: st for st in kernel.staged}

    def visit(node: Expr, recurse: object) -> Expr | None:
        if isinstance(node, Load) and node.buffer in values:
            st = values[node.buffer]
            return recurse(specialise(st.value, {st.row: node.offset},  # type: ignore[operator]
                                      kernel.ranges))
        return None

    stores = tuple(Store(st.buffer, transform(st.value, visit)) for st in kernel.stores)
    return replace(kernel, stores=stores, staged=())
