"""Explicit vector code for the C family: the printer of an expression as vector code for a run
of lanes, guarded loads included (``VectorPrinter``), in a backend's ``VectorSyntax``; which
expressions it takes is ``vectorizable.py``'s judgement."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import cast

import sympy

from ...dtypes import DType
from ...ir.expr import (Call, Cast, Const, Expr, IndexCond, Load, Reduce, Select,
                        free_index_symbols, walk)
from ...lower.transpose import stride
from ..printer import Emitter, Scope, spelling
from .dots import dot_loop
from .vector_syntax import VectorSyntax as VectorSyntax  # the table's home; imported from here too
from .vectorizable import split_guard, split_lanes, vectorizable


SHORT_LOOP = 8  # a vector reduction's loops up to this long are unrolled


class VectorPrinter:
    """Prints an expression as vector code for lanes ``base .. base+width-1`` of ``sym``, where
    ``base`` names a variable or is a constant. Sub-expressions that do not depend on ``sym``
    were named before the loop and broadcast."""

    def __init__(self, emitter: Emitter, sym: sympy.Symbol, base: str | int, scope: Scope,
                 syntax: VectorSyntax | None, lanes: Mapping[Expr, str] | None = None,
                 transposed: frozenset[Load] = frozenset(),
                 declared: set[str] | None = None) -> None:
        assert syntax is not None, "a vector printer needs the backend's vector syntax"
        self.em, self.v, self.sym, self.scope = emitter, syntax, sym, scope
        self.base = base
        self.base_expr = sympy.Integer(base) if isinstance(base, int) else sympy.Symbol(base)
        self.lane_values: Mapping[Expr, str] = dict(lanes or {})  # nodes already vectors
        self.names: dict[Expr, str] = dict(self.lane_values)
        self.lanes = frozenset(self.lane_values)
        # the lane-number vectors declared in ``scope``: printers that share a scope (a
        # window's rows, each storing the same columns) share the set
        self.declared: set[str] = set() if declared is None else declared
        self.transposed = transposed  # ``transposable_loads``: read as transposed tiles

    def along(self, sym: sympy.Symbol, base: str, scope: Scope) -> VectorPrinter:
        """A printer of this one's emitter and syntax for lanes along ``sym`` from ``base``,
        into ``scope`` (a dot product's reduction axis)."""
        return VectorPrinter(self.em, sym, base, scope, self.v)

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
        self.em.annotate(self.scope, node, self._named)
        return name

    def _named(self, node: Expr) -> str | None:
        """What names ``node`` without emitting anything (``Emitter.named``, broadcast)."""
        if node in self.names:
            return self.names[node]
        scalar = self.em.named(node, self.scope)
        return None if scalar is None else self.v.broadcast.format(scalar)

    def _text(self, node: Expr) -> str:
        if isinstance(node, Load):
            if self._tested(node):
                return self._guarded_load(node)
            return self._read(node)
        if isinstance(node, Call):
            fmt = self.v.functions[spelling(node, self.v.functions)]
            return fmt.format(*(self.expr(a) for a in node.args))
        if isinstance(node, Cast):
            src = cast(Load, node.value)
            return self.v.load_convert[src.dtype.value].format(
                ptr=self.em.arg_names[src.buffer], off=self.em.index(self._at(src.offset, 0)))
        if isinstance(node, Select):
            c, a, b = (self.expr(x) for x in (node.cond, node.if_true, node.if_false))
            fmt = self.v.select_mask if node.dtype is DType.bool and self.v.select_mask \
                else self.v.select
            return fmt.format(c, a, b)
        if isinstance(node, Reduce):
            return self._reduce(node)
        if isinstance(node, IndexCond):
            split = split_guard(node.cond, self.sym) or split_lanes(node.cond, self.sym)
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
        for nodes in outer_reductions(roots, lambda n: n in self.names or not self._varies(n)
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
        axis = nodes[0].axes[0][0] if len(nodes[0].axes) == 1 else None
        reads = [n for n in dict.fromkeys(n for node in nodes for n in walk(node.body))
                 if n in self.transposed and axis is not None and
                 stride(sympy.expand(cast(Load, n).offset), axis) == 1]
        if reads and all(dot_product_ok(node, v, self.lanes) for node in nodes):
            dot_loop(self, nodes, accs)
        elif reads:
            self._transposed_loop(nodes, accs, cast(list[Load], reads))
        else:
            # a window's taps unrolled: straight-line code
            inner, opened = em.open_reduce_loops(nodes[0], self.scope,
                                                 lambda n: n <= SHORT_LOOP)
            inner_printer = VectorPrinter(em, self.sym, self.base, inner, v, self.lane_values,
                                          self.transposed)
            inner_printer.accumulate(nodes, accs)
            for outer in reversed(opened):
                em.close_loop(outer)
        for node, acc in zip(nodes, accs):
            self.names[node] = acc
        return accs

    def accumulate(self, nodes: list[Reduce], accs: list[str]) -> None:
        """Each reduction's body at this printer's position combined into its accumulator, a
        sum of products as one multiply-add (``VectorSyntax.fma``)."""
        v = self.v
        for node, acc in zip(nodes, accs):
            b = node.body
            if node.kind == "sum" and v.fma and isinstance(b, Call) and b.fn == "mul":
                x, y = (self.expr(a) for a in b.args)
                self.scope.add(f"{acc} = {v.fma.format(x, y, acc)};")
            else:
                body = self.expr(b)
                self.scope.add(f"{acc} = {v.combine[node.kind].format(a=acc, b=body)};")

    def _transposed_loop(self, nodes: list[Reduce], accs: list[str], reads: list[Load]
                         ) -> None:
        """The reduction loop ``width`` positions a step: each of ``reads`` (contiguous along
        the reduction, strided along the lanes) as ``width`` vectors along the reduction, one
        per lane, then per position the vector along the lanes composed from one lane of
        each (a transpose in registers), so every load is a whole vector."""
        em, v, w = self.em, self.v, self.v.width
        ((r, n),) = nodes[0].axes
        chunk, name = em.fresh("rc"), em.fresh("r")
        em.symbol_names[r] = name
        self.scope.add(f"for ({em.index_t} {chunk} = 0; {chunk} < {n}; {chunk} += {w}) {{")
        body = self.scope.child()
        transposed = {load: read_transposed(em, v, body, load, (self.sym, self.base_expr),
                                            (r, sympy.Symbol(chunk))) for load in reads}
        for c in range(w):
            body.add("{")
            block = body.child()
            block.add(f"const {em.index_t} {name} = {chunk} + {c};")
            columns: dict[Expr, str] = dict(self.lane_values)
            columns.update({load: cols[c] for load, cols in transposed.items()})
            printer = VectorPrinter(em, self.sym, self.base, block, v, columns, self.transposed)
            printer.accumulate(nodes, accs)
            body.add("}")
        self.scope.add("}")

    def _stride(self, node: Load) -> int:
        return int(sympy.expand(node.offset).coeff(self.sym))

    def _read(self, node: Load, lane: int = 0) -> str:
        """One vector read of ``node`` from lane ``lane`` on, contiguous or every second
        float, untested."""
        load = self.v.load if self._stride(node) == 1 else self.v.load_stride2
        return load.format(ptr=self.em.arg_names[node.buffer],
                           off=self.em.index(self._at(node.offset, lane)))

    def _tested(self, node: Load) -> bool:
        """Whether the vector read needs run-time tests: a guard, or a stride-2 read that
        reads past its last lane's element (which may lie past the buffer)."""
        return node.guard is not sympy.true or (self._stride(node) != 1 and
                                                self.v.stride2_past > 0)

    def _guarded_load(self, node: Load) -> str:
        """A load that reads 0 outside its guard: zero when the lane-free part fails, one
        vector load when the first and last lanes pass (then all do: ``split_guard``), else
        lane by lane; with a constant base, as ``read_together`` reads it. A stride-2 read
        (guarded or not) is one deinterleaving load only where all it reads lies inside the
        buffer. Declares the vector and returns its name."""
        split = split_guard(node.guard, self.sym)
        if split is None:
            return self._masked_load(node)
        uniform, linear = split
        em, v, scope, at = self.em, self.v, self.scope, self._at
        name, lanes = em.fresh("v"), em.fresh("lanes")
        first, last = sympy.Integer(0), sympy.Integer(v.width - 1)
        buffer = em.buffers[node.buffer]
        stride = self._stride(node)
        # the last element the vector read touches: the last lane's, or past it (stride 2)
        read_end = at(node.offset, last) + (v.stride2_past if stride == 2 else 0)
        past_end = read_end < buffer.numel if stride == 2 and v.stride2_past else sympy.true

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
        whole = self._read(node)
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
        self._lane_by_lane(node, linear, name, lanes, block.child())
        block.add("}")
        if uniform is not sympy.true:
            scope.add("}")
        return name

    def _masked_load(self, node: Load) -> str:
        """A contiguous load whose guard each lane tests on its own (``split_lanes``: a padded
        conv's patches over merged output rows, which wrap from one row into the next): zero
        when the lane-free part fails, else one vector read with the failing lanes zeroed
        where it lies inside the buffer, lane by lane where it does not (the map's first and
        last rows). Declares the vector and returns its name."""
        split = split_lanes(node.guard, self.sym)
        assert split is not None, "vectorizable(..., wrapped=True) admits only these guards"
        assert self._stride(node) == 1, "a masked read is contiguous"
        uniform, tests = split
        em, v, scope, at = self.em, self.v, self.scope, self._at
        name, lanes = em.fresh("v"), em.fresh("lanes")
        zero = v.broadcast.format(em.literal(0.0, DType.float32))
        first, last = sympy.Integer(0), sympy.Integer(v.width - 1)
        in_buffer = sympy.And(at(node.offset, first) >= 0,
                              at(node.offset, last) < em.buffers[node.buffer].numel)
        mask = self._lane_mask(tests)
        scope.add(f"{v.vtype} {name} = {zero};")
        block = scope
        if uniform is not sympy.true:
            scope.add(f"if ({em.index(uniform)}) {{")
            block = scope.child()
        block.add(f"if ({em.index(in_buffer)}) {{")
        block.child().add(f"{name} = {v.select.format(mask, self._read(node), zero)};")
        block.add("} else {  // the map's edge: lane by lane")
        self._lane_by_lane(node, tests, name, lanes, block.child())
        block.add("}")
        if uniform is not sympy.true:
            scope.add("}")
        return name

    def _lane_by_lane(self, node: Load, tests: tuple[sympy.Basic, ...], name: str, lanes: str,
                      edge: Scope) -> None:
        """Vector ``name`` read lane by lane in ``edge`` through the array ``lanes``: each
        lane where ``tests`` hold reads ``node``, the others 0 (a read that would leave the
        buffer)."""
        em, v, at = self.em, self.v, self._at
        j = sympy.Symbol("kg_lane")
        em.ranges[j] = v.width  # a lane's row and column tests then divide by '/'
        lane_ok = em.index(sympy.And(*(at(t, j) for t in tests)))
        edge.add(f"float {lanes}[{v.width}];")
        edge.add(f"for (int kg_lane = 0; kg_lane < {v.width}; ++kg_lane)")
        edge.child().add(f"{lanes}[kg_lane] = ({lane_ok}) ? "
                         f"{em.arg_names[node.buffer]}[{em.index(at(node.offset, j))}] : 0.0f;")
        edge.add(f"{name} = {v.load.format(ptr=lanes, off='0')};")

    def _lanes_read(self, node: Load, known: list[int], start: int | None, scope: Scope
                    ) -> str:
        """The vector of ``node``'s lanes ``known`` (zeros elsewhere): one read, moved into
        place from lane ``start`` when some lanes fail (``_shift_start``)."""
        em, v = self.em, self.v
        read = self._read(node, start or 0)
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
        fit a float select). A bound may be a lane's own test (``split_lanes``), which the
        intrinsics' form (linear bounds only) leaves to the lane numbers, or without a
        vector of them to an array."""
        em, v = self.em, self.v
        affine = split_guard(sympy.And(*linear), self.sym) is not None
        if em.index_t == "int" and v.lane_ints and affine:
            # by intrinsics: each bound's lanes against 0
            masks = []
            for t in linear:
                diff = sympy.expand(t.lhs - t.rhs)
                lanes = v.lane_ints.format(first=em.index(self._at(diff, 0)),
                                           step=em.index(diff.coeff(self.sym)))
                masks.append(v.sign_masks[t.rel_op].format(lanes))
            return functools.reduce(v.mask_and.format, masks)
        if em.index_t == "int" and v.iota:  # NEON has no lane-number vector: an array
            name = f"kg_lanes{self.base}" if isinstance(self.base, int) else f"{self.base}_lanes"
            if name not in self.declared:
                self.declared.add(name)
                self.scope.add(f"const {v.mtype} {name} = ({v.mtype})({self.base}) + {v.iota};")
            ids = sympy.Symbol(name, integer=True)
            if self.sym in em.ranges:  # a lane number stays in its run: '/', not KG_FLOORDIV
                em.ranges[ids] = em.ranges[self.sym]
            # '&', not '&&': PoCL's clang folds '&&' of constant vector comparisons to 1 per
            # lane, not -1, and select() reads only the top bit (a constant base's mask)
            return " & ".join(f"({em.index(t.xreplace({self.sym: ids}))})" for t in linear)
        name, lane = em.fresh("mask"), sympy.Symbol("kg_lane")
        self.scope.add(f"int {name}[{v.width}];")
        self.scope.add(f"for (int kg_lane = 0; kg_lane < {v.width}; ++kg_lane)")
        holds = em.index(sympy.And(*(self._at(t, lane) for t in linear)))
        self.scope.child().add(f"{name}[kg_lane] = ({holds}) ? -1 : 0;")
        return (v.mask_load or v.load).format(ptr=name, off="0")


def read_transposed(em: Emitter, v: VectorSyntax, scope: Scope, load: Load,
                    lanes: tuple[sympy.Symbol, sympy.Expr],
                    rows: tuple[sympy.Symbol, sympy.Expr]) -> list[str]:
    """``load`` over a square of ``width`` points, read as whole vectors and transposed in
    registers: one vector along the ``rows`` symbol (from its start) per lane of the ``lanes``
    symbol (from its base), then the square's columns composed lane by lane. Column ``c`` is
    the load at row ``start + c`` as a vector along the lanes. Declares both in ``scope`` and
    returns the columns' names (expressions). LLVM turns the composition into shuffles; an
    explicit network of two-vector shuffles (log2(width) stages) measured no faster on PoCL
    (transposed score rows and a fused 2048^2 transpose, 9 and 5 rounds). A backend whose
    vectors take no lane composition (NEON intrinsics) gives its network as ``transpose``."""
    (lane_sym, base), (row_sym, start) = lanes, rows
    ptr = em.arg_names[load.buffer]
    vectors = []
    for lane in range(v.width):
        vectors.append(em.fresh("row"))
        off = em.index(load.offset.xreplace({lane_sym: base + lane, row_sym: start}))
        scope.add(f"const {v.vtype} {vectors[-1]} = {v.load.format(ptr=ptr, off=off)};")
    if v.transpose:  # the backend's shuffle network (NEON: vtrnq_f32 and vcombine_f32)
        square = em.fresh("cols")
        scope.add(f"const {v.transposed_type} {square} = "
                  f"{v.transpose.format(', '.join(vectors))};")
        return [f"{square}.val[{c}]" for c in range(v.width)]
    columns = [em.fresh("col") for _ in vectors]
    for c, name in enumerate(columns):
        composed = ", ".join(v.lane.format(v=vector, j=c) for vector in vectors)
        scope.add(f"const {v.vtype} {name} = {v.compose.format(composed)};")
    return columns


def dot_product_ok(node: Reduce, syntax: VectorSyntax, lanes: frozenset[Expr] = frozenset()
                   ) -> bool:
    """Whether ``VectorPrinter`` computes the sum ``node`` as a dot product along its one axis
    for each lane (``dots.dot_loop``): every load of its body unguarded and contiguous along the
    axis or free of it, no gathered index, no nested reduction, nothing already a vector
    (``lanes``), and the axis a multiple of the vector width."""
    if not syntax.pair_sum or node.kind != "sum" or node.dtype is not DType.float32 \
            or len(node.axes) != 1 or node.axes[0][1] % syntax.width:
        return False
    for n in walk(node.body):
        if n in lanes or isinstance(n, Reduce) or (
                isinstance(n, (Load, IndexCond)) and n.data) or (
                isinstance(n, Load) and n.guard is not sympy.true):
            return False
    return vectorizable(node.body, node.axes[0][0], syntax)


def transposable_loads(roots: Sequence[Expr], sym: sympy.Symbol, syntax: VectorSyntax
                       ) -> frozenset[Load]:
    """The float32 loads inside one-axis reductions of ``roots`` that read with a stride
    other than 0 or 1 along ``sym`` but contiguously along the reduction's axis, whose extent
    the vector width divides: the keys of Q Kᵀ in a score row computed along the keys.
    ``VectorPrinter`` reads them in dot products along the reduction (``dots.dot_loop``) or as
    transposed tiles (``_transposed_loop``); ``vectorizable`` takes them as ``lanes``. Empty
    where the backend has neither form (without lane syntax: only in sums that take the dot
    products)."""
    transposes = bool(syntax.lane and syntax.compose)
    if not (transposes or syntax.pair_sum):
        return frozenset()
    found: set[Load] = set()
    seen: set[tuple[int, sympy.Symbol | None]] = set()

    def visit(node: Expr, axis: sympy.Symbol | None) -> None:
        if (id(node), axis) in seen:
            return
        seen.add((id(node), axis))
        if isinstance(node, Reduce):
            one = len(node.axes) == 1 and node.axes[0][1] % syntax.width == 0 and (
                transposes or dot_product_ok(node, syntax))
            visit(node.body, node.axes[0][0] if one else None)
            return
        if isinstance(node, Load) and axis is not None and node.dtype is DType.float32 \
                and node.guard is sympy.true and not node.data:
            offset = sympy.expand(node.offset)
            if stride(offset, sym) not in (None, 0, 1) and stride(offset, axis) == 1:
                found.add(node)
        for child in node.children():
            visit(child, axis)

    for root in roots:
        visit(root, None)
    return frozenset(found)


def outer_reductions(roots: Sequence[Expr], done: Callable[[Expr], bool]
                      ) -> list[list[Reduce]]:
    """The reductions of ``roots`` not nested in another and not ``done`` (computed already,
    or outside the loop at hand), grouped by their axes, in order of first appearance."""
    groups: dict[tuple, dict[Reduce, None]] = {}
    seen: set[int] = set()  # a shared node once (the math library's trees reuse theirs a lot)

    def visit(node: Expr) -> None:
        if id(node) in seen or isinstance(node, Const) or done(node):
            return
        seen.add(id(node))
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
    A stride-2 read joins them where it reads no float past its last lane's; other loads are
    left to ``expr``."""
    if not printers:
        return
    v, em, scope = printers[0].v, printers[0].em, printers[0].scope
    zero = v.broadcast.format(em.literal(0.0, DType.float32))
    groups: dict[sympy.Basic, list[tuple[VectorPrinter, Load, list[int], int | None]]] = {}
    for node in dict.fromkeys(loads):
        for p in printers:
            split = None if node in p.names else split_guard(node.guard, p.sym)
            stride = p._stride(node)
            if split is None or node.guard is sympy.true or stride not in (1, 2) or \
                    (stride == 2 and v.stride2_past):
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
