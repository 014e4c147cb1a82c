"""The register-tiled contraction templates' holes that the C family shares
(``<backend>/templates/contraction*.tmpl``): the batch and reduction bindings, the operand
loads, the packed operand's row fill and the guarded epilogue."""
from __future__ import annotations

from collections.abc import Mapping

import sympy

from ...dtypes import DType
from ...ir.expr import Axis, Expr, free_index_symbols
from ...ir.substitute import flatten_axes, flatten_offset, specialise
from ...lower.contraction import Contraction
from ...lower.transpose import stride
from ...shapes import prod
from ..printer import Scope
from .emitter import CEmitter, StoreAt
from .vector import VectorPrinter
from .vectorizable import vectorizable

FLAT_K = sympy.Symbol("kg_k")  # the templates' flat reduction position
FLAT_COL = sympy.Symbol("kg_col")  # and column (the vector epilogue's lanes run along it)


def flat_reduction(c: Contraction, operand: Expr, ranges: Mapping[sympy.Symbol, int]) -> Expr:
    """``operand`` reading the contraction's reduction axes through ``kg_k``, the templates'
    flat reduction position, where its loads walk them as one run (a conv's weights
    ``w[m, c, kh, kw]``): the load then needs no ``kg_k / 9``-style decomposition in the
    innermost loop. Otherwise ``operand`` unchanged. ``ranges`` bounds its symbols."""
    ranges = {**ranges, FLAT_K: prod(n for _, n in c.reduce.axes)}
    unit = {s: 0 for s, n in c.reduce.axes if n == 1}  # a 1x1 conv's kernel axes
    axes = [(s, n) for s, n in c.reduce.axes if n > 1]
    if unit:
        operand = specialise(operand, unit, ranges)
    merged = flatten_axes(operand, axes, FLAT_K) if axes else None
    return operand if merged is None else merged


