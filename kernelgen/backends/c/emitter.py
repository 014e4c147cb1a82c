"""The C family (OpenCL C, NEON C): C statements, types and literals, explicit vector loops driven
by a per-backend ``VectorSyntax`` table, and the per-group body both backends share: hoisted
reductions, then the loops over the group's elements with their stores."""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import sympy

from ...dtypes import DType
from ...errors import UnsupportedError
from ...ir.expr import (Axis, Call, Cast, Const, Expr, IndexCond, Load, Reduce, Select,
                        free_index_symbols, transform, walk)
from ...ir.loop import Buffer, LoopKernel, Staged
from ...ir.substitute import flatten_axes, specialise
from ...lower.contraction import Contraction
from ...lower.staging import hoist_order
from ...lower.unroll import Unrolled
from ...shapes import prod
from ..base import Capabilities
from ..printer import Emitter, Scope

StoreAt = tuple[Buffer, Expr, sympy.Expr]  # an output, its value, its flat offset


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


@dataclass(frozen=True)
class VectorSyntax:
    """How a backend writes ``width``-lane float32 code. Formats take ``{0}``, ``{1}`` operands;
    ``functions`` maps primitives to vector expressions (absent: no vector form)."""

    width: int
    vtype: str                      # float8, float32x4_t
    mtype: str                      # the mask type comparisons return
    load: str                       # {ptr}, {off}
    store: str                      # {ptr}, {off}, {v}
    broadcast: str                  # scalar float -> vector
    broadcast_mask: str             # scalar bool -> mask
    select: str                     # {0} mask, {1} if true, {2} if false
    functions: Mapping[str, str]
    combine: Mapping[str, str]      # reduction kind -> vector combine of {a}, {b}
    horizontal: Mapping[str, str]   # reduction kind -> scalar from vector {v} ('' = halving)
    iota: str = ""                  # the lane numbers as an int mask-type vector ('' = none)
    # Where vectors take no C operators (NEON intrinsics), lane masks are built by call:
    # ``lane_ints`` the int vector {first} + lane * {step}, ``sign_masks`` a mask of an int
    # vector {0} against 0 by relation ('>=', '>', '<=', '<'), ``mask_and`` two masks' lanes
    # joined, ``mask_load`` a mask from a C int array of -1 and 0
    lane_ints: str = ""
    sign_masks: Mapping[str, str] = field(default_factory=dict)
    mask_and: str = "({0}) & ({1})"
    mask_load: str = ""
    # every second element from {ptr} + {off}, reading 2 * width of them ('' = none): a
    # stride-2 window's run (NEON's deinterleaving vld2q_f32)
    load_stride2: str = ""
    fma: str = ""                   # {0} * {1} + {2} fused ('' = none)
    lane: str = ""                  # lane {j} (an int) of vector {v} ('' = none)
    compose: str = ""               # a vector from comma-separated lane values {0} ('' = none)

    @property
    def lane_masks(self) -> bool:
        """Whether the backend builds masks from lane numbers (a guard linear in the axis)."""
        return bool(self.iota or self.lane_ints)


SHORT_LOOP = 8  # a vector reduction's loops up to this long are unrolled


def split_guard(guard: sympy.Basic, sym: sympy.Symbol
                ) -> tuple[sympy.Basic, tuple[sympy.Basic, ...]] | None:
    """``guard`` as (the part free of ``sym``, the linear inequalities in ``sym``), or None
    when it is not such a conjunction. The lanes where linear inequalities hold form one
    interval, so a vector whose first and last lanes pass has every lane inside (a padded
    window's interior)."""
    terms = guard.args if isinstance(guard, sympy.And) else (guard,)
    uniform, linear = [], []
    for term in terms:
        if sym not in term.free_symbols:
            uniform.append(term)
            continue
        if not isinstance(term, sympy.core.relational.Relational) or isinstance(
                term, (sympy.Eq, sympy.Ne)):
            return None
        diff = sympy.expand(term.lhs - term.rhs)
        coeff = diff.coeff(sym)
        if not coeff.is_number or sym in sympy.expand(diff - coeff * sym).free_symbols:
            return None
        linear.append(term)
    return sympy.And(*uniform), tuple(linear)


