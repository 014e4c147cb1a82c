"""What every C-family emitter shares: printing index arithmetic and scalar expressions as C
statements with common subexpressions named once. Backends (OpenCL here, NEON C later) subclass
``CEmitter`` and fill its tables; schedules (how loops map to hardware) stay in the subclasses."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy

from mapping_types import FloorDiv, FloorMod
from mapping_types.index import is_provably_nonnegative

from ..dtypes import DType
from ..errors import UnsupportedError
from ..expr import Call, Cast, Const, Expr, IndexCond, Load, Reduce, Select
from ..loop_ir import Buffer, LoopKernel

INDENT = "    "


@dataclass
class Scope:
    """A block of C statements and the expressions already named in it (inherited inward)."""

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


class CEmitter:
    """Prints the loop IR's expressions as C. Subclasses set the tables below."""

    backend = "c"
    # compute type of each dtype, and how a buffer of that dtype is declared
    scalar_types: Mapping[DType, str] = {}
    # primitive -> C format; '{0}' etc. are the argument expressions. Keys: (name, 'float'|'int')
    float_formats: Mapping[str, str] = {}
    int_formats: Mapping[str, str] = {}
    reduce_combine: Mapping[tuple[str, str], str] = {
        ("sum", "any"): "{a} + {b}", ("prod", "any"): "{a} * {b}",
        ("max", "float"): "fmax({a}, {b})", ("min", "float"): "fmin({a}, {b})",
        ("max", "int"): "max({a}, {b})", ("min", "int"): "min({a}, {b})",
    }

    # Appended to every serial loop body; OpenCL puts a barrier there so PoCL makes its
    # work-item loop the innermost one and vectorises across work-items.
    loop_tail: str | None = None

    def __init__(self, kernel: LoopKernel) -> None:
        self.kernel = kernel
        self.counter = 0
        # domain axes print by position; every other symbol gets an emitter-local name, so the
        # source does not depend on global symbol counters
        self.symbol_names: dict[sympy.Symbol, str] = {
            s: f"o{k}" for k, (s, _) in enumerate(kernel.domain)}
        self.ranges: dict[sympy.Symbol, int] = dict(kernel.ranges)
        self.ranges.update(kernel.domain)
        wide = max([b.numel for b in kernel.inputs + kernel.outputs] + [kernel.numel]) >= 2**31
        self.index_t = "long" if wide else "int"
        self.buffers = {b.name: b for b in kernel.inputs + kernel.outputs}
        self.arg_names = {b.name: f"{_c_ident(b.name)}" for b in kernel.inputs + kernel.outputs}
        self._check_dtypes()

    # --- capabilities ---------------------------------------------------------------------

    def _check_dtypes(self) -> None:
        for b in self.kernel.inputs + self.kernel.outputs:
            if b.dtype not in self.scalar_types:
                raise UnsupportedError(self.backend, f"dtype {b.dtype}", f"buffer '{b.name}'")

    def fresh(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def ctype(self, dtype: DType) -> str:
        return self.scalar_types[dtype.compute]

    # --- index arithmetic -----------------------------------------------------------------

    def index(self, expr: sympy.Basic) -> str:
        """C text of an integer index expression or guard (floor semantics preserved)."""
        e = expr
        if e is sympy.true:
            return "1"
        if e is sympy.false:
            return "0"
        if e.is_Integer:
            v = int(e)
            return f"{v}L" if self.index_t == "long" and abs(v) >= 2**31 else str(v)
        if e.is_Symbol:
            return self.symbol_names.get(e, str(e))
        if e.is_Add:
            terms = sorted(e.args, key=lambda t: (t.is_Integer, str(t)))
            out = self.index(terms[0])
            for t in terms[1:]:
                coeff, rest = t.as_coeff_Mul()
                if coeff.is_Integer and int(coeff) < 0:
                    neg = -t
                    out += f" - {self._atom(neg)}"
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
                op = "/" if isinstance(e, FloorDiv) else "%"
                return f"{self._atom(a)} {op} {self.index(d)}"
            macro = "KG_FLOORDIV" if isinstance(e, FloorDiv) else "KG_FLOORMOD"
            return f"{macro}({self.index(a)}, {self.index(d)})"
        if isinstance(e, (sympy.Max, sympy.Min)):
            fn = "max" if isinstance(e, sympy.Max) else "min"
            out = self.index(e.args[0])
            for a in e.args[1:]:
                out = f"{fn}(({self.index_t})({out}), ({self.index_t})({self.index(a)}))"
            return out
        if isinstance(e, sympy.And):
            return " && ".join(self._atom(a) for a in e.args)
        if isinstance(e, sympy.Or):
            return " || ".join(self._atom(a) for a in e.args)
        if isinstance(e, sympy.Not):
            return f"!{self._atom(e.args[0])}"
        ops = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
               sympy.GreaterThan: ">=", sympy.Equality: "==", sympy.Unequality: "!="}
        if type(e) in ops:
            lhs, rhs = e.lhs, e.rhs
            const = sum((t for t in sympy.Add.make_args(lhs) if t.is_Integer), sympy.Integer(0))
            if rhs.is_Integer and const != 0:  # o1 - 8 < 0  ->  o1 < 8
                lhs, rhs = lhs - const, rhs - const
            return f"{self.index(lhs)} {ops[type(e)]} {self.index(rhs)}"
        raise TypeError(f"cannot print index expression {e}")

    def _atom(self, e: sympy.Basic) -> str:
        text = self.index(e)
        simple = e.is_Symbol or (e.is_Integer and int(e) >= 0) or \
            isinstance(e, (sympy.Max, sympy.Min))
        return text if simple else f"({text})"

    # --- scalar expressions -----------------------------------------------------------------

    def literal(self, value: float | int | bool, dtype: DType) -> str:
        if dtype is DType.bool:
            return "1" if value else "0"
        if dtype.is_int:
            return f"{int(value)}L" if dtype is DType.int64 else str(int(value))
        v = float(value)
        suffix = "" if dtype is DType.float64 else "f"
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(v)
        return f"{text}{suffix}" if ("." in text or "e" in text) else f"{text}.0{suffix}"

    def expr(self, node: Expr, scope: Scope) -> str:
        """Emit the statements ``node`` needs into ``scope``; return the C expression for it."""
        if isinstance(node, Const):
            return self.literal(node.value, node.dtype)
        named = scope.lookup(node)
        if named is not None:
            return named
        text = self._expr_text(node, scope)
        if isinstance(node, Reduce):
            return text  # already a named accumulator
        name = self.fresh()
        scope.add(f"const {self.ctype(node.dtype)} {name} = {text};")
        scope.names[node] = name
        return name

    def _expr_text(self, node: Expr, scope: Scope) -> str:
        if isinstance(node, Load):
            return self.load(node, scope)
        if isinstance(node, IndexCond):
            return self.index(node.cond)
        if isinstance(node, Call):
            args = [self.expr(a, scope) for a in node.args]
            kind = "float" if node.args[0].dtype.is_float else "int"
            table = self.float_formats if kind == "float" else self.int_formats
            if node.fn not in table:
                raise UnsupportedError(self.backend, f"function '{node.fn}' on {kind} values",
                                       f"kernel '{self.kernel.name}'")
            return table[node.fn].format(*args)
        if isinstance(node, Select):
            c, a, b = (self.expr(x, scope) for x in (node.cond, node.if_true, node.if_false))
            return f"{c} ? {a} : {b}"
        if isinstance(node, Cast):
            v = self.expr(node.value, scope)
            if node.dtype is DType.bool:
                return f"({v} != 0)"
            return f"({self.ctype(node.dtype)})({v})"
        if isinstance(node, Reduce):
            return self.serial_reduce(node, scope)
        raise TypeError(f"cannot emit {type(node).__name__}")

    def load(self, node: Load, scope: Scope) -> str:
        for s, _, v in node.data:
            self.symbol_names[s] = self.fresh("ix")
            scope.add(f"const {self.index_t} {self.symbol_names[s]} = "
                      f"({self.index_t})({self.expr(v, scope)});")
            self.ranges[s] = dict((x, n) for x, n, _ in node.data)[s]
        value = self.load_text(self.buffers[node.buffer], self.index(node.offset))
        if node.guard is sympy.true:
            return value
        return f"({self.index(node.guard)}) ? {value} : {self.literal(0, node.dtype)}"

    def load_text(self, buf: Buffer, offset: str) -> str:
        return f"{self.arg_names[buf.name]}[{offset}]"

    def store_text(self, buf: Buffer, offset: str, value: str) -> str:
        return f"{self.arg_names[buf.name]}[{offset}] = {value};"

    # --- reductions -------------------------------------------------------------------------

    def reduce_init(self, node: Reduce) -> str:
        if node.kind == "sum":
            return self.literal(0, node.dtype)
        if node.kind == "prod":
            return self.literal(1, node.dtype)
        if node.dtype.is_float:
            return self.literal(-math.inf if node.kind == "max" else math.inf, node.dtype)
        big = "9223372036854775807L" if node.dtype is DType.int64 else "2147483647"
        return big if node.kind == "min" else f"(-{big} - 1)"

    def combine(self, kind: str, dtype: DType, a: str, b: str) -> str:
        fmt = self.reduce_combine.get((kind, "any")) or \
            self.reduce_combine[(kind, "float" if dtype.is_float else "int")]
        return fmt.format(a=a, b=b)

    def serial_reduce(self, node: Reduce, scope: Scope) -> str:
        """A reduction as nested C loops inside the current scope; returns its accumulator."""
        acc = self.fresh("acc")
        scope.add(f"{self.ctype(node.dtype)} {acc} = {self.reduce_init(node)};")
        self.reduce_loops(node, scope, acc)
        scope.names[node] = acc
        return acc

    def reduce_loops(self, node: Reduce, scope: Scope, acc: str, start: int = 0) -> None:
        """Nested loops combining ``node.body`` into ``acc``; the first axis starts at ``start``
        (a vector loop may have covered the positions before it)."""
        inner = scope
        for k, (s, n) in enumerate(node.axes):
            name = self.fresh("r")
            self.symbol_names[s] = name
            begin = start if k == 0 else 0
            inner.add(f"for ({self.index_t} {name} = {begin}; {name} < {n}; ++{name}) {{")
            inner = inner.child()
        value = self.expr(node.body, inner)
        inner.add(f"{acc} = {self.combine(node.kind, node.dtype, acc, value)};")
        if self.loop_tail:
            inner.add(self.loop_tail)
        for depth in range(len(node.axes)):
            scope.lines.append(INDENT * (scope.depth + len(node.axes) - 1 - depth) + "}")

    def decompose(self, flat: str, axes: list[tuple[sympy.Symbol, int]], scope: Scope) -> None:
        """Declare each axis symbol from a flat row-major position ``flat`` over ``axes``."""
        stride = 1
        strides = []
        for _, n in reversed(axes):
            strides.append(stride)
            stride *= n
        strides.reverse()
        for k, ((s, n), st) in enumerate(zip(axes, strides)):
            name = self.symbol_names.setdefault(s, self.fresh("r"))
            value = flat if st == 1 else f"{flat} / {st}"
            if k > 0:
                value = f"({value}) % {n}" if st != 1 else f"{flat} % {n}"
            scope.add(f"const {self.index_t} {name} = {value};")


def _c_ident(name: str) -> str:
    ident = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return ident if ident and not ident[0].isdigit() else f"v_{ident}"
