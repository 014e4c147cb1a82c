"""Scalar expressions: the body of every operator and of every fused kernel.

Nodes are frozen dataclasses, so equal subtrees hash equal and emitters share them (CSE). Index
arithmetic stays in SymPy (``mapping_types``); values are these nodes. An operator's body reads its
inputs through ``Read`` leaves; fusion replaces each ``Read`` by the producer's inlined body or by a
``Load`` of a kernel buffer at a flat offset.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import sympy

from ..dtypes import DType

Axis = tuple[sympy.Symbol, int]  # a loop or reduction axis: its symbol and extent
Extents = tuple[Axis, ...]
DataBindings = tuple[tuple[sympy.Symbol, int, "Expr"], ...]  # (symbol, extent, value)


@dataclass(frozen=True)
class Expr:
    dtype: DType

    def children(self) -> tuple[Expr, ...]:
        return ()


@dataclass(frozen=True)
class Const(Expr):
    value: float | int | bool


@dataclass(frozen=True)
class Read(Expr):
    """Operator-level leaf: input ``slot`` at the index ``exprs`` (SymPy, over the output symbols
    and enclosing reduction symbols). ``data`` binds data symbols, each with the extent its value
    is known to lie in, to values (Gather's indices)."""

    slot: int
    exprs: tuple[sympy.Expr, ...]
    guard: sympy.Basic = sympy.true
    data: DataBindings = ()

    def children(self) -> tuple[Expr, ...]:
        return tuple(v for _, _, v in self.data)


@dataclass(frozen=True)
class Load(Expr):
    """Kernel-level leaf: ``buffer`` at a flat element offset; reads 0 where ``guard`` is false."""

    buffer: str
    offset: sympy.Expr
    guard: sympy.Basic = sympy.true
    data: DataBindings = ()

    def children(self) -> tuple[Expr, ...]:
        return tuple(v for _, _, v in self.data)


@dataclass(frozen=True)
class IndexCond(Expr):
    """A boolean computed from index symbols (Pad's 'inside the source' test, a padded
    window's bounds); ``data`` binds the data symbols it tests, as a ``Load``'s do (a padded
    convolution read at a gathered position)."""

    cond: sympy.Basic
    data: DataBindings = ()

    def children(self) -> tuple[Expr, ...]:
        return tuple(v for _, _, v in self.data)


@dataclass(frozen=True)
class Call(Expr):
    """A primitive function (see ``PRIMITIVES``) applied to arguments."""

    fn: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    if_true: Expr
    if_false: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.if_true, self.if_false)


@dataclass(frozen=True)
class Cast(Expr):
    value: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.value,)


@dataclass(frozen=True)
class Reduce(Expr):
    """Combine ``body`` over every point of ``axes`` with ``kind`` ('sum', 'prod', 'max', 'min')."""

    kind: str
    body: Expr
    axes: Extents

    def children(self) -> tuple[Expr, ...]:
        return (self.body,)


# the pairs of distinct nodes found equal during the outermost comparison in progress (per
# thread): a pair met again on another path is answered at once
_equal_pairs = threading.local()


def _remember_hashes(cls: type[Expr]) -> None:
    """Give ``cls`` a hash computed once per node, and an equality that compares hashes first
    and compares each pair of nodes once. The generated ones walk the whole subtree on every
    call, counting a shared node once per path to it: the math library's expansions
    (``lower/fastmath.py``) reuse their input several times at every level, so one hash of a
    Mish kernel's store took seconds, and comparing two equal copies of a fused block with
    several expansions never finished (the fuzzer's long run hung on one)."""
    generated_hash, generated_eq = cls.__hash__, cls.__eq__

    def __hash__(self: Expr) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = generated_hash(self)
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self: Expr, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self):
            return generated_eq(self, other)  # type: ignore[no-any-return]
        if hash(self) != hash(other):
            return False
        pairs: set[tuple[int, int]] | None = getattr(_equal_pairs, "seen", None)
        outermost = pairs is None
        if pairs is None:
            pairs = _equal_pairs.seen = set()
        elif (id(self), id(other)) in pairs:
            return True
        try:
            equal: bool = generated_eq(self, other)
            if equal:
                pairs.add((id(self), id(other)))  # both stay alive until the outermost returns
            return equal
        finally:
            if outermost:
                _equal_pairs.seen = None

    cls.__hash__ = __hash__  # type: ignore[method-assign,assignment]
    cls.__eq__ = __eq__  # type: ignore[method-assign,assignment]