def vectorizable(root: Expr, sym: sympy.Symbol, syntax: VectorSyntax,
                 hoisted: frozenset[Reduce] = frozenset(), guarded: bool = False,
                 reductions: bool = False) -> bool:
    """Whether ``root`` can run as float32 vectors along ``sym``: primitives with a vector form,
    selects and comparisons; loads contiguous (stride 1) or invariant in ``sym``; index
    conditions and gathered indices free of ``sym``. With ``guarded``, a contiguous load may
    have a guard linear in ``sym`` (``VectorPrinter`` then loads the interior as one vector and
    the edges lane by lane); with ``reductions``, a nested reduction runs as a vector
    accumulator over its axes (AGO's producer inside a consumer's operand)."""

    def ok(node: Expr) -> bool:
        if node in hoisted or sym not in free_index_symbols(node):
            return True  # computed once, outside the vector loop
        if isinstance(node, Reduce):
            return (reductions and node.dtype is DType.float32
                    and node.kind in syntax.combine and ok(node.body))
        if isinstance(node, IndexCond):  # a lane mask from the lane numbers
            return guarded and syntax.lane_masks and split_guard(node.cond, sym) is not None
        if isinstance(node, Load):
            offset = sympy.expand(node.offset)
            coeff = offset.coeff(sym)
            rest = sympy.expand(offset - coeff * sym)
            # otherwise a guarded load stays scalar: a vector would read past the guarded region
            guard_ok = node.guard is sympy.true or (
                guarded and split_guard(node.guard, sym) is not None)
            stride_ok = coeff == 1 or (coeff == 2 and bool(syntax.load_stride2))
            return (node.dtype is DType.float32 and stride_ok and sym not in rest.free_symbols
                    and guard_ok and not node.data)
        if isinstance(node, Call):
            lanes_ok = node.dtype in (DType.float32, DType.bool) and all(
                a.dtype in (DType.float32, DType.bool) for a in node.args)
            return lanes_ok and node.fn in syntax.functions and all(ok(c) for c in node.args)
        if isinstance(node, Select):
            return node.dtype in (DType.float32, DType.bool) and all(
                ok(c) for c in node.children())
        return False  # casts, index conditions on sym, nested reductions: scalar code

    return ok(root)


def vector_columns_ok(kernel: LoopKernel, v: VectorSyntax | None, guarded: bool) -> bool:
    """Whether every store runs as vectors along the innermost domain axis. A reduction left
    in the stores (not hoisted) is computed per element: it runs as one vector accumulator for
    a run of output columns (a staged kernel's P V; a conv's window on NEON)."""
    if v is None or not kernel.domain:
        return False
    sym, n = kernel.domain[-1]
    hoisted = frozenset(kernel.hoisted)
    return n >= 2 * v.width and all(b.dtype is DType.float32 for b in kernel.outputs) and all(
        vectorizable(st.value, sym, v, hoisted, guarded=guarded, reductions=True)
        for st in kernel.stores)


