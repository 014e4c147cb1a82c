"""The loop IR every backend emits from, and the lowering passes that build it.

A ``LoopKernel`` is a parallel loop nest over ``domain`` (the shared output shape, after merging
contiguous axes). At each domain point it stores one value per output. Values are scalar
expressions whose leaves ``Load`` input buffers at flat offsets (SymPy, over the domain symbols and
the symbols of enclosing ``Reduce`` nodes). ``hoisted`` lists the reductions that depend only on the
``group`` axes of the domain: a backend computes each once per group point (cooperatively, e.g. one
work-group per row), then computes the stores of the group's elements (single-kernel softmax).
``staged`` rows (``staging.py``) are computed per group point before them: a fused producer's
row that several reductions read (the attention pattern's score row).

    PIPELINE: flatten -> hoist -> stage_producers -> merge_axes
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import sympy

from mapping_types import fresh_reduce_symbol, out_symbols, simplify_index
from mapping_types.index_map import simplify_guard

from .dtypes import DType
from .expr import (Call, Expr, IndexCond, Load, Read, Reduce, Select, free_index_symbols,
                   transform, walk)
from .shapes import prod, row_major_strides

if TYPE_CHECKING:
    from .fuse import FusedOp

Axis = tuple[sympy.Symbol, int]


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

    @property
    def numel(self) -> int:
        return prod(e for _, e in self.domain)

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
    from .expr import Cast, Const

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


def lower(fused: FusedOp, name: str) -> LoopKernel:
    """Lower a fused operator to the loop IR through the named passes."""
    kernel = flatten(fused, name)
    for _, pass_fn in PIPELINE:
        kernel = pass_fn(kernel)
    return kernel


# --- pass 1: Read -> Load at flat offsets ------------------------------------------------------

def flatten(fused: FusedOp, name: str) -> LoopKernel:
    """Replace each Read by a Load of the input buffer at its flat row-major offset."""
    inputs = tuple(Buffer(v.name, v.shape, v.dtype) for v in fused.inputs)
    outputs = tuple(Buffer(o.name, o.shape, o.dtype) for o in fused.outputs)
    ranges = dict(fused.ranges)
    shape = fused.shape
    # size-1 output axes are index 0 everywhere; they do not become loops
    sub = {s: sympy.Integer(0) for s, n in zip(out_symbols(len(shape)), shape) if n == 1}
    domain = tuple((s, n) for s, n in zip(out_symbols(len(shape)), shape) if n > 1)

    def rewrite(node: Expr, recurse: Any) -> Expr | None:
        if isinstance(node, Read):
            buf = inputs[node.slot]
            strides = row_major_strides(buf.shape)
            offset = sum((e.xreplace(sub) * st for e, st in zip(node.exprs, strides)),
                         sympy.Integer(0))
            data = tuple((s, n, recurse(v)) for s, n, v in node.data)
            return Load(node.dtype, buf.name, simplify_index(sympy.expand(offset), ranges),
                        simplify_guard(node.guard.xreplace(sub), ranges), data)
        if isinstance(node, IndexCond):
            return IndexCond(node.dtype, simplify_guard(node.cond.xreplace(sub), ranges))
        return None

    stores = tuple(Store(o.name, transform(o.body, rewrite)) for o in fused.outputs)
    return LoopKernel(name, inputs, outputs, domain, stores, ranges=ranges)


# --- pass 2: hoist reductions that depend only on the group axes -----------------------------

def hoist(kernel: LoopKernel) -> LoopKernel:
    """Find reductions whose free symbols are all domain axes; they key the group axes."""
    domain_syms = {s for s, _ in kernel.domain}
    hoisted: list[Reduce] = []
    for st in kernel.stores:
        for node in walk(st.value):  # children first: inner reductions come before outer ones
            if isinstance(node, Reduce) and free_index_symbols(node) <= domain_syms \
                    and node not in hoisted:
                hoisted.append(node)
    keyed = set().union(*(free_index_symbols(r) for r in hoisted)) if hoisted else set()
    group = tuple(k for k, (s, _) in enumerate(kernel.domain) if s in keyed)
    return replace(kernel, hoisted=tuple(hoisted), group=group)


# --- pass 3: merge contiguous axes -------------------------------------------------------------

def _index_exprs(kernel: LoopKernel) -> Iterable[tuple[sympy.Basic, bool]]:
    """(expression, is_offset) for every index expression in the kernel."""
    for root in kernel.roots():
        for node in walk(root):
            if isinstance(node, Load):
                yield node.offset, True
                yield node.guard, False
            elif isinstance(node, IndexCond):
                yield node.cond, False


def _linear(expr: sympy.Expr, a: sympy.Symbol, b: sympy.Symbol) -> tuple[Any, Any] | None:
    """Coefficients of ``a`` and ``b`` if they occur only in linear terms, else None."""
    ca = cb = sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(expr)):
        if not term.has(a) and not term.has(b):
            continue
        coeff, factor = term.as_coeff_Mul()
        if factor == a:
            ca += coeff
        elif factor == b:
            cb += coeff
        else:
            return None
    return ca, cb


def _mergeable(kernel: LoopKernel, a: Axis, b: Axis) -> bool:
    for expr, is_offset in _index_exprs(kernel):
        if not (expr.has(a[0]) or expr.has(b[0])):
            continue
        coeffs = _linear(expr, a[0], b[0]) if is_offset else None
        if coeffs is None or coeffs[0] != b[1] * coeffs[1]:
            return False
    return True


def _substitute_merge(kernel: LoopKernel, a: Axis, b: Axis, q: sympy.Symbol) -> Callable:
    def fix(expr: sympy.Expr) -> sympy.Expr:
        coeffs = _linear(expr, a[0], b[0])
        if coeffs is None or coeffs == (0, 0):
            return expr
        return sympy.expand(expr - coeffs[0] * a[0] - coeffs[1] * b[0] + coeffs[1] * q)

    def rewrite(node: Expr, recurse: Any) -> Expr | None:
        if isinstance(node, Load):
            data = tuple((s, n, recurse(v)) for s, n, v in node.data)
            return Load(node.dtype, node.buffer, fix(node.offset), node.guard, data)
        if isinstance(node, Reduce):
            return Reduce(node.dtype, node.kind, recurse(node.body), node.axes)
        return None

    return rewrite


def merge_axes(kernel: LoopKernel) -> LoopKernel:
    """Merge adjacent domain axes of the same kind (group/element) wherever every load offset is
    linear in both with matching strides, so kernels index with fewer divisions (PoCL stops
    vectorising at the first integer division)."""
    k = 0
    while k < len(kernel.domain) - 1:
        a, b = kernel.domain[k], kernel.domain[k + 1]
        if (k in kernel.group) == (k + 1 in kernel.group) and _mergeable(kernel, a, b):
            kernel = _merge_pair(kernel, k)
            k = 0
        else:
            k += 1
    return kernel


def _merge_pair(kernel: LoopKernel, k: int) -> LoopKernel:
    """Replace domain axes ``k`` and ``k+1`` by one axis of their combined extent."""
    a, b = kernel.domain[k], kernel.domain[k + 1]
    q = fresh_reduce_symbol("m")
    rewrite = _substitute_merge(kernel, a, b, q)
    stores = tuple(Store(st.buffer, transform(st.value, rewrite)) for st in kernel.stores)
    # rewriting is deterministic, so each hoisted reduction equals its copy inside the stores
    hoisted = tuple(transform(r, rewrite) for r in kernel.hoisted)
    staged = tuple(replace(st, value=transform(st.value, rewrite)) for st in kernel.staged)
    domain = kernel.domain[:k] + ((q, a[1] * b[1]),) + kernel.domain[k + 2:]
    group = tuple(dict.fromkeys(g if g <= k else g - 1 for g in kernel.group))
    return replace(kernel, domain=domain, stores=stores, hoisted=hoisted,  # type: ignore[arg-type]
                   staged=staged, group=group, ranges={**kernel.ranges, q: a[1] * b[1]})


def _stage_producers(kernel: LoopKernel) -> LoopKernel:
    """``staging.stage_producers``: its own module, which builds on this one."""
    from .staging import stage_producers as stage
    return stage(kernel)


PIPELINE: tuple[tuple[str, Callable[[LoopKernel], LoopKernel]], ...] = (
    ("hoist", hoist),
    ("stage_producers", _stage_producers),
    ("merge_axes", merge_axes),
)


def fingerprint(kernel: LoopKernel) -> str:
    """A stable hash of the kernel's structure: buffers by position, symbols named by where they
    are bound (domain position, reduction, gather), so the same computation built twice, from
    differently named tensors, hashes the same. Tuning results are keyed on it."""
    import hashlib

    from .expr import Cast, Const

    names: dict[sympy.Basic, sympy.Symbol] = {
        s: sympy.Symbol(f"d{k}") for k, (s, _) in enumerate(kernel.domain)}
    buffers = {b.name: f"in{k}" for k, b in enumerate(kernel.inputs)}
    buffers.update({b.name: f"out{k}" for k, b in enumerate(kernel.outputs)})
    buffers.update({st.buffer.name: f"stage{k}" for k, st in enumerate(kernel.staged)})
    memo: dict[int, str] = {}

    def bind(s: sympy.Symbol) -> None:
        names.setdefault(s, sympy.Symbol(f"s{len(names)}"))

    def ix(e: sympy.Basic) -> str:
        return str(e.xreplace(names))

    def text(node: Expr) -> str:
        if id(node) in memo:
            return memo[id(node)]
        if isinstance(node, Reduce):
            for s, _ in node.axes:
                bind(s)
            axes = ",".join(f"{ix(s)}<{n}" for s, n in node.axes)
            out = f"{node.kind}[{axes}]({text(node.body)})"
        elif isinstance(node, Load):
            data = []
            for s, n, v in node.data:
                data.append(f"{text(v)}<{n}")
                bind(s)
            out = f"{buffers[node.buffer]}[{ix(node.offset)}|{ix(node.guard)}|{';'.join(data)}]"
        elif isinstance(node, Const):
            out = f"{node.value!r}"
        elif isinstance(node, IndexCond):
            out = f"?({ix(node.cond)})"
        elif isinstance(node, Call):
            out = f"{node.fn}({','.join(text(a) for a in node.args)})"
        elif isinstance(node, (Select, Cast)):
            out = f"{type(node).__name__}({','.join(text(c) for c in node.children())})"
        else:
            raise TypeError(f"fingerprint: unknown node {type(node).__name__}")
        out = f"{out}:{node.dtype}"
        memo[id(node)] = out
        return out

    parts = [f"domain{[n for _, n in kernel.domain]}"]
    parts += [f"{buffers[b.name]}:{b.dtype}{list(b.shape)}" for b in kernel.inputs + kernel.outputs]
    for st in kernel.staged:
        bind(st.row)
        parts.append(f"{buffers[st.buffer.name]}[{ix(st.row)}<{st.buffer.numel}]={text(st.value)}")
    parts += [f"{buffers[st.buffer]}={text(st.value)}" for st in kernel.stores]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Contraction:
    """A kernel whose only hoisted reduction is ``sum(P * Q)`` with P and Q depending on disjoint
    domain axes (rows and columns): MatMul, Gemm, group-1 convolution as an implicit GEMM, with
    any elementwise prologue inside P/Q and any epilogue around the sum. Axes both operands
    depend on are batch axes (batched MatMul, Winograd's 16 transform positions): each batch
    point is an independent contraction. An operand may itself be a reduction (AGO's intensive
    fusion: Conv -> 1x1 Conv, MatMul -> MatMul): each tile then computes the producer values it
    needs, once per column tile."""

    reduce: Reduce
    left: Expr
    right: Expr
    rows: tuple[int, ...]  # domain positions only the left operand depends on (and unused ones)
    cols: tuple[int, ...]  # positions only the right operand depends on
    batch: tuple[int, ...] = ()  # positions both depend on

    def swapped(self) -> Contraction:
        """The same sum with the operands exchanged (rows become columns): the sum of
        products is symmetric, so a template may vectorise whichever operand reads a run."""
        return Contraction(self.reduce, self.right, self.left, self.cols, self.rows, self.batch)


def contraction(kernel: LoopKernel, rowless: bool = False) -> Contraction | None:
    """Recognise the contraction pattern, or None. With ``rowless``, also a sum whose one
    operand depends only on axes the other depends on too (a depthwise conv: ``w[c, k]`` times
    ``x[c, pixel + k]``), as a contraction with no rows: every output axis is a batch or column
    axis. Only a backend that vectorises the columns gains from that form."""
    if len(kernel.hoisted) != 1 or len(kernel.group) != len(kernel.domain):
        return None
    r = kernel.hoisted[0]
    if r.kind != "sum" or r.dtype is not DType.float32 or not isinstance(r.body, Call) \
            or r.body.fn != "mul":
        return None
    left, right = r.body.args
    own = {s for s, _ in r.axes}
    fl, fr = free_index_symbols(left) - own, free_index_symbols(right) - own
    if rowless and fr and fr < fl:  # the right operand has no columns of its own: swap
        left, right, fl, fr = right, left, fr, fl
    syms = [s for s, _ in kernel.domain]
    if not fr - fl or (fl & fr) - set(syms):
        return None
    batch = tuple(k for k, s in enumerate(syms) if s in fl & fr)
    cols = tuple(k for k, s in enumerate(syms) if s in fr - fl)
    rows = tuple(k for k in range(len(syms)) if k not in cols and k not in batch)
    return Contraction(r, left, right, rows, cols, batch)


def operand_has_reduction(side: Expr) -> bool:
    """True when a contraction operand is itself a reduction (a fused producer)."""
    return any(isinstance(n, Reduce) for n in walk(side))


def operand_buffers(*sides: Expr) -> list[str]:
    """The buffers the contraction operands ``sides`` load, sorted."""
    return sorted({n.buffer for side in sides for n in walk(side) if isinstance(n, Load)})


def producer_redundancy(kernel: LoopKernel, tile_n: int) -> float:
    """How often each element of a producer fused into a contraction's left operand is computed
    with column tiles of ``tile_n``: once per column tile (AGO's redundancy; 1.0 when one tile
    spans every column, or when the operand holds no producer reduction)."""
    c = contraction(kernel)
    if c is None or not operand_has_reduction(c.left):
        return 1.0
    n_cols = prod(kernel.domain[i][1] for i in c.cols)
    return float(-(-n_cols // tile_n))


def specialise(root: Expr, values: Mapping[sympy.Symbol, int | sympy.Expr],
               ranges: Mapping[sympy.Symbol, int], keep: Collection[Expr] = ()) -> Expr:
    """``root`` with some index symbols replaced (by constants, or ``2*outer + 1`` for a split
    axis): offsets and guards simplified, and selects on conditions that became constant
    replaced by their taken side. Equal loads and sums of the copies for different values then
    compare equal, so an emitter that unrolls a small axis shares them (Winograd's 16 transform
    positions read one 4x4 tile). ``ranges`` bounds every symbol in the result. Nodes in
    ``keep`` stay as they are (an epilogue's contraction sum)."""
    sub = {s: sympy.sympify(v) for s, v in values.items()}
    fixed = set(sub)

    def visit(node: Expr, recurse: Callable[[Expr], Expr]) -> Expr | None:
        if node in keep or not fixed & free_index_symbols(node):
            return node
        if isinstance(node, Load):
            data = tuple((s, n, recurse(v)) for s, n, v in node.data)
            offset = specialise_index(node.offset, sub, ranges)
            return Load(node.dtype, node.buffer, offset,
                        simplify_guard(node.guard.xreplace(sub), ranges), data)
        if isinstance(node, IndexCond):
            return IndexCond(node.dtype, simplify_guard(node.cond.xreplace(sub), ranges))
        if isinstance(node, Select):
            cond = recurse(node.cond)
            if isinstance(cond, IndexCond) and cond.cond in (sympy.true, sympy.false):
                return recurse(node.if_true if cond.cond is sympy.true else node.if_false)
        return None

    return transform(root, visit)


def specialise_index(expr: sympy.Expr, values: Mapping[sympy.Symbol, int | sympy.Expr],
                     ranges: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """An offset with some index symbols replaced, simplified as ``specialise`` does."""
    return simplify_index(sympy.expand(expr.xreplace(dict(values))), ranges)


def flatten_offset(offset: sympy.Expr, axes: list[Axis], flat: sympy.Symbol
                   ) -> sympy.Expr | None:
    """``offset`` with the row-major ``axes`` replaced by their flat position ``flat``, or None
    unless it walks them as one contiguous run (each axis's stride is the next one's times the
    next one's extent)."""
    syms = [s for s, _ in axes]
    offset = sympy.expand(offset)
    coeffs = [offset.coeff(s) for s in syms]
    rest = sympy.expand(offset - sum(c * s for c, s in zip(coeffs, syms)))
    runs = all(coeffs[i] == coeffs[i + 1] * axes[i + 1][1] for i in range(len(axes) - 1))
    return rest + coeffs[-1] * flat if runs and not set(syms) & rest.free_symbols else None


def flatten_axes(root: Expr, axes: list[Axis], flat: sympy.Symbol,
                 keep: frozenset[Expr] = frozenset()) -> Expr | None:
    """``root`` with the row-major ``axes`` replaced by their flat position ``flat``, or None
    when some use is not a load whose offset walks them as one contiguous run, or they appear
    in a guard or condition when there are several. Nodes in ``keep`` stay as they are (an
    epilogue's contraction sum). Lets a vector run over merged output axes (a conv's (OH, OW)
    pixels)."""
    syms = set(s for s, _ in axes)
    # one axis is only renamed, so a guard on it stays linear (a padded window's bounds test)
    rename = {axes[0][0]: flat} if len(axes) == 1 else None
    failed = False

    def visit(node: Expr, recurse: Callable[[Expr], Expr]) -> Expr | None:
        nonlocal failed
        if node in keep or not syms & free_index_symbols(node) or failed:
            return node
        if isinstance(node, Load):
            offset = flatten_offset(node.offset, axes, flat)
            guarded = bool(syms & set(node.guard.free_symbols))
            if offset is None or (guarded and rename is None) \
                    or any(syms & free_index_symbols(v) for _, _, v in node.data):
                failed = True
                return node
            guard = node.guard.xreplace(rename) if guarded and rename else node.guard
            return replace(node, offset=offset, guard=guard)
        if isinstance(node, IndexCond) and rename is not None:
            return replace(node, cond=node.cond.xreplace(rename))  # padding's inside-test
        if isinstance(node, (IndexCond, Read)):
            failed = True
            return node
        return None

    out = transform(root, visit)
    return None if failed else out