def _without_hash(self: Expr) -> dict[str, object]:
    # a remembered hash is of this process (strings hash with a per-process seed): not pickled
    return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_index_symbols")}


Expr.__getstate__ = _without_hash  # type: ignore[method-assign,assignment]
for _cls in (Expr, Const, Read, Load, IndexCond, Call, Select, Cast, Reduce):
    _remember_hashes(_cls)


@dataclass(frozen=True)
class Primitive:
    """A scalar function every backend must provide. ``kind``: 'arith', 'compare', 'logic'."""

    name: str
    arity: int
    kind: str = "arith"
    float_only: bool = False


PRIMITIVES: dict[str, Primitive] = {p.name: p for p in [
    Primitive("add", 2), Primitive("sub", 2), Primitive("mul", 2), Primitive("div", 2),
    Primitive("neg", 1), Primitive("abs", 1), Primitive("max", 2), Primitive("min", 2),
    # a * b + c, rounded once where the target fuses it fast and twice elsewhere: the math
    # library's polynomial steps (``lower/fastmath.py``), never an operator's own arithmetic,
    # whose product another pass may round on its own
    Primitive("muladd", 3, float_only=True),
    Primitive("pow", 2, float_only=True), Primitive("fmod", 2, float_only=True),
    Primitive("mod", 2),  # integer floor-mod (sign of the divisor), ONNX Mod with fmod=0
    Primitive("sign", 1),
    *(Primitive(f, 1, float_only=True) for f in (
        "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos",
        "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil",
        "rint")),
    # bit-level pieces of the float32 math library (``lower/fastmath.py``), defined on normal
    # floats: 2^k for an integral k in [-126, 127] and +0 for -127 (the exponent field's zero:
    # exp's factors for a result that rounds to 0); the unbiased exponent; the significand
    # scaled into [1, 2), sign kept
    *(Primitive(f, 1, float_only=True) for f in ("exp2i", "logb", "significand")),
    *(Primitive(f, 2, "compare") for f in ("lt", "le", "gt", "ge", "eq", "ne")),
    *(Primitive(f, 1, "compare", float_only=True) for f in ("isnan", "isinf")),
    Primitive("and", 2, "logic"), Primitive("or", 2, "logic"), Primitive("xor", 2, "logic"),
    Primitive("not", 1, "logic"),
]}

REDUCE_KINDS = ("sum", "prod", "max", "min")


def extent(node: Reduce) -> int:
    """The number of points a reduction combines."""
    count = 1
    for _, n in node.axes:
        count *= n
    return count


# --- builders: keep operator definitions short and readable ----------------------------------

def const(value: float | int | bool, dtype: DType) -> Const:
    return Const(dtype, value)


def call(fn: str, *args: Expr, dtype: DType | None = None) -> Call:
    prim = PRIMITIVES[fn]
    if len(args) != prim.arity:
        raise ValueError(f"primitive '{fn}' takes {prim.arity} arguments, got {len(args)}")
    if dtype is None:
        dtype = DType.bool if prim.kind in ("compare", "logic") else args[0].dtype
    return Call(dtype, fn, tuple(args))


def select(cond: Expr, a: Expr, b: Expr) -> Select:
    return Select(a.dtype, cond, a, b)


