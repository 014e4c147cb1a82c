"""What every printer shares, whatever the language: scopes of named sub-expressions (CSE),
printing index arithmetic through a small syntax table, serial reduction loops, and naming.
The C family (``backends/c``) and the Triton printer build on it."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import sympy

from ..dtypes import DType
from ..ir.expr import (Call, Cast, Const, DataBindings, Expr, IndexCond, Load, Reduce, Select,
                       walk)
from ..ir.loop import LoopKernel
from ..mapping_types import FloorDiv, FloorMod
from ..mapping_types.index import is_provably_nonnegative
from .base import Capabilities

INDENT = "    "


@dataclass
class Scope:
    """A block of statements and the expressions already named in it (visible inward)."""

    lines: list[str]
    depth: int
    names: dict[Expr, str] = field(default_factory=dict)
    parent: Scope | None = None

    def lookup(self, node: Expr) -> str | None:
        scope: Scope | None = self
        while scope is not None:
            if node in scope.names:
                return scope.names[node]
            scope = scope.parent
        return None

    def child(self) -> Scope:
        return Scope(self.lines, self.depth + 1, parent=self)

    def add(self, line: str) -> None:
        self.lines.append(INDENT * self.depth + line)


def interleave(blocks: Sequence[Sequence[str]]) -> list[str]:
    """Independent blocks of one-line statements, statement by statement in turn: the first
    statement of every block, then the second, ... Where each block is a long dependency chain
    (an epilogue's erf, one chain a column vector) the chains then overlap in the listing, which
    a C compiler's scheduler mostly keeps. Blocks of different lengths, or holding anything but
    statements at one depth (a nested block), follow one another unchanged."""
    def statement(line: str, indent: str) -> bool:
        code = line.split("//", 1)[0].rstrip()
        return code.endswith(";") and line.startswith(indent) and not line[len(indent)].isspace()

    if len({len(b) for b in blocks}) == 1 and blocks[0]:
        indent = blocks[0][0][:len(blocks[0][0]) - len(blocks[0][0].lstrip())]
        if all(statement(line, indent) for b in blocks for line in b):
            return [line for step in zip(*blocks) for line in step]
    return [line for b in blocks for line in b]


class Emitter:
    """Prints loop-IR expressions. Subclasses fill the syntax tables and the statement hooks."""

    backend = "base"
    # index arithmetic syntax; {a}, {b} are operands, {t} the index type
    ix_div = "{a} / {b}"            # floor division, numerator proven non-negative
    ix_mod = "{a} % {b}"
    # the same by a power of two (None: ix_div, ix_mod). A C compiler cannot tell that our
    # numerator is non-negative, so it emits signed division's sign fix-ups; and PoCL's LLVM
    # spent 44 s building one unrolled 3x3 convolution whose channel shuffle read '% 4'
    # (0.07 s with '& 3')
    ix_shift: str | None = "({a} >> {k})"
    ix_mask: str | None = "({a} & {m})"
    ix_floordiv = "KG_FLOORDIV({a}, {b})"
    ix_floormod = "KG_FLOORMOD({a}, {b})"
    ix_max = "max(({t})({a}), ({t})({b}))"
    ix_min = "min(({t})({a}), ({t})({b}))"
    ix_and, ix_or, ix_not = " && ", " || ", "!{a}"
    ix_true, ix_false = "1", "0"
    comment = "//"  # the language's line comment

    def __init__(self, kernel: LoopKernel, capabilities: Capabilities) -> None:
        capabilities.check(kernel)
        self.kernel = kernel
        self.caps = capabilities
        self.counter = 0
        # domain axes print by position; every other symbol gets an emitter-local name, so the
        # source does not depend on global symbol counters
        self.symbol_names: dict[sympy.Symbol, str] = {
            s: f"o{k}" for k, (s, _) in enumerate(kernel.domain)}
        self.ranges: dict[sympy.Symbol, int] = dict(kernel.ranges)
        self.ranges.update(kernel.domain)
        self.wide = kernel.needs_long_index
        self.buffers = {b.name: b for b in kernel.inputs + kernel.outputs}
        self.arg_names: dict[str, str] = {}  # buffer -> the name its parameter has
        # the math library's expansions (``annotate``), and their copies in rewritten trees
        self.origins = dict(kernel.origins)

    def fresh(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # --- index arithmetic -----------------------------------------------------------------

    @property
    def index_t(self) -> str:
        raise NotImplementedError

    def index(self, e: sympy.Basic) -> str:
        """Text of an integer index expression or guard, floor semantics preserved."""
        if e is sympy.true:
            return self.ix_true
        if e is sympy.false:
            return self.ix_false
        if e.is_Integer:
            return self.int_literal(int(e))
        if e.is_Symbol:
            return self.symbol_names.get(e, str(e))
        if e.is_Add:
            terms = sorted(e.args, key=lambda t: (t.is_Integer, str(t)))
            out = self.index(terms[0])
            for t in terms[1:]:
                coeff, _ = t.as_coeff_Mul()
                if coeff.is_Integer and int(coeff) < 0:
                    out += f" - {self._atom(-t)}"
                else:
                    out += f" + {self.index(t)}"
            return out
        if e.is_Mul:
            return " * ".join(self._atom(a) for a in e.args)
        if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
            return " * ".join([self._atom(e.base)] * int(e.exp))
        if isinstance(e, (FloorDiv, FloorMod)):
            a, d = e.args
            if is_provably_nonnegative(a, self.ranges):
                return self.nonnegative_divmod(isinstance(e, FloorDiv), self._atom(a), d)
            fmt = self.ix_floordiv if isinstance(e, FloorDiv) else self.ix_floormod
            return fmt.format(a=self.index(a), b=self.index(d))
        if isinstance(e, (sympy.Max, sympy.Min)):
            fmt = self.ix_max if isinstance(e, sympy.Max) else self.ix_min
            out = self.index(e.args[0])
            for a in e.args[1:]:
                out = fmt.format(a=out, b=self.index(a), t=self.index_t)
            return out
        if isinstance(e, sympy.And):
            return self.index_and([self._atom(a) for a in e.args])
        if isinstance(e, sympy.Or):
            return self.index_or([self._atom(a) for a in e.args])
        if isinstance(e, sympy.Not):
            return self.ix_not.format(a=self._atom(e.args[0]))
        ops = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
               sympy.GreaterThan: ">=", sympy.Equality: "==", sympy.Unequality: "!="}
        if type(e) in ops:
            lhs, rhs = e.lhs, e.rhs
            const = sum((t for t in sympy.Add.make_args(lhs) if t.is_Integer), sympy.Integer(0))
            if rhs.is_Integer and const != 0:  # o1 - 8 < 0  ->  o1 < 8
                lhs, rhs = lhs - const, rhs - const
            return f"{self.index(lhs)} {ops[type(e)]} {self.index(rhs)}"
        raise TypeError(f"cannot print index expression {e}")

    def nonnegative_divmod(self, div: bool, a: str, d: sympy.Expr | int) -> str:
        """``a // d`` (``div``) or ``a % d`` for a non-negative ``a`` (printed as an atom)."""
        k = int(d) if isinstance(d, int) or d.is_Integer else 0
        pow2 = self.ix_shift if div else self.ix_mask
        if pow2 and k > 1 and k & (k - 1) == 0:
            return pow2.format(a=a, k=k.bit_length() - 1, m=k - 1)
        fmt = self.ix_div if div else self.ix_mod
        return fmt.format(a=a, b=d if isinstance(d, int) else self.index(d))

    def index_and(self, parts: list[str]) -> str:
        return self.ix_and.join(parts)

    def index_or(self, parts: list[str]) -> str:
        return self.ix_or.join(parts)

    def _atom(self, e: sympy.Basic) -> str:
        text = self.index(e)
        simple = e.is_Symbol or (e.is_Integer and int(e) >= 0) or \
            isinstance(e, (sympy.Max, sympy.Min))
        return text if simple or enclosed(text) else f"({text})"

    def int_literal(self, v: int) -> str:
        return str(v)

    # --- scalar expressions -----------------------------------------------------------------

    def literal(self, value: float | int | bool, dtype: DType) -> str:
        raise NotImplementedError

    def expr(self, node: Expr, scope: Scope) -> str:
        """Emit the statements ``node`` needs into ``scope``; return the expression naming it."""
        if isinstance(node, Const):
            return self.literal(node.value, node.dtype)
        named = scope.lookup(node)
        if named is not None:
            return named
        if isinstance(node, Reduce):
            return self.serial_reduce(node, scope)
        text = self._expr_text(node, scope)
        name = self.fresh()
        self.declare(scope, name, node.dtype, text)
        scope.names[node] = name
        self.annotate(scope, node, lambda arg: self.named(arg, scope))
        return name

    def named(self, node: Expr, scope: Scope) -> str | None:
        """What names ``node`` in ``scope`` without emitting anything: a constant's literal,
        or the name of a statement already there; else None."""
        if isinstance(node, Const):
            return self.literal(node.value, node.dtype)
        return scope.lookup(node)

    def annotate(self, scope: Scope, node: Expr, name_of: Callable[[Expr], str | None]
                 ) -> None:
        """After the line that completes an expansion of the math library (``node``), a
        comment naming the call it computes: ``t32 = t29 * t31;  // exp(t1)``. None where an
        argument has no name here (a rewrite folded it into a constant tree): the comment
        must not make the printer compute it."""
        called = self.origins.get(node)
        if called is None:
            return
        fn, args = called
        names = [name_of(a) for a in args]
        if all(names):
            scope.lines[-1] += f"  {self.comment} {fn}({', '.join(map(str, names))})"

    def carry_origins(self, before: Expr, after: Expr) -> None:
        """Let ``annotate`` name the expansions in ``after`` as those in ``before``: ``after``
        is ``before`` with index symbols substituted (a vector epilogue's merged columns, a
        window row's constants), the same tree down to where a substitution folded a node."""
        pairs: dict[Expr, Expr] = {}
        stack = [(before, after)]
        while stack:
            old, new = stack.pop()
            if old in pairs or type(old) is not type(new) or \
                    getattr(old, "fn", None) != getattr(new, "fn", None):
                continue
            pairs[old] = new
            kids, new_kids = old.children(), new.children()
            if len(kids) == len(new_kids):
                stack.extend(zip(kids, new_kids))
        for old, new in pairs.items():
            called = self.origins.get(old)
            if called is not None and new not in self.origins and \
                    all(a in pairs for a in called[1]):
                fn, args = called
                self.origins[new] = (fn, tuple(pairs[a] for a in args))

    def _expr_text(self, node: Expr, scope: Scope) -> str:
        if isinstance(node, Load):
            return self.load(node, scope)
        if isinstance(node, IndexCond):
            self.bind_data(node.data, scope)
            return self.index(node.cond)
        if isinstance(node, Call):
            return self.call_text(node, [self.expr(a, scope) for a in node.args])
        if isinstance(node, Select):
            c, a, b = (self.expr(x, scope) for x in (node.cond, node.if_true, node.if_false))
            return self.select_text(c, a, b)
        if isinstance(node, Cast):
            return self.cast_text(node, self.expr(node.value, scope))
        raise TypeError(f"cannot emit {type(node).__name__}")

    def load(self, node: Load, scope: Scope) -> str:
        """Bind the load's data symbols (gathered indices) and name its guard (shared with the
        Select that tests the same condition), then read the buffer."""
        self.bind_data(node.data, scope)
        guard = None
        if node.guard is not sympy.true:
            guard = self.expr(IndexCond(DType.bool, node.guard), scope)
        return self.load_text(node, guard)

    def bind_data(self, data: DataBindings, scope: Scope) -> None:
        """Declare each data symbol (a gathered index) as an index variable holding its value."""
        for s, n, v in data:
            self.symbol_names[s] = self.fresh("ix")
            self.ranges[s] = n
            self.declare_index(scope, self.symbol_names[s], self.to_index(self.expr(v, scope)))

    # hooks every language provides
    def declare(self, scope: Scope, name: str, dtype: DType, text: str) -> None:
        raise NotImplementedError

    def declare_index(self, scope: Scope, name: str, text: str) -> None:
        raise NotImplementedError

    def load_text(self, node: Load, guard: str | None) -> str:
        """Read ``node``'s buffer; where ``guard`` (a named condition) is false, read 0."""
        raise NotImplementedError

    def to_index(self, value: str) -> str:
        """A loaded integer value converted to the index type."""
        return value

    def call_text(self, node: Call, args: list[str]) -> str:
        raise NotImplementedError

    def select_text(self, cond: str, a: str, b: str) -> str:
        raise NotImplementedError

    def cast_text(self, node: Cast, value: str) -> str:
        raise NotImplementedError

    def open_loop(self, scope: Scope, var: str, start: str, stop: str) -> Scope:
        raise NotImplementedError

    def close_loop(self, scope: Scope) -> None:
        """Called on the scope that opened a loop, once its body is complete."""

    def accumulate(self, scope: Scope, acc: str, node: Reduce, value: str) -> None:
        scope.add(self.statement(f"{acc} = {self.combine(node.kind, node.dtype, acc, value)}"))

    def statement(self, text: str) -> str:
        return text

    # --- reductions -------------------------------------------------------------------------

    reduce_combine: Mapping[tuple[str, str], str] = {}

    def reduce_init(self, node: Reduce) -> str:
        if node.kind == "sum":
            return self.literal(0, node.dtype)
        if node.kind == "prod":
            return self.literal(1, node.dtype)
        if node.dtype.is_float:
            return self.literal(-math.inf if node.kind == "max" else math.inf, node.dtype)
        return self.int_limit(node.dtype, node.kind == "min")

    def int_limit(self, dtype: DType, largest: bool) -> str:
        raise NotImplementedError

    def combine(self, kind: str, dtype: DType, a: str, b: str) -> str:
        fmt = self.reduce_combine.get((kind, "any")) or \
            self.reduce_combine[(kind, "float" if dtype.is_float else "int")]
        return fmt.format(a=a, b=b)

    def declare_acc(self, scope: Scope, name: str, node: Reduce) -> None:
        raise NotImplementedError

    def serial_reduce(self, node: Reduce, scope: Scope) -> str:
        """A reduction as nested loops inside ``scope``; returns its accumulator."""
        return self.serial_reduce_together([node], scope)[0]

    def serial_reduce_together(self, nodes: list[Reduce], scope: Scope) -> list[str]:
        """Reductions over the same axes as one loop nest inside ``scope``, one accumulator
        each, so their bodies share loads; names them and returns the accumulators."""
        accs = [self.fresh("acc") for _ in nodes]
        for node, acc in zip(nodes, accs):
            self.declare_acc(scope, acc, node)
        self.reduce_loops(nodes, scope, accs)
        for node, acc in zip(nodes, accs):
            scope.names[node] = acc
        return accs

    def reduce_loops(self, nodes: list[Reduce], scope: Scope, accs: list[str],
                     start: str = "0") -> None:
        """Loops over the axes ``nodes`` share, combining each body into its accumulator; the
        first axis starts at ``start`` (a vector loop may have covered the positions before
        it)."""
        unroll = all(self.unrolls(n) for n in nodes)
        inner, opened = self.open_reduce_loops(nodes[0], scope, lambda n: unroll, start)
        for node, acc in zip(nodes, accs):
            self.accumulate(inner, acc, node, self.expr(node.body, inner))
        if not unroll:
            self.loop_tail(inner)
        for outer in reversed(opened):
            self.close_loop(outer)

    def open_reduce_loops(self, node: Reduce, scope: Scope, unroll: Callable[[int], bool],
                          start: str = "0") -> tuple[Scope, list[Scope]]:
        """Open one loop per axis of ``node`` (binding its symbol; the first from ``start``),
        with ``unroll_pragma`` before those whose extent ``unroll`` accepts. Returns the
        innermost body and the scopes to close, outermost first."""
        opened: list[Scope] = []
        inner = scope
        for k, (s, n) in enumerate(node.axes):
            name = self.fresh("r")
            self.symbol_names[s] = name
            opened.append(inner)
            if unroll(n) and self.unroll_pragma:
                inner.add(self.unroll_pragma)
            inner = self.open_loop(inner, name, start if k == 0 else "0", self.int_literal(n))
        return inner, opened

    def loop_tail(self, scope: Scope) -> None:
        """Statements at the end of every serial loop body (OpenCL's barrier trick)."""

    unroll_pragma = ""

    def unrolls(self, node: Reduce) -> bool:
        """Whether ``node``'s serial loops are unrolled completely (``unroll_pragma`` before
        each loop; no ``loop_tail``)."""
        return False

    def decompose(self, flat: str, axes: list[tuple[sympy.Symbol, int]], scope: Scope) -> None:
        """Bind each axis symbol from a row-major flat position ``flat`` over ``axes``."""
        stride = 1
        strides = []
        for _, n in reversed(axes):
            strides.append(stride)
            stride *= n
        strides.reverse()
        for k, ((s, n), st) in enumerate(zip(axes, strides)):
            name = self.symbol_names.setdefault(s, self.fresh("r"))
            value = flat if st == 1 else self.nonnegative_divmod(True, flat, st)
            if k > 0:
                value = self.nonnegative_divmod(
                    False, value if st == 1 or enclosed(value) else f"({value})", n)
            self.declare_index(scope, name, value)


def spelling(node: Call, table: Mapping[str, object]) -> str:
    """The key of ``node``'s spelling in ``table``: for a float Max or Min by a number (a Relu's
    0, Clip's bounds) where the table has it, ``max_number`` / ``min_number`` by a number other
    than NaN and zero, ``max_zero`` / ``min_zero`` by +0; else the primitive's name. Max and Min
    propagate NaN; by such a number only the other operand can be NaN, and one ordered compare
    says it (the general form, a compare, a NaN test and their or, made a Clip after a short
    GEMM 1.13x a ReLU's time). By -0 the general form: only it gives -0 against +0."""
    right = node.args[-1]
    if node.fn in ("max", "min") and isinstance(right, Const) and right.dtype.is_float:
        value = float(right.value)
        negative_zero = value == 0 and math.copysign(1.0, value) < 0
        key = f"{node.fn}_{'zero' if value == 0 else 'number'}"
        if not math.isnan(value) and not negative_zero and key in table:
            return key
    return node.fn


def enclosed(text: str) -> bool:
    """Whether ``text`` is one bracketed whole, ``(a & 3)``, not ``(a) / (b)``."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and i < len(text) - 1:
            return False
    return text.startswith("(") and depth == 0


def shape_of(node: Reduce) -> tuple[str, tuple[int, ...], frozenset[str]]:
    """What a reduction's copies share: its kind, its axes' extents, the buffers it reads."""
    return (node.kind, tuple(n for _, n in node.axes),
            frozenset(n.buffer for n in walk(node.body) if isinstance(n, Load)))


def recomputed_inside(node: Reduce, hoisted: tuple[Reduce, ...]) -> bool:
    """Whether another hoisted reduction recomputes ``node``'s reduction inside its body (a
    fused contraction before a softmax: its value at the output point, and the same sum for
    every point of the row inside the max and the exp-sum). Those copies run serially; summed
    in another order (across a work-group, or in vector lanes), the output point's value
    could differ from its copies by an ulp, and a log-softmax over one element gave 7.6e-6
    instead of 0. Such a reduction is summed serially too."""
    shape = shape_of(node)
    return any(isinstance(n, Reduce) and n is not node and shape_of(n) == shape
               for other in hoisted if other is not node for n in walk(other.body))

