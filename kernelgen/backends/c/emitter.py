"""The C family (OpenCL C, NEON C): C statements, types and literals, the per-group body both
backends share (hoisted reductions and staged rows, then the loops over the group's elements
with their stores), and explicit vector loops driven by a per-backend ``VectorSyntax`` table
(``vector.py``)."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

import sympy

from ...dtypes import DType
from ...errors import UnsupportedError
from ...ir.expr import (Axis, Call, Cast, Const, Expr, Load, Reduce, free_index_symbols, transform,
                        walk)
from ...ir.loop import Buffer, LoopKernel, Staged
from ...ir.substitute import specialise
from ...lower.staging import hoist_order
from ...lower.unroll import Unrolled
from ..base import Capabilities
from ..printer import Emitter, Scope, recomputed_inside, spelling
from .vector import VectorPrinter, VectorSyntax, outer_reductions, transposable_loads
from .vectorizable import vector_columns_ok, vector_reduction_ok, vectorizable

StoreAt = tuple[Buffer, Expr, sympy.Expr]  # an output, its value, its flat offset
# Max and Min by a number {1} other than NaN and zero (``printer.spelling``), the number first:
# LLVM's and GCC's x86 backends make one maxps/minps of it (they give the second operand for
# NaN and for equal operands), where '{0} <= {1} ? {1} : {0}' took a compare and a blend;
# equal operands are equal bits. By +0, then + 0: -0 against 0 gives +0, as NumPy's maximum
# and the general form do.
MAX_NUMBER, MIN_NUMBER = "(({1} > {0}) ? {1} : {0})", "(({1} < {0}) ? {1} : {0})"
BY_NUMBER = {"max_number": MAX_NUMBER, "min_number": MIN_NUMBER,
             "max_zero": f"({MAX_NUMBER} + {{1}})", "min_zero": f"({MIN_NUMBER} + {{1}})"}


@dataclass(frozen=True)
class GroupCopy:
    """What a work-item computes for one of its group points: staged rows, hoisted
    reductions and stores (``CEmitter.group_copies``)."""

    staged: tuple[Staged, ...]
    hoisted: tuple[Reduce, ...]
    stores: tuple[StoreAt, ...]


def rename_loads(root: Expr, names: Mapping[str, str]) -> Expr:
    """``root`` with loads of the buffers in ``names`` reading the renamed buffers."""
    if not names:
        return root
    return transform(root, lambda node, _: replace(node, buffer=names[node.buffer])
                     if isinstance(node, Load) and node.buffer in names else None)


class CEmitter(Emitter):
    """C statements. Subclasses set the type tables, the primitive formats and ``vector``."""

    scalar_types: Mapping[DType, str] = {}   # compute type of each dtype
    buffer_types: Mapping[DType, str] = {}   # element type of buffers
    float_formats: Mapping[str, Mapping[DType, str] | str] = {}
    int_formats: Mapping[str, str] = {}
    float_suffix = {DType.float32: "f", DType.float16: "f", DType.float64: ""}
    vector: VectorSyntax | None = None
    # the language's built-ins (names, name prefixes) a parameter named by its tensor must not hide
    reserved_names: frozenset[str] = frozenset()
    reserved_prefixes: tuple[str, ...] = ()
    # whether the vector loop over a group's elements may load through a guard linear in its
    # axis (a padded window: one vector where the guard passes, edges lane by lane)
    guarded_element_vectors = False
    reduce_combine = {
        ("sum", "any"): "{a} + {b}", ("prod", "any"): "{a} * {b}",
        # NaN propagates (NumPy's max, ONNX ReduceMax, MaxPool): fmax/fmin would drop it
        ("max", "float"): "((({a} > {b}) | isnan({a})) ? {a} : {b})",
        ("min", "float"): "((({a} < {b}) | isnan({a})) ? {a} : {b})",
        ("max", "int"): "max({a}, {b})", ("min", "int"): "min({a}, {b})",
    }

    def __init__(self, kernel: LoopKernel, capabilities: Capabilities) -> None:
        super().__init__(kernel, capabilities)
        for b in kernel.inputs + kernel.outputs:
            if b.dtype not in self.scalar_types:
                raise UnsupportedError(self.backend, f"dtype {b.dtype}", f"buffer '{b.name}'")
        names = [b.name for b in kernel.inputs + kernel.outputs]
        self.arg_names = dict(zip(names, c_idents(names, self.reserved_names,
                                                  self.reserved_prefixes)))
        for k, st in enumerate(kernel.staged):  # an array of the group body, read like a buffer
            self.buffers[st.buffer.name] = st.buffer
            # no tensor's identifier starts with kg_ without ending in _ (_c_ident)
            self.arg_names[st.buffer.name] = f"kg_stage{k}"
        self._copies: list[GroupCopy] | None = None

    @property
    def index_t(self) -> str:
        return self.long_t if self.wide else "int"

    long_t = "long"

    def ctype(self, dtype: DType) -> str:
        return self.scalar_types[dtype.compute]

    def int_literal(self, v: int) -> str:
        return f"{v}L" if self.wide and abs(v) >= 2**31 else str(v)

    # --- statements --------------------------------------------------------------------------

    def statement(self, text: str) -> str:
        return text + ";"

    def declare(self, scope: Scope, name: str, dtype: DType, text: str) -> None:
        scope.add(f"const {self.ctype(dtype)} {name} = {text};")

    def to_index(self, value: str) -> str:
        return f"({self.index_t})({value})"

    def declare_index(self, scope: Scope, name: str, text: str) -> None:
        scope.add(f"const {self.index_t} {name} = {text};")

    def declare_acc(self, scope: Scope, name: str, node: Reduce) -> None:
        scope.add(f"{self.ctype(node.dtype)} {name} = {self.reduce_init(node)};")

    def open_loop(self, scope: Scope, var: str, start: str, stop: str) -> Scope:
        scope.add(f"for ({self.index_t} {var} = {start}; {var} < {stop}; ++{var}) {{")
        return scope.child()

    def close_loop(self, scope: Scope) -> None:
        scope.add("}")

    # --- literals and expressions --------------------------------------------------------------

    def literal(self, value: float | int | bool, dtype: DType) -> str:
        if dtype is DType.bool:
            return "1" if value else "0"
        if dtype.is_int:
            return f"{int(value)}L" if dtype is DType.int64 else str(int(value))
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(v)
        text = text if ("." in text or "e" in text) else f"{text}.0"
        return text + self.float_suffix[dtype]

    def int_limit(self, dtype: DType, largest: bool) -> str:
        big = "9223372036854775807L" if dtype is DType.int64 else "2147483647"
        return big if largest else f"(-{big} - 1)"

    def call_text(self, node: Call, args: list[str]) -> str:
        operand = node.args[0].dtype
        table = self.float_formats if operand.is_float else self.int_formats
        fmt = table.get(spelling(node, table))
        if isinstance(fmt, Mapping):  # per-dtype spelling (expf vs exp)
            fmt = fmt.get(operand.compute)
        if fmt is None:
            kind = "float" if operand.is_float else "integer"
            raise UnsupportedError(self.backend, f"function '{node.fn}' on {kind} values",
                                   f"kernel '{self.kernel.name}'")
        return fmt.format(*args)

    def select_text(self, cond: str, a: str, b: str) -> str:
        return f"{cond} ? {a} : {b}"

    def cast_text(self, node: Cast, value: str) -> str:
        if node.dtype is DType.bool:
            return f"({value} != 0)"
        return f"({self.ctype(node.dtype)})({value})"

    def load_text(self, node: Load, guard: str | None) -> str:
        value = self.buffer_load(self.buffers[node.buffer], self.index(node.offset))
        return value if guard is None else f"{guard} ? {value} : {self.literal(0, node.dtype)}"

    def buffer_load(self, buf: Buffer, offset: str) -> str:
        return f"{self.arg_names[buf.name]}[{offset}]"

    def buffer_store(self, buf: Buffer, offset: str, value: str) -> str:
        return f"{self.arg_names[buf.name]}[{offset}] = {value};"

    input_qualifier, output_qualifier = "const ", ""

    def params(self, outputs: bool = True) -> str:
        """The parameter list: inputs, then outputs (unless not ``outputs``), as restrict
        pointers."""
        k = self.kernel
        ins = [f"{self.input_qualifier}{self.buffer_types[b.dtype]}* restrict "
               f"{self.arg_names[b.name]}" for b in k.inputs]
        outs = [f"{self.output_qualifier}{self.buffer_types[b.dtype]}* restrict "
                f"{self.arg_names[b.name]}" for b in k.outputs if outputs]
        return ",\n        ".join(ins + outs)

    def stores(self, scope: Scope, guard: str | None = None,
               stores: Sequence[StoreAt] | None = None) -> None:
        stores = stores or self.store_list()
        self.reduce_together([value for _, value, _ in stores], scope)
        for buf, value, offset in stores:
            store = self.buffer_store(buf, self.index(offset), self.expr(value, scope))
            scope.add(f"if ({guard}) {store}" if guard else store)

    def reduce_together(self, roots: Sequence[Expr], scope: Scope) -> None:
        """Emit the reductions of ``roots`` (those not nested in another) that share their
        axes in one loop nest per axes, each its own accumulator, so their bodies share loads
        (several queries' sums over the same keys); ``expr`` then finds them named."""
        for nodes in outer_reductions(roots, lambda n: scope.lookup(n) is not None):
            if len(nodes) > 1:
                self.serial_reduce_together(nodes, scope)

    def store_list(self) -> list[StoreAt]:
        """Each output with its value, at the domain point's offset."""
        k = self.kernel
        return [(buf, st.value, k.store_offset) for buf, st in zip(k.outputs, k.stores)]

    # --- the body run once per group point -------------------------------------------------------

    def group_body(self, scope: Scope, *, vectorize: bool, guard: str | None = None,
                   element_range: tuple[str, str] | None = None) -> None:
        """Hoisted reductions, then every element of the group with its stores. Assumes the
        group axes are bound. With ``element_range`` the single element axis runs over
        ``[start, stop)`` only (a thread's chunk of a 1-D domain)."""
        k = self.kernel
        copies = self.group_copies()
        orders = [hoist_order(c.staged, c.hoisted) for c in copies]

        def hoist(reductions: list[Reduce]) -> None:
            for r in reductions:
                if vectorize and self._vector_reduction_ok(r) and \
                        not recomputed_inside(r, k.hoisted):
                    self._vector_reduce(r, scope)
                else:
                    self.serial_reduce(r, scope)

        for pos in range(len(k.staged)):  # each after the hoisted reductions it reads
            for order in orders:
                hoist(order[pos])
            self.stage_rows([copy.staged[pos] for copy in copies], scope, vectorize)
        for order in orders:
            hoist(order[-1])
        stores = [s for copy in copies for s in copy.stores]
        elems = [k.domain[e] for e in k.element_axes]
        vector_last = vectorize and self._vector_elements_ok(elems)
        opened: list[Scope] = []
        inner = scope
        loops = elems[:-1] if vector_last else elems
        for pos, (s, n) in enumerate(loops):
            start, stop = "0", self.int_literal(n)
            if element_range and pos == len(elems) - 1:
                start, stop = element_range
            opened.append(inner)
            inner = self.open_loop(inner, self.symbol_names[s], start, stop)
        if vector_last:
            start, stop = element_range or ("0", self.int_literal(elems[-1][1]))
            self.vector_stores(elems[-1], inner, start, stop, guard, stores)
        else:
            self.stores(inner, guard, stores)
            if elems:
                self.loop_tail(inner)
        for outer in reversed(opened):
            self.close_loop(outer)

    # vectors of a staged row, or of a row of reducing stores, computed per step: several share
    # each load of the other operand (OpenCL's key panel: two vectors of keys per query scalar,
    # two of V's columns per weight)
    row_vectors = 1

    def _vectors_a_step(self, n: int, several: bool) -> list[int]:
        """The vectors a step of the vector loops over ``n`` points take, in order: with
        ``several``, ``row_vectors`` first (where the axis holds that many), then one."""
        assert self.vector is not None
        vectors = self.row_vectors if several and n >= self.row_vectors * self.vector.width \
            else 1
        return sorted({vectors, 1}, reverse=True)

    def _shifted(self, values: Sequence[Expr], sym: sympy.Symbol, count: int
                 ) -> list[list[Expr]]:
        """``values`` for each vector ``c`` of a step of ``count`` vectors along ``sym``: at
        the lanes ``c * width`` on (``sym`` shifted; ``c`` = 0 as they are)."""
        assert self.vector is not None
        w = self.vector.width
        return [list(values) if c == 0 else
                [specialise(x, {sym: sym + c * w}, self.ranges) for x in values]
                for c in range(count)]

    def stage_rows(self, rows: Sequence[Staged], scope: Scope, vectorize: bool) -> None:
        """Compute staged producer rows of one extent (one per group point of the work-item)
        into arrays of the group body (``lower/staging.py``), in one loop: with ``vectorize``, as
        vectors along the row where its reads allow (a score row reads the keys' row
        contiguously), the nested contractions vector accumulators in one loop nest, so the
        rows share its loads (the keys, for several queries), ``row_vectors`` vectors a step
        where no read is transposed."""
        n, v = rows[0].buffer.numel, self.vector
        for st in rows:
            scope.add(f"{self.ctype(st.buffer.dtype)} {self.arg_names[st.buffer.name]}[{n}];")
        var = self.fresh("j")
        sym = rows[0].row  # every copy of a staged row keeps its row symbol
        self.symbol_names[sym] = var
        start = "0"
        # keys read along the reduction (Q Kᵀ): transposed in registers
        transposed = transposable_loads([st.value for st in rows], sym, v) \
            if vectorize and v is not None else frozenset()
        if vectorize and v is not None and n >= 2 * v.width and all(vectorizable(
                st.value, sym, v, frozenset(self.hoisted_all), reductions=True,
                lanes=transposed) for st in rows):
            for st in rows:
                self._hoist_invariants(st.value, sym, scope)
            scope.add(f"{self.index_t} {var} = 0;")
            for count in self._vectors_a_step(n, not transposed):
                step = count * v.width
                scope.add(f"for (; {var} + {step} <= {n}; {var} += {step}) {{")
                inner = scope.child()
                printer = VectorPrinter(self, sym, var, inner, v, transposed=transposed)
                shifted = self._shifted([st.value for st in rows], sym, count)
                printer.reduce_together([value for values in shifted for value in values])
                for c, values in enumerate(shifted):
                    off = var if c == 0 else f"{var} + {c * v.width}"
                    for st, value in zip(rows, values):
                        inner.add(v.store.format(ptr=self.arg_names[st.buffer.name], off=off,
                                                 v=printer.expr(value)))
                scope.add("}")
            if n % v.width == 0:
                return
            start = var
            var = self.fresh("j")
            self.symbol_names[sym] = var
        inner = self.open_loop(scope, var, start, self.int_literal(n))
        self.reduce_together([st.value for st in rows], inner)
        for st in rows:
            inner.add(self.buffer_store(st.buffer, var, self.expr(st.value, inner)))
        self.loop_tail(inner)
        self.close_loop(scope)

    # --- several group points per work-item (a staged kernel's query rows) -------------------

    group_plan: Unrolled | None = None  # the group axis split, when the backend tiles it

    @property
    def hoisted_all(self) -> list[Reduce]:
        """The hoisted reductions of every group point the work-item computes."""
        return [r for copy in self.group_copies() for r in copy.hoisted]

    def group_copies(self) -> list[GroupCopy]:
        """The group points one work-item computes: the kernel's own, or with ``group_plan``
        one copy per point of the split axis, specialised to it (``unroll.split``), each with
        its own staged arrays."""
        if self._copies is None:
            self._copies = self._make_copies()
        return self._copies

    def group_axes(self) -> list[Axis]:
        """The axes that index work-items (or a thread's iterations) of a grouped kernel: the
        group axes, the innermost one divided by ``group_plan``'s rows."""
        plan, k = self.group_plan, self.kernel
        if plan is None:
            return [k.domain[g] for g in k.group]
        unrolled = set(plan.copies[0])  # an axis split by its whole extent is gone
        axes = []
        for g in k.group:
            s, n = k.domain[g]
            if s in plan.outer_of:  # the outer part prints like the axis it splits
                outer = plan.outer_of[s]
                self.symbol_names[outer] = self.symbol_names[s]
                self.ranges[outer] = plan.ranges[outer]
                axes.append((outer, plan.ranges[outer]))
            elif s not in unrolled:
                axes.append((s, n))
        return axes

    def _make_copies(self) -> list[GroupCopy]:
        k, plan = self.kernel, self.group_plan
        if plan is None:
            return [GroupCopy(k.staged, k.hoisted, tuple(self.store_list()))]
        taken = set(self.buffers)
        copies = []
        for c, point in enumerate(plan.copies):
            names = {}
            for pos, st in enumerate(k.staged):
                name = f"{st.buffer.name}.{c}"
                while name in taken:
                    name += "_"
                taken.add(name)
                names[st.buffer.name] = name
                self.buffers[name] = replace(st.buffer, name=name)
                self.arg_names[name] = f"kg_stage{pos}_{c}"

            def value(root: Expr, names: dict[str, str] = names,
                      point: dict[sympy.Symbol, sympy.Expr] = point) -> Expr:
                return plan.value(rename_loads(root, names), point)

            staged = tuple(Staged(self.buffers[names[st.buffer.name]], st.row, value(st.value))
                           for st in k.staged)
            # a reduction stays a reduction when specialised
            hoisted = tuple(dict.fromkeys(cast(Reduce, value(r)) for r in k.hoisted))
            stores = tuple((buf, value(v), plan.offset(offset, point))
                           for buf, v, offset in self.store_list())
            copies.append(GroupCopy(staged, hoisted, stores))
        return copies

    def _vector_reduction_ok(self, r: Reduce) -> bool:
        return vector_reduction_ok(r, self.vector)

    def _vector_elements_ok(self, elems: list[Axis]) -> bool:
        k = self.kernel
        if not elems or k.element_axes[-1] != len(k.domain) - 1:
            return False
        return vector_columns_ok(k, self.vector, self.guarded_element_vectors)

    # --- explicit vector loops ------------------------------------------------------------------

    def _hoist_invariants(self, root: Expr, sym: sympy.Symbol, scope: Scope,
                          seen: set[int] | None = None) -> None:
        """Emit, before a vector loop over ``sym``, every largest sub-expression of ``root`` that
        does not depend on ``sym`` (the loop broadcasts the scalar). A nested reduction's body
        stays inside: it reads the reduction's own symbols (``VectorPrinter`` broadcasts there).
        ``seen``: the nodes visited already (a shared node once)."""
        seen = set() if seen is None else seen
        if isinstance(root, Const) or id(root) in seen:
            return
        seen.add(id(root))
        if sym not in free_index_symbols(root) or root in self.kernel.hoisted:
            self.expr(root, scope)
            return
        if isinstance(root, Reduce):
            return
        for child in root.children():
            self._hoist_invariants(child, sym, scope, seen)

    def _vector_reduce(self, node: Reduce, scope: Scope) -> None:
        """``node`` as a vector loop over its axis and a scalar tail; names the result."""
        assert self.vector is not None
        v = self.vector
        (sym, n) = node.axes[0]
        vacc, acc, i = self.fresh("vacc"), self.fresh("acc"), self.fresh("i")
        self._hoist_invariants(node.body, sym, scope)
        scope.add(f"{v.vtype} {vacc} = {v.broadcast.format(self.reduce_init(node))};")
        scope.add(f"{self.index_t} {i} = 0;")
        scope.add(f"for (; {i} + {v.width} <= {n}; {i} += {v.width}) {{")
        inner = scope.child()
        VectorPrinter(self, sym, i, inner, v).accumulate([node], [vacc])
        scope.add("}")
        scope.add(f"{self.ctype(node.dtype)} {acc} = {self._horizontal(node, vacc, scope)};")
        if n % v.width:
            self.symbol_names[sym] = i
            scope.add(f"for (; {i} < {n}; ++{i}) {{")
            tail = scope.child()
            self.accumulate(tail, acc, node, self.expr(node.body, tail))
            scope.add("}")
        scope.names[node] = acc

    def _horizontal(self, node: Reduce, vacc: str, scope: Scope) -> str:
        assert self.vector is not None
        fmt = self.vector.horizontal[node.kind]
        if fmt:
            return fmt.format(v=vacc)
        parts, width = vacc, self.vector.width  # OpenCL vectors: halve with .lo/.hi
        while width > 1:
            width //= 2
            half = self.fresh("h")
            vt = self.ctype(node.dtype) + (str(width) if width > 1 else "")
            combined = self.combine(node.kind, node.dtype, f"{parts}.lo", f"{parts}.hi")
            scope.add(f"const {vt} {half} = {combined};")
            parts = half
        return parts

    def vector_stores(self, axis: Axis, scope: Scope, start: str, stop: str,
                      guard: str | None, stores: Sequence[StoreAt]) -> None:
        """``stores`` for the points ``start`` to ``stop`` of ``axis`` (named in
        ``symbol_names``): a vector loop (``row_vectors`` vectors a step where the stores
        reduce, sharing the reduction's loads of other operands, then one), then point by
        point; values that do not vary along the axis are computed once before it."""
        assert self.vector is not None
        v = self.vector
        sym, n = axis
        for _, value, _ in stores:
            self._hoist_invariants(value, sym, scope)
        i = self.symbol_names[sym]
        scope.add(f"{self.index_t} {i} = {start};")
        reduces = any(isinstance(node, Reduce) for _, value, _ in stores
                      for node in walk(value))
        for count in self._vectors_a_step(n, reduces):
            step = count * v.width
            scope.add(f"for (; {i} + {step} <= {stop}; {i} += {step}) {{")
            inner = scope.child()
            printer = VectorPrinter(self, sym, i, inner, v)
            shifted = self._shifted([value for _, value, _ in stores], sym, count)
            printer.reduce_together([value for values in shifted for value in values])
            for c, values in enumerate(shifted):
                for (buf, _, offset), value in zip(stores, values):
                    at = offset.xreplace({sym: sym + c * v.width})
                    store = v.store.format(ptr=self.arg_names[buf.name], off=self.index(at),
                                           v=printer.expr(value))
                    inner.add(f"if ({guard}) {store}" if guard else store)
            scope.add("}")
        if not (start == "0" and stop.isdigit() and int(stop) % v.width == 0):
            scope.add(f"for (; {i} < {stop}; ++{i}) {{")
            self.stores(scope.child(), guard, stores)
            scope.add("}")


# Names the generated code declares itself: a buffer named like one gets a trailing underscore.
_RESERVED = frozenset({
    "group", "lid", "in_range", "live", "offs", "int", "float", "double", "long", "char", "short",
    "half", "bool", "const", "for", "if", "else", "while", "return", "restrict", "kernel",
    "global", "local", "private", "constant", "uchar", "uint", "ulong", "void", "sizeof",
    "signed", "unsigned", "struct", "union", "static", "inline", "do", "switch", "case",
    "break", "continue", "goto", "default", "auto", "extern", "register", "volatile"})


def c_idents(names: Sequence[str], reserved: frozenset[str] = frozenset(),
             prefixes: tuple[str, ...] = ()) -> list[str]:
    """Distinct C identifiers for the tensor names ``names``, readable where the name is one
    already (``x`` stays ``x``). A name that is not an ASCII identifier is spelt with ``_``; a
    keyword, a built-in of the language (``reserved``, ``prefixes``), a name starting with ``_``
    or ``kg_`` or shaped like the emitter's temporaries gets a trailing ``_``; two names that
    come out the same get more."""
    taken: set[str] = set()
    out = []
    for name in names:
        ident = _c_ident(name, reserved, prefixes)
        while ident in taken:
            ident += "_"  # 'a-b' and 'a_b'; a trailing _ keeps it clear of kg_/temporaries
        taken.add(ident)
        out.append(ident)
    return out


def _c_ident(name: str, reserved: frozenset[str], prefixes: tuple[str, ...]) -> str:
    # ASCII only: not every OpenCL compiler takes UTF-8 identifiers
    ident = "".join(ch if ch.isascii() and (ch.isalnum() or ch == "_") else "_" for ch in name)
    ident = ident if ident and not ident[0].isdigit() else f"v_{ident}"
    if ident.startswith("_"):
        ident = "v" + ident  # __x and _X are reserved to the implementation
    if (ident in _RESERVED or ident in reserved or ident.startswith(prefixes)
            or ident.lower().startswith("kg_") or re.fullmatch(r"[a-z]+\d+", ident)):
        ident += "_"  # t1, o0, acc3 ... are the emitter's own temporaries
    return ident