def cast(value: Expr, dtype: DType) -> Expr:
    return value if value.dtype is dtype else Cast(dtype, value)


def reduce(kind: str, body: Expr, axes: Extents) -> Expr:
    if kind not in REDUCE_KINDS:
        raise ValueError(f"unknown reduction '{kind}'; expected one of {REDUCE_KINDS}")
    return Reduce(body.dtype, kind, body, tuple(axes)) if axes else body


# --- traversal ------------------------------------------------------------------------------

def walk(root: Expr) -> Iterator[Expr]:
    """Every distinct node once, children before parents."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            yield node
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(node.children()))


def transform(root: Expr, fn: Callable[[Expr, Callable[[Expr], Expr]], Expr | None]) -> Expr:
    """Rebuild ``root`` bottom-up. ``fn(node, recurse)`` may return a replacement or None (keep the
    node, rebuilt from transformed children). Shared subtrees are transformed once."""
    # keyed by identity, holding the node too: ``fn`` may recurse into nodes it has just built,
    # and a freed node's id can be reused by the next one (a wrong memo hit)
    memo: dict[int, tuple[Expr, Expr]] = {}

    def visit(node: Expr) -> Expr:
        if id(node) in memo:
            return memo[id(node)][1]
        out = fn(node, visit)
        if out is None:
            out = rebuild(node, [visit(c) for c in node.children()])
        memo[id(node)] = (node, out)
        return out

    return visit(root)


def rebuild(node: Expr, kids: list[Expr]) -> Expr:
    """``node`` with its children replaced by ``kids`` (``node`` itself when they are the same)."""
    if not kids or all(a is b for a, b in zip(kids, node.children())):
        return node
    if isinstance(node, Call):
        return Call(node.dtype, node.fn, tuple(kids))
    if isinstance(node, Select):
        cond, a, b = kids
        # select(c, select(c, x, _), y) -> select(c, x, y), and likewise on the false side:
        # fusion wraps guarded reads in a select on the guard the consumer already tests
        if isinstance(a, Select) and a.cond == cond:
            a = a.if_true
        if isinstance(b, Select) and b.cond == cond:
            b = b.if_false
        return Select(node.dtype, cond, a, b)
    if isinstance(node, Cast):
        return Cast(node.dtype, kids[0])
    if isinstance(node, Reduce):
        return Reduce(node.dtype, node.kind, kids[0], node.axes)
    if isinstance(node, (Read, Load, IndexCond)):
        data = tuple((s, n, v) for (s, n, _), v in zip(node.data, kids))
        return replace(node, data=data)
    raise TypeError(f"cannot rebuild {type(node).__name__}")


def _index_symbols(node: Expr) -> frozenset[sympy.Symbol]:
    own: set[sympy.Basic] = set()
    if isinstance(node, Load):
        own = set(node.offset.free_symbols | node.guard.free_symbols) - {s for s, _, _ in node.data}
    elif isinstance(node, Read):
        used = set(node.guard.free_symbols).union(*(e.free_symbols for e in node.exprs))
        own = used - {s for s, _, _ in node.data}
    elif isinstance(node, IndexCond):
        own = set(node.cond.free_symbols) - {s for s, _, _ in node.data}
    for child in node.children():
        own |= free_index_symbols(child)
    if isinstance(node, Reduce):
        own -= {s for s, _ in node.axes}
    return frozenset(own)  # type: ignore[arg-type]


def free_index_symbols(node: Expr) -> frozenset[sympy.Symbol]:
    """Index symbols ``node`` depends on and does not bind itself. Remembered on the node: a
    cache keyed by the node compared equal-but-distinct subtrees structurally on every lookup
    (half of ResNet-50's compile time went to unrolling's lookups) and kept every node alive."""
    found: frozenset[sympy.Symbol] | None = node.__dict__.get("_index_symbols")
    if found is None:
        found = _index_symbols(node)
        object.__setattr__(node, "_index_symbols", found)
    return found