class CEmitter(Emitter):
    """C statements. Subclasses set the type tables, the primitive formats and ``vector``."""

    scalar_types: Mapping[DType, str] = {}   # compute type of each dtype
    buffer_types: Mapping[DType, str] = {}   # element type of buffers
    float_formats: Mapping[str, Mapping[DType, str] | str] = {}
    int_formats: Mapping[str, str] = {}
    float_suffix = {DType.float32: "f", DType.float16: "f", DType.float64: ""}
    vector: VectorSyntax | None = None
    # whether the vector loop over a group's elements may load through a guard linear in its
    # axis (a padded window: one vector where the guard passes, edges lane by lane)
    guarded_element_vectors = False
    contraction: Contraction | None = None  # what the 'tiled' schedule runs, when it runs
    reduce_combine = {
        ("sum", "any"): "{a} + {b}", ("prod", "any"): "{a} * {b}",
        ("max", "float"): "fmax({a}, {b})", ("min", "float"): "fmin({a}, {b})",
        ("max", "int"): "max({a}, {b})", ("min", "int"): "min({a}, {b})",
    }

    def __init__(self, kernel: LoopKernel, capabilities: Capabilities) -> None:
        super().__init__(kernel, capabilities)
        for b in kernel.inputs + kernel.outputs:
            if b.dtype not in self.scalar_types:
                raise UnsupportedError(self.backend, f"dtype {b.dtype}", f"buffer '{b.name}'")
        self.arg_names = {b.name: _c_ident(b.name) for b in kernel.inputs + kernel.outputs}
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
        fmt = table.get(node.fn)
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
        for nodes in _outer_reductions(roots, lambda n: scope.lookup(n) is not None):
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
                if vectorize and self._vector_reduction_ok(r):
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
            self._vector_stores(elems[-1], inner, start, stop, guard, stores)
        else:
            self.stores(inner, guard, stores)
            if elems:
                self.loop_tail(inner)
        for outer in reversed(opened):
            self.close_loop(outer)

    def stage_rows(self, rows: Sequence[Staged], scope: Scope, vectorize: bool) -> None:
        """Compute staged producer rows of one extent (one per group point of the work-item)
        into arrays of the group body (``staging.py``), in one loop: with ``vectorize``, as
        vectors along the row where its reads allow (a score row reads the keys' row
        contiguously), the nested contractions vector accumulators in one loop nest, so the
        rows share its loads (the keys, for several queries)."""
        n, v = rows[0].buffer.numel, self.vector
        for st in rows:
            scope.add(f"{self.ctype(st.buffer.dtype)} {self.arg_names[st.buffer.name]}[{n}];")
        var = self.fresh("j")
        sym = rows[0].row  # every copy of a staged row keeps its row symbol
        self.symbol_names[sym] = var
        start = "0"
        if vectorize and v is not None and n >= 2 * v.width and all(vectorizable(
                st.value, sym, v, frozenset(self.hoisted_all), reductions=True) for st in rows):
            for st in rows:
                self._hoist_invariants(st.value, sym, scope)
            scope.add(f"{self.index_t} {var} = 0;")
            scope.add(f"for (; {var} + {v.width} <= {n}; {var} += {v.width}) {{")
            inner = scope.child()
            printer = VectorPrinter(self, sym, var, inner)
            printer.reduce_together([st.value for st in rows])
            for st in rows:
                value = printer.expr(st.value)
                inner.add(v.store.format(ptr=self.arg_names[st.buffer.name], off=var, v=value))
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
        v = self.vector
        return v is not None and len(r.axes) == 1 and r.axes[0][1] >= 2 * v.width \
            and r.dtype is DType.float32 and vectorizable(r.body, r.axes[0][0], v)

    def _vector_elements_ok(self, elems: list[Axis]) -> bool:
        k = self.kernel
        if not elems or k.element_axes[-1] != len(k.domain) - 1:
            return False
        return vector_columns_ok(k, self.vector, self.guarded_element_vectors)

    # --- the register-tiled contraction (templates/<backend>/contraction.*) ---------------------

    def contraction_holes(self, tm: int, tn: int, depth: int, b_row: int | None = None,
                          k_group: int = 1) -> dict[str, str]:
        """Hole texts shared by the C-family contraction templates: ``batch_bind`` binds the
        batch axes from ``kg_bt`` (the template's batch position), ``k_bind`` the reduction
        axes from ``kg_k``, operand loads ``kg_a[kg_i]``/``kg_b[kg_j]`` (rows and columns past
        the end clamp to the last one), and the guarded epilogue storing ``kg_acc_at`` (the
        template defines it as this element's sum). ``depth`` is the indentation of the
        template's loop bodies. With ``b_row`` (the depth of its loop body), ``b_row`` instead
        of ``b_load``: the loop filling all of ``kg_b``, ``k_group`` rows of it (``_b_row``)."""
        k, c = self.kernel, self.contraction
        assert c is not None
        rows = [k.domain[i] for i in c.rows]
        cols = [k.domain[i] for i in c.cols]
        batch = [k.domain[i] for i in c.batch]
        n_rows, n_cols = prod(n for _, n in rows), prod(n for _, n in cols)
        t = self.index_t
        tile_scope = Scope([], depth - 2)
        self.decompose("kg_bt", batch, tile_scope)
        k_scope = Scope([], depth - 1, parent=tile_scope)
        self.decompose("kg_k", list(c.reduce.axes), k_scope)
        a = Scope([], depth, parent=k_scope)
        a.add(f"const {t} kg_row = kg_min(kg_tr * {tm} + kg_i, ({t}){n_rows - 1});")
        self.decompose("kg_row", rows, a)
        a.add(f"kg_a[kg_i] = {self.expr(self.flat_reduction(c.left), a)};")
        b = Scope([], depth, parent=k_scope)
        row = ""
        if b_row is None:
            b.add(f"const {t} kg_col = kg_min(kg_tc * {tn} + kg_j, ({t}){n_cols - 1});")
            self.decompose("kg_col", cols, b)
            b.add(f"kg_b[kg_j] = {self.expr(self.flat_reduction(c.right), b)};")
        else:
            row = self._b_row(cols, tn, b_row, k_scope, k_group)
        out = Scope([], depth, parent=tile_scope)
        out.add(f"const {t} kg_row = kg_tr * {tm} + kg_i, kg_col = kg_tc * {tn} + kg_j;")
        out.add(f"if (kg_row >= {n_rows} || kg_col >= {n_cols}) continue;")
        self.decompose("kg_row", rows, out)
        self.decompose("kg_col", cols, out)
        out.names[c.reduce] = "kg_acc_at"
        self.stores(out)
        return {"batch_bind": "\n".join(tile_scope.lines), "k_bind": "\n".join(k_scope.lines),
                "a_load": "\n".join(a.lines), "b_load": "\n".join(b.lines), "b_row": row,
                "epilogue": "\n".join(out.lines),
                "k_extent": str(prod(n for _, n in c.reduce.axes)), "index_t": t,
                "tm": str(tm), "tn": str(tn), "tiles_r": str(-(-n_rows // tm)),
                "tiles_c": str(-(-n_cols // tn)), "batches": str(prod(n for _, n in batch)),
                "n_rows": str(n_rows), "n_cols": str(n_cols)}

    def flat_reduction(self, operand: Expr) -> Expr:
        """``operand`` reading the contraction's reduction axes through ``kg_k``, the
        templates' flat reduction position, where its loads walk them as one run (a conv's
        weights ``w[m, c, kh, kw]``): the load then needs no ``kg_k / 9``-style decomposition
        in the innermost loop. Otherwise ``operand`` unchanged."""
        c = self.contraction
        assert c is not None
        flat = sympy.Symbol("kg_k")
        self.ranges[flat] = prod(n for _, n in c.reduce.axes)
        unit = {s: 0 for s, n in c.reduce.axes if n == 1}  # a 1x1 conv's kernel axes
        axes = [(s, n) for s, n in c.reduce.axes if n > 1]
        if unit:
            operand = specialise(operand, unit, self.ranges)
        merged = flatten_axes(operand, axes, flat) if axes else None
        return operand if merged is None else merged

    def _b_row(self, cols: list[Axis], tn: int, depth: int, k_scope: Scope,
               k_group: int = 1) -> str:
        """The loop filling ``kg_b[0 .. tn)`` for one ``kg_k`` (with ``k_group``, the rows
        ``kg_b[j * tn ..]`` for ``kg_k + j``, j < ``k_group``, computed together: an AGO
        producer's channels, whose sums then share each input load and run as independent
        chains). Vectors along the right operand's last column axis wherever a vector's lanes
        lie in one run of it (an im2col patch row: one output row of a conv's window, guarded
        loads through the padding; a producer's sums as vector accumulators); element by
        element elsewhere, and wholly where the operand does not vectorise."""
        c, v, t = self.contraction, self.vector, self.index_t
        assert c is not None
        sym, extent = cols[-1]
        n_cols, k_extent = prod(n for _, n in cols), prod(n for _, n in c.reduce.axes)
        right = self.flat_reduction(c.right)
        assert k_group == 1 or sympy.Symbol("kg_k") in free_index_symbols(right)
        rows = [right]
        outer = Scope([], depth - 1, parent=k_scope)
        for j in range(1, k_group):  # the group's other rows, clamped to the last
            kj = sympy.Symbol(f"kg_k{j}")
            self.ranges[kj] = k_extent
            outer.add(f"const {t} {kj} = kg_min(kg_k + {j}, ({t}){k_extent - 1});")
            rows.append(specialise(right, {sympy.Symbol("kg_k"): kj}, self.ranges))

        def store(scope: Scope, j: int, text: str) -> None:
            if k_extent % k_group and j:  # the last group's rows past the end stay unwritten
                text = f"if (kg_k + {j} < {k_extent}) {text}"
            scope.add(text)

        def elements(scope: Scope, start: str, stop: str) -> None:
            scope.add(f"for (int kg_j = {start}; kg_j < {stop}; ++kg_j) {{")
            lane = scope.child()
            lane.add(f"const {t} kg_col = kg_min(kg_tc * {tn} + kg_j, ({t}){n_cols - 1});")
            self.decompose("kg_col", cols, lane)
            self.reduce_together(rows, lane)
            for j, row in enumerate(rows):
                at = f"{j * tn} + kg_j" if j else "kg_j"
                store(lane, j, f"kg_b[{at}] = {self.expr(row, lane)};")
            scope.add("}")

        if v is None or tn % v.width or not vectorizable(
                right, sym, v, frozenset(self.kernel.hoisted),
                guarded=self.guarded_element_vectors, reductions=True):
            elements(outer, "0", str(tn))
            return "\n".join(outer.lines)
        w = v.width
        outer.add(f"for (int kg_jv = 0; kg_jv < {tn}; kg_jv += {w}) {{")
        body = outer.child()
        body.add(f"const {t} kg_col = kg_tc * {tn} + kg_jv;")
        self.decompose("kg_col", cols, body)
        run = self.symbol_names[sym]
        inside = f"kg_col + {w} <= {n_cols}" if len(cols) == 1 else \
            f"kg_col + {w} <= {n_cols} && {run} + {w} <= {extent}"
        body.add(f"if ({inside}) {{  // {w} lanes in one run")
        lanes = body.child()
        printer = VectorPrinter(self, sym, run, lanes)
        printer.reduce_together(rows)
        for j, row in enumerate(rows):
            at = f"kg_jv + {j * tn}" if j else "kg_jv"
            store(lanes, j, v.store.format(ptr="kg_b", off=at, v=printer.expr(row)))
        body.add("} else {")
        elements(body.child(), "kg_jv", f"kg_jv + {w}")
        body.add("}")
        outer.add("}")
        return "\n".join(outer.lines)

    # --- explicit vector loops ------------------------------------------------------------------

    def _hoist_invariants(self, root: Expr, sym: sympy.Symbol, scope: Scope) -> None:
        """Emit, before a vector loop over ``sym``, every largest sub-expression of ``root`` that
        does not depend on ``sym`` (the loop broadcasts the scalar). A nested reduction's body
        stays inside: it reads the reduction's own symbols (``VectorPrinter`` broadcasts there)."""
        if isinstance(root, Const):
            return
        if sym not in free_index_symbols(root) or root in self.kernel.hoisted:
            self.expr(root, scope)
            return
        if isinstance(root, Reduce):
            return
        for child in root.children():
            self._hoist_invariants(child, sym, scope)

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
        value = VectorPrinter(self, sym, i, inner).expr(node.body)
        inner.add(f"{vacc} = {v.combine[node.kind].format(a=vacc, b=value)};")
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

    def _vector_stores(self, axis: Axis, scope: Scope, start: str, stop: str,
                       guard: str | None, stores: Sequence[StoreAt]) -> None:
        assert self.vector is not None
        v = self.vector
        sym, _ = axis
        for _, value, _ in stores:
            self._hoist_invariants(value, sym, scope)
        i = self.symbol_names[sym]
        scope.add(f"{self.index_t} {i} = {start};")
        scope.add(f"for (; {i} + {v.width} <= {stop}; {i} += {v.width}) {{")
        inner = scope.child()
        printer = VectorPrinter(self, sym, i, inner)
        printer.reduce_together([value for _, value, _ in stores])
        for buf, value, offset in stores:
            store = v.store.format(ptr=self.arg_names[buf.name], off=self.index(offset),
                                   v=printer.expr(value))
            inner.add(f"if ({guard}) {store}" if guard else store)
        scope.add("}")
        if not (start == "0" and stop.isdigit() and int(stop) % v.width == 0):
            scope.add(f"for (; {i} < {stop}; ++{i}) {{")
            self.stores(scope.child(), guard, stores)
            scope.add("}")


class VectorPrinter:
    """Prints an expression as vector code for lanes ``base .. base+width-1`` of ``sym``, where
    ``base`` names a variable or is a constant. Sub-expressions that do not depend on ``sym``
    were named before the loop and broadcast."""

    def __init__(self, emitter: CEmitter, sym: sympy.Symbol, base: str | int, scope: Scope,
                 syntax: VectorSyntax | None = None,
                 lanes: Mapping[Expr, str] | None = None) -> None:
        v = syntax or emitter.vector
        assert v is not None
        self.em, self.v, self.sym, self.scope = emitter, v, sym, scope
        self.base = base
        self.base_expr = sympy.Integer(base) if isinstance(base, int) else sympy.Symbol(base)
        self.lane_values: Mapping[Expr, str] = dict(lanes or {})  # nodes already vectors
        self.names: dict[Expr, str] = dict(self.lane_values)
        self.lanes = frozenset(self.lane_values)
        self.declared: set[str] = set()

    def expr(self, node: Expr) -> str:
        if node in self.names:
            return self.names[node]
        if isinstance(node, Const) or not self._varies(node) or node in self.em.kernel.hoisted:
            scalar = self.em.expr(node, self.scope)
            fmt = self.v.broadcast_mask if node.dtype is DType.bool else self.v.broadcast
            return fmt.format(scalar)
        text = self._text(node)
        if isinstance(node, Reduce) or (isinstance(node, Load) and self._tested(node)):
            self.names[node] = text  # _guarded_load and _reduce declare their vector
            return text
        name = self.em.fresh("v")
        vtype = self.v.mtype if node.dtype is DType.bool else self.v.vtype
        self.scope.add(f"const {vtype} {name} = {text};")
        self.names[node] = name
        return name

    def _text(self, node: Expr) -> str:
        if isinstance(node, Load):
            if self._tested(node):
                return self._guarded_load(node)
            offset = self.em.index(node.offset.xreplace({self.sym: self.base_expr}))
            return self.v.load.format(ptr=self.em.arg_names[node.buffer], off=offset)
        if isinstance(node, Call):
            return self.v.functions[node.fn].format(*(self.expr(a) for a in node.args))
        if isinstance(node, Select):
            c, a, b = (self.expr(x) for x in (node.cond, node.if_true, node.if_false))
            return self.v.select.format(c, a, b)
        if isinstance(node, Reduce):
            return self._reduce(node)
        if isinstance(node, IndexCond):
            split = split_guard(node.cond, self.sym)
            assert split is not None and self.v.lane_masks
            uniform, linear = split
            lanes = self._lane_mask(linear)
            if uniform is sympy.true:
                return lanes
            return self.v.mask_and.format(self.v.broadcast_mask.format(self.em.index(uniform)),
                                          lanes)
        raise TypeError(f"cannot vectorise {type(node).__name__}")

    def _varies(self, node: Expr) -> bool:
        return self.sym in free_index_symbols(node) or (
            bool(self.lanes) and any(n in self.lanes for n in walk(node)))

    def reduce_together(self, roots: Sequence[Expr]) -> None:
        """Emit the vector reductions of ``roots`` (those not nested in another) that share
        their axes in one loop nest per axes, each its own accumulator, so their bodies share
        loads: the score rows of several queries read each row of keys once. ``expr`` then
        finds them named."""
        for nodes in _outer_reductions(roots, lambda n: n in self.names or not self._varies(n)
                                       or n in self.em.kernel.hoisted):
            if len(nodes) > 1:
                self._reduce_group(nodes)

    def _reduce(self, node: Reduce) -> str:
        """A nested reduction as one vector accumulator and serial loops over its axes (each
        lane reduces its own element); declares the accumulator and returns its name."""
        return self._reduce_group([node])[0]

    def _reduce_group(self, nodes: list[Reduce]) -> list[str]:
        """Reductions over the same axes in one loop nest, one vector accumulator each;
        declares and names the accumulators."""
        em, v = self.em, self.v
        accs = [em.fresh("vacc") for _ in nodes]
        for node, acc in zip(nodes, accs):
            self.scope.add(f"{v.vtype} {acc} = {v.broadcast.format(em.reduce_init(node))};")
        # a window's taps unrolled: straight-line code
        inner, opened = em.open_reduce_loops(nodes[0], self.scope, lambda n: n <= SHORT_LOOP)
        inner_printer = VectorPrinter(em, self.sym, self.base, inner, v, self.lane_values)
        for node, acc in zip(nodes, accs):
            b = node.body
            if node.kind == "sum" and v.fma and isinstance(b, Call) and b.fn == "mul":
                x, y = (inner_printer.expr(a) for a in b.args)
                inner.add(f"{acc} = {v.fma.format(x, y, acc)};")
            else:
                body = inner_printer.expr(b)
                inner.add(f"{acc} = {v.combine[node.kind].format(a=acc, b=body)};")
        for outer in reversed(opened):
            em.close_loop(outer)
        for node, acc in zip(nodes, accs):
            self.names[node] = acc
        return accs

    def _stride(self, node: Load) -> int:
        return int(sympy.expand(node.offset).coeff(self.sym))

    def _tested(self, node: Load) -> bool:
        """Whether the vector read needs run-time tests: a guard, or a stride-2 read, which
        reads one element past its last lane (that element may lie past the buffer)."""
        return node.guard is not sympy.true or self._stride(node) != 1

    def _guarded_load(self, node: Load) -> str:
        """A load that reads 0 outside its guard: zero when the lane-free part fails, one
        vector load when the first and last lanes pass (then all do: ``split_guard``), else
        lane by lane; with a constant base, as ``read_together`` reads it. A stride-2 read
        (guarded or not) is one deinterleaving load only where all it reads lies inside the
        buffer. Declares the vector and returns its name."""
        split = split_guard(node.guard, self.sym)
        assert split is not None, "vectorizable(..., guarded=True) admits only these guards"
        uniform, linear = split
        em, v, scope, at = self.em, self.v, self.scope, self._at
        ptr = em.arg_names[node.buffer]
        name, lanes = em.fresh("v"), em.fresh("lanes")
        first, last = sympy.Integer(0), sympy.Integer(v.width - 1)
        buffer = em.buffers[node.buffer]
        stride = self._stride(node)
        # the last element the vector read touches: the last lane's, or one past it (stride 2)
        read_end = at(node.offset, first) + stride * v.width - 1 if stride == 2 else \
            at(node.offset, last)
        past_end = sympy.true if stride == 1 else read_end < buffer.numel

        def binding(term: sympy.Basic) -> sympy.Expr:
            """The lane where ``term`` is tightest: the first for a lower bound on ``sym``."""
            rising = sympy.expand(term.lhs - term.rhs).coeff(self.sym) > 0
            lower = isinstance(term, (sympy.GreaterThan, sympy.StrictGreaterThan))
            return first if rising == lower else last

        zero = v.broadcast.format(em.literal(0.0, DType.float32))
        if stride == 1:
            read_together([self], [node])
            if node in self.names:
                return self.names[node]
        inside = em.index(sympy.And(*(at(t, binding(t)) for t in linear), past_end))
        load = v.load if stride == 1 else v.load_stride2
        whole = load.format(ptr=ptr, off=em.index(at(node.offset, first)))
        mask = self._lane_mask(linear) if v.lane_masks and linear else None
        scope.add(f"{v.vtype} {name} = {zero};")
        block = scope if uniform is sympy.true else None
        if block is None:
            scope.add(f"if ({em.index(uniform)}) {{")
            block = scope.child()
        block.add(f"if ({inside}) {{")
        block.child().add(f"{name} = {whole};")
        if mask is not None:
            # the vector lies inside the buffer (it ran into the next row's elements, say):
            # load it whole and zero the lanes outside the guard
            in_buffer = sympy.And(at(node.offset, first) >= 0, read_end < buffer.numel)
            block.add(f"}} else if ({em.index(in_buffer)}) {{")
            block.child().add(f"{name} = {v.select.format(mask, whole, zero)};")
        block.add("} else {  // an edge: lanes outside the guard read 0")
        edge = block.child()
        j = sympy.Symbol("kg_lane")
        lane_ok = em.index(sympy.And(*(at(t, j) for t in linear)))
        edge.add(f"float {lanes}[{v.width}];")
        edge.add(f"for (int kg_lane = 0; kg_lane < {v.width}; ++kg_lane)")
        edge.child().add(f"{lanes}[kg_lane] = ({lane_ok}) ? "
                         f"{ptr}[{em.index(at(node.offset, j))}] : 0.0f;")
        edge.add(f"{name} = {v.load.format(ptr=lanes, off='0')};")
        block.add("}")
        if uniform is not sympy.true:
            scope.add("}")
        return name

    def _lanes_read(self, node: Load, known: list[int], start: int | None, scope: Scope
                    ) -> str:
        """The vector of ``node``'s lanes ``known`` (zeros elsewhere): one read, moved into
        place from lane ``start`` when some lanes fail (``_shift_start``)."""
        em, v = self.em, self.v
        read = v.load.format(ptr=em.arg_names[node.buffer],
                             off=em.index(self._at(node.offset, start or 0)))
        if len(known) == v.width:
            return read
        assert start is not None
        name, zero = em.fresh("v"), em.literal(0.0, DType.float32)
        scope.add(f"const {v.vtype} {name} = {read};")
        return v.compose.format(", ".join(v.lane.format(v=name, j=j - start) if j in known
                                          else zero for j in range(v.width)))

    def _passes(self, linear: tuple[sympy.Basic, ...], lane: int) -> bool | None:
        """Whether every bound holds at ``lane`` (any integer, also past the vector), or None
        when that depends on more than the lane."""
        holds = sympy.And(*(self._at(t, lane) for t in linear))
        return bool(holds) if holds in (sympy.true, sympy.false) else None

    def _known_lanes(self, linear: tuple[sympy.Basic, ...]) -> list[int] | None:
        """The lanes inside the guard when the constant base decides them, else None."""
        passes = [self._passes(linear, j) for j in range(self.v.width)]
        if any(p is None for p in passes):
            return None
        return [j for j, p in enumerate(passes) if p]

    def _shift_start(self, linear: tuple[sympy.Basic, ...], known: list[int]) -> int | None:
        """For lanes ``known`` (one interval at an edge of the guard, as at a padded window's
        first column), the first lane of a whole vector read that passes the guard, from
        which the lanes move into place: ``(float16)(0.0f, v.s0, ..., v.se)``. None when every
        lane passes, when no such read exists (a run shorter than a vector), when the run's
        extent is unknown or when the backend has no lane syntax."""
        v, w = self.v, self.v.width
        extent = self.em.ranges.get(self.sym)
        if len(known) == w or not (v.lane and v.compose) or extent is None:
            return None
        lo, hi = known[0], known[-1]

        def inside(s: int) -> bool:
            # within the run too: a guard is simplified knowing that the symbol stays in it,
            # so a bound that the run implies is gone from ``linear``
            return 0 <= self.base_expr + s and self.base_expr + s + w - 1 < extent and \
                bool(self._passes(linear, s)) and bool(self._passes(linear, s + w - 1))

        return next((s for s in (lo, hi - w + 1) if inside(s)), None)

    def _at(self, expr: sympy.Basic, lane: sympy.Expr | int) -> sympy.Basic:
        """``expr`` at lane ``lane`` (an integer or a lane-number symbol) of the vector."""
        return expr.xreplace({self.sym: self.base_expr + lane})

    def _lane_mask(self, linear: tuple[sympy.Basic, ...]) -> str:
        """A mask vector of the lanes where every bound in ``linear`` holds (-1 or 0 a lane,
        the form ``select`` and ``&`` expect). With int indices,
        compared as one vector of lane numbers; with long ones lane by lane, since an int
        vector and a long scalar do not mix in OpenCL C (and a long vector's mask would not
        fit a float select)."""
        em, v = self.em, self.v
        if em.index_t == "int" and v.lane_ints:  # by intrinsics: each bound's lanes against 0
            masks = []
            for t in linear:
                diff = sympy.expand(t.lhs - t.rhs)
                lanes = v.lane_ints.format(first=em.index(self._at(diff, 0)),
                                           step=em.index(diff.coeff(self.sym)))
                masks.append(v.sign_masks[t.rel_op].format(lanes))
            return functools.reduce(v.mask_and.format, masks)
        if em.index_t == "int":
            name = f"kg_lanes{self.base}" if isinstance(self.base, int) else f"{self.base}_lanes"
            if name not in self.declared:
                self.declared.add(name)
                self.scope.add(f"const {v.mtype} {name} = ({v.mtype})({self.base}) + {v.iota};")
            ids = sympy.Symbol(name)
            # '&', not '&&': PoCL's clang folds '&&' of constant vector comparisons to 1 per
            # lane, not -1, and select() reads only the top bit (a constant base's mask)
            return " & ".join(f"({em.index(t.xreplace({self.sym: ids}))})" for t in linear)
        name, lane = em.fresh("mask"), sympy.Symbol("kg_lane")
        self.scope.add(f"int {name}[{v.width}];")
        self.scope.add(f"for (int kg_lane = 0; kg_lane < {v.width}; ++kg_lane)")
        holds = em.index(sympy.And(*(self._at(t, lane) for t in linear)))
        self.scope.child().add(f"{name}[kg_lane] = ({holds}) ? -1 : 0;")
        return (v.mask_load or v.load).format(ptr=name, off="0")


def _outer_reductions(roots: Sequence[Expr], done: Callable[[Expr], bool]
                      ) -> list[list[Reduce]]:
    """The reductions of ``roots`` not nested in another and not ``done`` (computed already,
    or outside the loop at hand), grouped by their axes, in order of first appearance."""
    groups: dict[tuple, dict[Reduce, None]] = {}

    def visit(node: Expr) -> None:
        if isinstance(node, Const) or done(node):
            return
        if isinstance(node, Reduce):
            groups.setdefault(node.axes, {})[node] = None
            return
        for child in node.children():
            visit(child)

    for root in roots:
        visit(root)
    return [list(nodes) for nodes in groups.values()]


def read_together(printers: Sequence[VectorPrinter], loads: Iterable[Load]) -> None:
    """Read the guarded ``loads`` at every printer's constant base where the base decides the
    passing lanes, under one test of each lane-free guard part for all of them (a window's
    input row is tested once, not once per vector: 0.15 against 0.24 ms for a depthwise 3x3
    on PoCL); each printer's ``expr`` then finds them named. The printers share one scope.
    Other loads are left to ``expr``."""
    if not printers:
        return
    v, em, scope = printers[0].v, printers[0].em, printers[0].scope
    zero = v.broadcast.format(em.literal(0.0, DType.float32))
    groups: dict[sympy.Basic, list[tuple[VectorPrinter, Load, list[int], int | None]]] = {}
    for node in dict.fromkeys(loads):
        for p in printers:
            split = None if node in p.names else split_guard(node.guard, p.sym)
            if split is None or node.guard is sympy.true:
                continue
            uniform, linear = split
            known = p._known_lanes(linear)
            start = p._shift_start(linear, known) if known else None
            if known is None or (0 < len(known) < v.width and start is None):
                continue
            groups.setdefault(uniform, []).append((p, node, known, start))
    for uniform, group in groups.items():
        tested = uniform is not sympy.true
        names = [em.fresh("v") if known else zero for _, _, known, _ in group]
        block = scope
        if tested:
            for name, (_, _, known, _) in zip(names, group):
                if known:
                    scope.add(f"{v.vtype} {name} = {zero};")
            scope.add(f"if ({em.index(uniform)}) {{")
            block = scope.child()
        for name, (p, node, known, start) in zip(names, group):
            p.names[node] = name
            if known:
                value = p._lanes_read(node, known, start, block)
                block.add(f"{name} = {value};" if tested else f"const {v.vtype} {name} = {value};")
        if tested:
            scope.add("}")


# Names the generated code declares itself: a buffer named like one gets a trailing underscore.
_RESERVED = frozenset({
    "group", "lid", "in_range", "live", "offs", "int", "float", "double", "long", "char", "short",
    "half", "bool", "const", "for", "if", "else", "while", "return", "restrict", "kernel",
    "global", "local", "private", "constant", "uchar", "uint", "ulong", "void", "sizeof",
    "signed", "unsigned", "struct", "union", "static", "inline", "do", "switch", "case",
    "break", "continue", "goto", "default", "auto", "extern", "register", "volatile"})


def _c_ident(name: str) -> str:
    ident = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    ident = ident if ident and not ident[0].isdigit() else f"v_{ident}"
    if ident in _RESERVED or ident.startswith("kg_") or re.fullmatch(r"[a-z]+\d+", ident):
        ident += "_"  # t1, o0, acc3 ... are the emitter's own temporaries
    return ident


def extent(r: Reduce) -> int:
    return prod(n for _, n in r.axes)