class ContractionEmitter(CEmitter):
    """A C-family printer of the contraction templates' holes."""

    contraction: Contraction | None = None  # what the 'tiled' schedule runs, when it runs


    def contraction_holes(self, tm: int, tn: int, depth: int, b_row: int | None = None,
                          k_group: int = 1, vector_epilogue: bool = False) -> dict[str, str]:
        """Hole texts shared by the C-family contraction templates: ``batch_bind`` binds the
        batch axes from ``kg_bt`` (the template's batch position), ``k_bind`` the reduction
        axes from ``kg_k``, operand loads ``kg_a[kg_i]``/``kg_b[kg_j]`` (rows and columns past
        the end clamp to the last one), and the guarded epilogue storing ``kg_acc_at`` (the
        template defines it as this element's sum). ``depth`` is the indentation of the
        template's loop bodies. With ``b_row`` (the depth of its loop body), ``b_row`` instead
        of ``b_load``: the loop filling all of ``kg_b``, ``k_group`` rows of it (``_b_row``).
        With ``vector_epilogue``, ``vector_epilogue`` too: the epilogue as vectors of a row's
        columns from ``kg_j`` on, before the scalar loop (``_vector_epilogue``; empty where
        it does not apply)."""
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
        vector = self._vector_epilogue(tm, tn, depth, tile_scope) if vector_epilogue else ""
        return {"batch_bind": "\n".join(tile_scope.lines), "k_bind": "\n".join(k_scope.lines),
                "a_load": "\n".join(a.lines), "b_load": "\n".join(b.lines), "b_row": row,
                "epilogue": "\n".join(out.lines), "vector_epilogue": vector,
                "k_extent": str(prod(n for _, n in c.reduce.axes)), "index_t": t,
                "tm": str(tm), "tn": str(tn), "tiles_r": str(-(-n_rows // tm)),
                "tiles_c": str(-(-n_cols // tn)), "batches": str(prod(n for _, n in batch)),
                "n_rows": str(n_rows), "n_cols": str(n_cols)}

    def _vector_epilogue(self, tm: int, tn: int, depth: int, tile_scope: Scope) -> str:
        """A loop over a tile row's columns ``width`` at a time from ``kg_j``, each vector of
        sums (``kg_acc_v``, from ``kg_sum``) through the epilogue and stored as one vector,
        while the row and the vector's columns are in range; the template's scalar loop does
        the rest. The lanes run along the flat column ``kg_col`` where the columns' axes merge
        into it (``flatten_axes``: a conv's pixels, 49 of them over 7x7), else along the
        innermost column axis where its extent and ``tn`` are multiples of the width (no
        vector crosses a run: a head split's); every store float32, stride 1 along the lanes
        and ``vectorizable``. Otherwise "" (the scalar epilogue: a GELU's erf there cost the
        BERT layer's FFN as much as its product)."""
        k, c, v = self.kernel, self.contraction, self.vector
        assert c is not None
        # a whole number of vectors a tile row: the loop below reloads kg_sum by vectors
        if v is None or not c.cols or tn % v.width or any(buf.dtype is not DType.float32
                                                          for buf in k.outputs):
            return ""
        lanes, stores = frozenset({c.reduce}), self.store_list()
        cols = [k.domain[i] for i in c.cols]
        hoisted = frozenset(k.hoisted)

        def along(sym: sympy.Symbol, chosen: list[StoreAt]) -> list[StoreAt] | None:
            ok = all(stride(sympy.expand(offset), sym) == 1 and
                     vectorizable(value, sym, v, hoisted, lanes=lanes)
                     for _, value, offset in chosen)
            return chosen if ok else None
        merged = [(buf, flatten_axes(value, cols, FLAT_COL, keep=lanes),
                   flatten_offset(offset, cols, FLAT_COL)) for buf, value, offset in stores]
        flat: list[StoreAt] = [(buf, value, offset) for buf, value, offset in merged
                               if value is not None and offset is not None]
        sym = FLAT_COL
        chosen = along(sym, flat) if len(flat) == len(stores) else None
        if chosen is None:
            sym, n = cols[-1]
            if n % v.width or c.cols[-1] != len(k.domain) - 1:
                return ""
            chosen = along(sym, stores)
            if chosen is None:
                return ""
        rows = [k.domain[i] for i in c.rows]
        n_cols = prod(m for _, m in cols)
        t, w = self.index_t, v.width
        body = Scope([], depth, parent=tile_scope)
        body.add(f"const {t} kg_row = kg_tr * {tm} + kg_i, kg_col = kg_tc * {tn} + kg_j;")
        body.add(f"if (kg_row >= {prod(m for _, m in rows)} || kg_col + {w} > {n_cols}) break;")
        self.decompose("kg_row", rows, body)
        if sym is FLAT_COL:
            self.symbol_names[FLAT_COL], self.ranges[FLAT_COL] = "kg_col", n_cols
        else:
            self.decompose("kg_col", cols, body)
        body.add(f"const {v.vtype} kg_acc_v = {v.load.format(ptr='kg_sum[kg_i]', off='kg_j')};")
        printer = VectorPrinter(self, sym, self.symbol_names[sym], body, v,
                                lanes={c.reduce: "kg_acc_v"})
        printer.reduce_together([value for _, value, _ in chosen])
        for buf, value, offset in chosen:
            body.add(v.store.format(ptr=self.arg_names[buf.name], off=self.index(offset),
                                    v=printer.expr(value)))
        pad = "    " * (depth - 1)
        return "\n".join([f"{pad}for (; kg_j < {tn}; kg_j += {w}) {{", *body.lines, f"{pad}}}"])

    def flat_reduction(self, operand: Expr) -> Expr:
        """``flat_reduction`` of ``operand`` under this printer's ranges, which then bound
        ``kg_k`` too."""
        c = self.contraction
        assert c is not None
        self.ranges[FLAT_K] = prod(n for _, n in c.reduce.axes)
        return flat_reduction(c, operand, self.ranges)

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
        printer = VectorPrinter(self, sym, run, lanes, v)
        printer.reduce_together(rows)
        for j, row in enumerate(rows):
            at = f"kg_jv + {j * tn}" if j else "kg_jv"
            store(lanes, j, v.store.format(ptr="kg_b", off=at, v=printer.expr(row)))
        body.add("} else {")
        elements(body.child(), "kg_jv", f"kg_jv + {w}")
        body.add("}")
        outer.add("}")
        return "\n".join(outer.lines)
