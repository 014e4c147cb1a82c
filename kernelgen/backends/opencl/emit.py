"""The OpenCL printer: a schedule (``schedule.py``) printed as one ``__kernel`` and its NDRange
launches. It decides nothing: every choice is a field of the ``OpenCLSchedule`` it is given.
The skeletons are in ``templates/``; the schedules are described in ``schedule.py``."""
from __future__ import annotations

import sympy

from ...dtypes import DType
from ...ir.expr import Axis, Expr, Reduce, extent
from ...ir.loop import Buffer
from ...ir.substitute import specialise
from ...lower import unroll
from ...shapes import prod
from ...version import __version__
from .. import templates
from ..base import Capabilities
from ..c.contraction import FLAT_K, ContractionEmitter
from ..c.vector import VectorPrinter
from ..printer import Scope, recomputed_inside
from . import element_vectors, interleaved, panel, tile_stores, transposed, window
from .language import (BARRIER, BUFFER_TYPES, FLOAT, INT, RESERVED_NAMES, RESERVED_PREFIXES,
                       SCALAR_TYPES, VECTOR, Launch, OpenCLSource, stride2_helpers,
                       vector_syntax)
from .element_columns import COLUMNS_VECTORS
from .schedule import PACK_LOCAL, UNROLLED_LANES, OpenCLSchedule, TilePlan, TransposedReads
from .window import WindowPlan


def render(schedule: OpenCLSchedule, caps: Capabilities) -> OpenCLSource:
    """``schedule.loop`` as OpenCL C, as ``schedule`` says."""
    text, launch = OpenCLPrinter(schedule, caps).emit()
    name = schedule.loop.name
    return OpenCLSource(text, launch.metadata(name), {}, name, launch)


class OpenCLPrinter(ContractionEmitter):
    backend = "opencl"
    scalar_types = SCALAR_TYPES
    buffer_types = BUFFER_TYPES
    float_formats = FLOAT
    int_formats = INT  # also bool, whose logic ops live here
    vector = VECTOR
    input_qualifier, output_qualifier = "__global const ", "__global "
    unroll_pragma = '_Pragma("unroll")'
    ix_and, ix_or = " & ", " | "  # guards without branches, as language.py's _LOGIC says
    reserved_names, reserved_prefixes = RESERVED_NAMES, RESERVED_PREFIXES

    def __init__(self, schedule: OpenCLSchedule, caps: Capabilities) -> None:
        super().__init__(schedule.loop, caps)
        self.sched = schedule
        self.local = schedule.local_size or 1  # the work-group size _ndrange aims at
        # 'item' loops end in a barrier: PoCL then runs the work-items as the innermost,
        # vectorised loop
        self._barrier_loops = schedule.kind == "item"
        if schedule.kind in ("row", "item"):  # several group points (queries) per work-item
            self.group_plan = unroll.split_group(self.kernel, schedule.group_rows or 1)
        if isinstance(schedule.plan, panel.KeyPanel):  # read like a buffer, in local memory
            self.buffers[panel.NAME] = schedule.plan.buffer
            self.arg_names[panel.NAME] = panel.NAME
        if schedule.kind == "row":
            self.row_vectors = schedule.row_vectors or 1
        if schedule.vector_width not in (None, VECTOR.width) and schedule.kind == "row":
            self.vector = vector_syntax(schedule.vector_width)
        if schedule.kind == "columns":  # padded and stride-2 reads as vectors too
            assert schedule.vector_width is not None
            self.vector = vector_syntax(schedule.vector_width, stride2=True)
            self.guarded_element_vectors = True

    def loop_tail(self, scope: Scope) -> None:
        if self._barrier_loops:
            scope.add(BARRIER)

    def unrolls(self, node: Reduce) -> bool:
        return extent(node) <= self.sched.unroll_loops

    # --- buffers ----------------------------------------------------------------------------

    def buffer_load(self, buf: Buffer, offset: str) -> str:
        if buf.dtype is DType.float16:
            return f"vload_half({offset}, {self.arg_names[buf.name]})"
        return super().buffer_load(buf, offset)

    def buffer_store(self, buf: Buffer, offset: str, value: str) -> str:
        if buf.dtype is DType.float16:
            return f"vstore_half_rte({value}, {offset}, {self.arg_names[buf.name]});"
        if buf.dtype is DType.bool:
            value = f"(uchar)({value})"
        return super().buffer_store(buf, offset, value)

    # --- schedules ----------------------------------------------------------------------------

    def emit(self) -> tuple[str, Launch]:
        k = self.kernel
        needs_double = any(b.dtype is DType.float64 for b in k.inputs + k.outputs)
        head = templates.render("opencl", "preamble.cl", version=__version__)
        if needs_double:
            head = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" + head
        body, launch = {"elementwise": self._elementwise, "group": self._group,
                        "item": self._item, "row": self._row,
                        "tiled": self._tiled, "window": self._window,
                        "columns": self._columns}[self.sched.kind]()
        return head + "\n" + stride2_helpers(body) + body, launch

    def ndrange(self, axes: list[Axis], scope: Scope, clamp: bool = False,
                 lanes: int = 1, explicit_vectors: bool = False,
                 dim0_max: int | None = None) -> Launch:
        """Map ``axes`` (outermost first) to NDRange dims: innermost -> 0, next -> 1, rest -> 2.

        Work-items past the end return early, or with ``clamp`` recompute the last point and set
        ``in_range`` to 0 (kernels with barriers must not return early). With ``lanes``, the
        work-group's dimension 0, when longer, is a multiple of it (idle items return). With
        ``explicit_vectors`` the test on dimension 0 is there even when no item is idle: PoCL
        then runs the work-items one after the other instead of vectorising across them, which
        split a depthwise conv's float16 reads into 8-byte pieces (0.14 against 0.08 ms).
        ``dim0_max`` caps the work-group's dimension 0."""
        if not axes:
            if clamp:
                scope.add("const int in_range = 1;")
            return Launch((1,), (1,))
        dims = [[axes[-1]]] + ([[axes[-2]]] if len(axes) > 1 else [])
        if len(axes) > 2:
            dims.append(list(axes[:-2]))
        sizes = [prod(n for _, n in d) for d in dims]
        width_0 = -(-sizes[0] // lanes) * lanes if sizes[0] > lanes else sizes[0]
        limits = self.caps.max_item_sizes
        if dim0_max is not None:
            limits = (min(dim0_max, limits[0]), *limits[1:]) if limits else \
                (dim0_max, 1 << 30, 1 << 30)
        local = _local_shape([width_0, *sizes[1:]], self.local, limits)
        global_ = _covering(sizes, local)
        checks = []
        for dim, (d, size) in enumerate(zip(dims, sizes)):
            gid = f"({self.index_t})get_global_id({dim})"
            if clamp and global_[dim] != size:
                raw = self.fresh("gid")
                scope.add(f"const {self.index_t} {raw} = {gid};")
                checks.append(f"{raw} >= {size}")
                gid = f"min({raw}, ({self.index_t}){size - 1})"
            if len(d) == 1:
                name = self.symbol_names[d[0][0]]
                scope.add(f"const {self.index_t} {name} = {gid};")
            else:
                flat = self.fresh("flat")
                scope.add(f"const {self.index_t} {flat} = {gid};")
                self.decompose(flat, d, scope)
                name = flat
            if (global_[dim] != size or (explicit_vectors and dim == 0)) and not clamp:
                checks.append(f"{name} >= {size}")
        if clamp:
            scope.add(f"const int in_range = !({' || '.join(checks) or '0'});")
        elif checks:
            scope.add(f"if ({' || '.join(checks)}) return;")
        return Launch(global_, local)

    def _elementwise(self) -> tuple[str, Launch]:
        index, body = Scope([], 1), Scope([], 1)
        if isinstance(self.sched.plan, TransposedReads):
            assert self.sched.vector_width is not None
            launch = transposed.print_kernel(self, self.sched.plan, self.sched.vector_width,
                                             self.ndrange, index, body)
        elif isinstance(self.sched.plan, interleaved.Interleaved):
            launch = interleaved.print_kernel(self, self.sched.plan, self._split, self.ndrange,
                                              index, body)
        elif isinstance(self.sched.plan, element_vectors.ElementVectors):
            launch = element_vectors.print_kernel(self, self.sched.plan, self.ndrange, index,
                                                  body)
        elif self.sched.unroll == unroll.none(self.kernel):
            launch = self.ndrange(list(self.kernel.domain), index)
            self.stores(body)
        else:
            launch = self._unrolled(index, body)
        src = templates.render("opencl", "elementwise.cl", name=self.kernel.name,
                               params=self.params(), index="\n".join(index.lines),
                               body="\n".join(body.lines))
        return src, launch

    def _unrolled(self, index: Scope, body: Scope) -> Launch:
        """Work-items over the axes the schedule's ``unroll`` leaves parallel; each stores every
        copy, specialised to its constants, so copies share their loads and partial sums."""
        k = self.kernel
        assert self.sched.unroll is not None
        plan = self._split(self.sched.unroll)
        # PoCL vectorises a work-group's items along dimension 0 by UNROLLED_LANES; a group 28
        # items wide ran its last 12 items as scalar code (Winograd's input transform: 0.78 ms,
        # against 0.53 ms 32 wide with 4 idle items)
        launch = self.ndrange(list(plan.parallel), index, lanes=UNROLLED_LANES)
        for copy, guard in zip(plan.copies, plan.guards):
            offset = self.index(plan.offset(k.store_offset, copy))
            for buf, st in zip(k.outputs, k.stores):
                value = self.expr(plan.value(st.value, copy), body)
                store = self.buffer_store(buf, offset, value)
                # a copy past an axis's end: its loads stay inside (unroll.check), not its store
                body.add(store if guard is sympy.true else f"if ({self.index(guard)}) {store}")
        return launch

    def _split(self, factors: tuple[int, ...]) -> unroll.Unrolled:
        """``unroll.split``, with the outer parts of split axes bound: in range, and named
        like the axis they split."""
        plan = unroll.split(self.kernel, factors)
        self.ranges.update(plan.ranges)
        for s, outer in plan.outer_of.items():
            self.symbol_names[outer] = self.symbol_names[s]
        return plan

    def _item(self) -> tuple[str, Launch]:
        k = self.kernel
        index, body = Scope([], 1), Scope([], 1)
        launch = self.ndrange(self.group_axes(), index, clamp=True)
        self.group_body(body, vectorize=False, guard="in_range")
        src = templates.render("opencl", "item_reduce.cl", name=k.name, params=self.params(),
                               index="\n".join(index.lines), body="\n".join(body.lines))
        return src, launch

    def _group(self) -> tuple[str, Launch]:
        k = self.kernel
        local = _pow2_floor(min(self.local, max(extent(r) for r in k.hoisted)))
        local = max(local, 1)
        index, body = Scope([], 1), Scope([], 1)
        group_axes = [k.domain[g] for g in k.group]
        if group_axes:
            self.decompose("group", group_axes, index)
        scratch_types = sorted({self.ctype(r.dtype) for r in k.hoisted})
        scratch = "\n".join(f"    __local {t} scratch_{t}[{local}];" for t in scratch_types)
        for r in k.hoisted:
            if recomputed_inside(r, k.hoisted):
                self.expr(r, body)  # serially, in the order of its copies inside the others
            else:
                self._cooperative_reduce(r, body, local)
        elems = [k.domain[e] for e in k.element_axes]
        count = prod(n for _, n in elems)
        if count == 1:  # a plain reduction: one value per group
            self.stores(body, guard="lid == 0")
        else:
            pos = self._uniform_loop(count, local, body)
            inner = body.child()
            self.decompose(pos, elems, inner)
            self.stores(inner, guard=f"{pos}_ok")
            inner.add(BARRIER)
            body.add("}")
        src = templates.render("opencl", "group_reduce.cl", name=k.name, params=self.params(),
                               local=str(local), index_t=self.index_t, scratch=scratch,
                               index="\n".join(index.lines), body="\n".join(body.lines))
        groups = prod(n for _, n in group_axes)
        return src, Launch((groups * local,), (local,))

    def _uniform_loop(self, count: int, local: int, scope: Scope) -> str:
        """Open ``for`` over ``count`` positions split across the group, with the same trip count
        in every work-item: the barrier at the end of the body then makes PoCL run the
        work-items as the innermost (vectorised) loop. Past the end, the position is clamped and
        ``<pos>_ok`` is 0. Returns the position variable. (The clamp is a ``min``: Intel's CPU
        runtime stored every work-item's value from the last one's when it was the equivalent
        ``<pos>_ok ? base + lid : count - 1``.)"""
        base, pos = self.fresh("base"), self.fresh("p")
        scope.add(f"for ({self.index_t} {base} = 0; {base} < {count}; {base} += {local}) {{")
        scope.add(f"    const int {pos}_ok = {base} + lid < {count};")
        scope.add(f"    const {self.index_t} {pos} = min({base} + lid, "
                  f"({self.index_t}){count - 1});")
        return pos

    def _cooperative_reduce(self, node: Reduce, scope: Scope, local: int) -> None:
        t = self.ctype(node.dtype)
        acc = self.fresh("acc")
        scope.add(f"{t} {acc} = {self.reduce_init(node)};")
        pos = self._uniform_loop(extent(node), local, scope)
        inner = scope.child()
        self.decompose(pos, list(node.axes), inner)
        value = self.expr(node.body, inner)
        combined = self.combine(node.kind, node.dtype, acc, value)
        inner.add(f"{acc} = {pos}_ok ? {combined} : {acc};")
        inner.add(BARRIER)
        scope.add("}")
        buf = f"scratch_{t}"
        scope.add(f"{buf}[lid] = {acc};")
        scope.add("barrier(CLK_LOCAL_MEM_FENCE);")
        scope.add(f"for (int s = {local // 2}; s > 0; s >>= 1) {{")
        scope.add(f"    if (lid < s) {buf}[lid] = "
                  f"{self.combine(node.kind, node.dtype, f'{buf}[lid]', f'{buf}[lid + s]')};")
        scope.add("    barrier(CLK_LOCAL_MEM_FENCE);")
        scope.add("}")
        result = self.fresh("red")
        scope.add(f"const {t} {result} = {buf}[0];")
        scope.add("barrier(CLK_LOCAL_MEM_FENCE);  // scratch is reused by the next reduction")
        scope.names[node] = result

    # --- 'tiled': register-tiled contraction (templates/contraction*.cl.tmpl) ------------------

    def _tiled(self) -> tuple[str, Launch]:
        plan = self.sched.plan
        assert isinstance(plan, TilePlan) and self.sched.tile is not None
        self.contraction = plan.contraction
        if plan.columns is not None:
            return self._tiled_vector(plan)
        # the scalar template (outputs other than float32)
        tm, tn = self.sched.tile
        holes = self.contraction_holes(tm, tn, depth=3)
        sizes = [int(holes["tiles_c"]), int(holes["tiles_r"]), int(holes["batches"])]
        local = _local_shape(sizes, self.local, self.caps.max_item_sizes)
        src = templates.render("opencl", "contraction.cl", name=self.kernel.name,
                               params=self.params(), **holes)
        return src, Launch(_covering(sizes, local), local)

    def _tiled_vector(self, plan: TilePlan) -> tuple[str, Launch]:
        """Holes of contraction_vec.cl.tmpl: the right operand as ``vloadN`` of its contiguous
        run (prologue in vector code) or, when it has none, lane by lane; with ``pack``, its
        panels filled first (``_packed``)."""
        k, c, cols = self.kernel, plan.contraction, plan.columns
        assert cols is not None and self.sched.tile is not None
        t, w = self.index_t, cols.width
        tm, tn = self.sched.tile
        n_rows = prod(k.domain[i][1] for i in c.rows)
        outer = [k.domain[i] for i in c.cols if i not in cols.run]
        tiles_run = -(-prod(k.domain[i][1] for i in cols.run) // tn)
        tile = self._column_tile(plan, outer, tiles_run)
        k_scope = Scope([], 2, parent=tile)
        self.decompose("kg_k", list(c.reduce.axes), k_scope)
        k_extent = prod(n for _, n in c.reduce.axes)
        self.ranges[FLAT_K] = k_extent
        b, a_bind, left = self._right_tile(plan, k_scope)
        in_tile = bool(self.sched.pack_in_tile)
        if in_tile:  # the row tiles sweep the panel one position a step, whatever its groups
            left = plan.left
        a = Scope([], 4, parent=k_scope)  # within the kg_g and kg_i loops
        a.add(f"const {t} kg_row = kg_r0 + kg_i;")
        self.decompose("kg_row", [k.domain[i] for i in c.rows], a)
        a_value = self.expr(left, a)
        if k_extent % plan.producer_group and not in_tile:  # the shifted last group's repeats
            a_value = f"kg_kg >= kg_k ? {a_value} : 0.0f"  # weigh nothing
        a.add(f"const float kg_a = {a_value};")
        store = Scope([], 2, parent=tile)
        self.decompose("kg_row", [k.domain[i] for i in c.rows], store)
        tile_stores.print_stores(self, plan, store)
        sizes = [-(-n_rows // tm), tiles_run * prod(n for _, n in outer),
                 prod(k.domain[i][1] for i in c.batch)]
        holes = dict(index_t=t, tn=str(tn), nv=str(tn // w), width=str(w),
                     vtype=vector_syntax(w).vtype, tiles_c=str(sizes[1]),
                     batches=str(sizes[2]), k_extent=str(k_extent), name=k.name, tm=str(tm),
                     last_r0=str(n_rows - tm),
                     k_unroll='_Pragma("unroll") ' if plan.unroll_k else "",
                     col_bind="\n".join(tile.lines), k_bind="\n".join(k_scope.lines),
                     b_load="\n".join(b.lines), a_load="\n".join(a.lines),
                     tiles_r=str(sizes[0]), k_group=str(plan.producer_group),
                     a_bind="\n".join(a_bind.lines))
        if self.sched.pack:
            return self._packed(holes, tile, k_scope, b, store, sizes)
        src = templates.render("opencl", "contraction_vec.cl", params=self.params(),
                               store="\n".join(store.lines), **holes)
        local = self._tile_group(sizes)
        return src, Launch(_covering(sizes, local), local)

    def _tile_group(self, sizes: list[int]) -> tuple[int, ...]:
        """The work-group over (row tiles, column tiles, batches): filled from the row tiles
        outward, or with ``group_columns`` from the column tiles (dimension 1)."""
        limits = self.caps.max_item_sizes
        if not self.sched.group_columns:
            return _local_shape(sizes, self.local, limits)
        swap = (1, 0, 2)  # its own inverse
        local = _local_shape([sizes[d] for d in swap], self.local,
                             tuple(limits[d] for d in swap) if limits else None)
        return tuple(local[d] for d in swap)

    def _column_tile(self, plan: TilePlan, outer: list[Axis], tiles_run: int) -> Scope:
        """The tile's batch and column binding: ``kg_own``, the first column the work-item
        stores, and ``kg_c0``, the first it computes (a last tile shifts left to stay whole)."""
        k, c, t = self.kernel, plan.contraction, self.index_t
        assert plan.columns is not None and self.sched.tile is not None
        tn = self.sched.tile[1]
        n_run = prod(k.domain[i][1] for i in plan.columns.run)
        tile = Scope([], 1)
        self.decompose("kg_bt", [k.domain[i] for i in c.batch], tile)
        if outer:
            tile.add(f"const {t} kg_outer = kg_tc / {tiles_run};")
            self.decompose("kg_outer", outer, tile)
        own = f"(kg_tc % {tiles_run}) * {tn}" if outer else f"kg_tc * {tn}"
        tile.add(f"const {t} kg_own = {own};  // first column this item stores")
        tile.add(f"const {t} kg_c0 = kg_min(kg_own, ({t}){n_run - tn});  // whole tile")
        return tile

    def _right_tile(self, plan: TilePlan, k_scope: Scope) -> tuple[Scope, Scope, Expr]:
        """The right operand's vectors at reduction position ``kg_k`` (``producer_group`` of
        them for an AGO producer, sharing their loads), the left operand's binding to the
        group's positions, and the left operand to read there."""
        k, c, cols, t = self.kernel, plan.contraction, plan.columns, self.index_t
        assert cols is not None and self.sched.tile is not None
        w, tn, group, left = cols.width, self.sched.tile[1], plan.producer_group, plan.left
        k_extent = prod(n for _, n in c.reduce.axes)
        b = Scope([], 2, parent=k_scope)
        a_bind = Scope([], 3, parent=k_scope)
        if cols.right is None:  # no contiguous run: lanes loaded one by one
            b.add(f"float kg_lanes[{tn}];")
            b.add(f"_Pragma(\"unroll\") for (int kg_j = 0; kg_j < {tn}; ++kg_j) {{")
            lane = b.child()
            lane.add(f"const {t} kg_col = kg_c0 + kg_j;")
            self.decompose("kg_col", [k.domain[i] for i in cols.run], lane)
            lane.add(f"kg_lanes[kg_j] = {self.expr(c.right, lane)};")
            b.add("}")
            b.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v)")
            b.child().add(f"kg_b[0][kg_v] = vload{w}(kg_v, kg_lanes);")
            return b, a_bind, left
        first = FLAT_K  # the group's first position
        if k_extent % group:  # the last group shifts back to stay whole
            first = sympy.Symbol("kg_k0")
            k_scope.add(f"const {t} kg_k0 = kg_min(kg_k, ({t}){k_extent - group});"
                        f"  // the last group shifts back")
            self.ranges[first] = k_extent
        assert plan.right is not None
        rows = [cols.right] if group == 1 else [
            specialise(plan.right, {FLAT_K: first + g}, self.ranges) for g in range(group)]
        # a lane's flat position stays in the run: its own row and column tests (a merged
        # run's, ``columns.vector_plan``'s ``wrap``) divide by '/', not KG_FLOORDIV
        self.ranges[cols.flat] = prod(k.domain[i][1] for i in cols.run)
        b.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v) {{")
        lane = b.child()
        lane.add(f"const {t} kg_col = kg_c0 + kg_v * {w};")
        value = VectorPrinter(self, cols.flat, "kg_col", lane, vector_syntax(w, stride2=True))
        value.reduce_together(rows)
        for g, row in enumerate(rows):
            lane.add(f"kg_b[{g}][kg_v] = {value.expr(row)};")
        b.add("}")
        if group > 1:  # the left operand at the group's kg_g-th position
            a_bind.add(f"const {t} kg_kg = {first} + kg_g;")
            self.ranges[sympy.Symbol("kg_kg")] = k_extent
            left = specialise(left, {FLAT_K: sympy.Symbol("kg_kg")}, self.ranges)
        return b, a_bind, left

    def _packed(self, holes: dict[str, str], tile: Scope, k_scope: Scope, b: Scope,
                store: Scope, sizes: list[int]) -> tuple[str, Launch]:
        """The right operand packed in ``tn``-wide panels of a scratch buffer: by each column
        tile's work-item before it sweeps every row tile (``pack_in_tile``, one launch), or by a
        first kernel packing them all (pack_panels.cl.tmpl)."""
        tn, w = int(holes["tn"]), int(holes["width"])
        panel = int(holes["k_extent"]) * tn
        if self.sched.pack_in_tile:
            group = int(holes["k_group"])
            fill = Scope([], 2)  # the panel's rows for the step's positions
            write = f"vstore{w}(kg_b[0][kg_v], kg_v, kg_panel + kg_k * {tn});"
            note = ""
            if group > 1:  # an AGO producer, computed in channel groups that share loads
                first = "kg_k0" if int(holes["k_extent"]) % group else "kg_k"
                write = (f"vstore{w}(kg_b[kg_g][kg_v], kg_v, kg_panel + ({first} + kg_g) * "
                         f"{tn});")
                fill.add(f"_Pragma(\"unroll\") for (int kg_g = 0; kg_g < {group}; ++kg_g)")
                fill = fill.child()
                note = (f"\n// The operand is a fused producer (AGO), computed into the panel "
                        f"{group} positions a step,\n// once for all row tiles.")
            fill.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v)")
            fill.child().add(write)
            src = templates.render(
                "opencl", "contraction_tile_pack.cl",
                params=self.params() + ",\n        __global float* restrict kg_packed",
                panel=str(panel),
                panel_size=f"{4 * panel / 1024:.0f} KiB" if panel >= 256 else
                f"{4 * panel} bytes", row_k_bind=_indent(k_scope.lines),
                store=_indent(store.lines), pack_store="\n".join(fill.lines),
                pack_step="++kg_k" if group == 1 else f"kg_k += {group}", producer_note=note,
                **holes)
            items = sizes[1:]
            local = _local_shape(items, self.local, self.caps.max_item_sizes)
            return src, Launch(_covering(items, local), local,
                               scratch=items[0] * items[1] * panel)
        pack_src = templates.render(
            "opencl", "pack_panels.cl",
            **{**holes, "name": f"{self.kernel.name}_pack", "k_bind": _dedent(k_scope.lines),
               "b_load": _dedent(b.lines)},
            main=self.kernel.name, params=self.params(outputs=False), panel=str(panel))
        pack_sizes = [int(holes["k_extent"]), sizes[1], sizes[2]]
        pack_local = _local_shape(pack_sizes, PACK_LOCAL, self.caps.max_item_sizes)
        pack = Launch(_covering(pack_sizes, pack_local), pack_local)
        tile.add(f"__global const float* kg_panel = kg_packed + "
                 f"((long)kg_bt * {sizes[1]} + kg_tc) * {panel};")
        panel_b = Scope([], 2)  # the panel's row for kg_k in place of the operand's loads
        panel_b.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v)")
        panel_b.child().add(f"kg_b[0][kg_v] = vload{w}(kg_v, kg_panel + kg_k * {tn});")
        src = templates.render(
            "opencl", "contraction_vec.cl", **{**holes, "col_bind": "\n".join(tile.lines),
                                               "b_load": "\n".join(panel_b.lines)},
            params=self.params() + ",\n        __global const float* restrict kg_packed",
            store="\n".join(store.lines))
        local = _local_shape(sizes, self.local, self.caps.max_item_sizes)
        # the constants it packs once, if any, key the panels
        once = tuple(i for i, b in enumerate(self.kernel.inputs) if b.name in self.sched.pack_once)
        return pack_src + "\n" + src, Launch(_covering(sizes, local), local, pack,
                                              sizes[1] * sizes[2] * panel, once)

    # --- 'window': sliding-window contraction (templates/window.cl.tmpl) -------------------

    def _window(self) -> tuple[str, Launch]:
        win, rows = self.sched.plan, self.sched.window_rows
        assert isinstance(win, WindowPlan) and rows is not None
        # the block axis split by the rows each work-item owns
        unrolled = self._split(tuple(rows if pos == win.block else 1
                                     for pos in range(len(self.kernel.domain))))
        return window.print_kernel(self, win, unrolled, self.ndrange)

    # --- 'columns': a chunk of the last axis a work-item, its reductions vector lanes --------

    def _columns(self) -> tuple[str, Launch]:
        """Work-items over the group axes (all but the last) and chunks of
        ``COLUMNS_VECTORS`` vectors of the last axis; each element's reduction is a lane of a
        vector accumulator (``group_body``'s vector stores); the elements past a chunk's last
        whole vector go one by one."""
        k, t = self.kernel, self.index_t
        n, w = k.domain[-1][1], self.sched.vector_width
        assert w is not None
        chunk = w * COLUMNS_VECTORS
        pieces = sympy.Symbol("kg_chunk")
        self.symbol_names[pieces] = "kg_chunk"
        index, body = Scope([], 1), Scope([], 1)
        launch = self.ndrange([*self.group_axes(), (pieces, -(-n // chunk))], index,
                              explicit_vectors=True)
        index.add(f"const {t} kg_first = kg_chunk * {chunk};")
        stop = "kg_first + " + str(chunk)
        if n % chunk:
            index.add(f"const {t} kg_stop = min(kg_first + {chunk}, ({t}){n});")
            stop = "kg_stop"
        self.group_body(body, vectorize=True, element_range=("kg_first", stop))
        src = templates.render("opencl", "columns.cl", name=k.name, params=self.params(),
                               width=str(w), chunk=str(chunk), index="\n".join(index.lines),
                               body="\n".join(body.lines))
        return src, launch

    # --- 'row': one work-item per group point, explicit vector loops ---------------------------

    def _row(self) -> tuple[str, Launch]:
        k = self.kernel
        index, body = Scope([], 1), Scope([], 1)
        keys = self.sched.plan
        if isinstance(keys, panel.KeyPanel):
            assert self.sched.vector_width is not None
            inner, launch = panel.print_items(self, keys, self.sched.vector_width,
                                              self.ndrange, index, body)
        else:
            inner, launch = body, self.ndrange(self.group_axes(), index)
        launch = Launch(launch.global_size, tuple(1 for _ in launch.global_size))
        self.group_body(inner, vectorize=True)
        if inner is not body:
            body.add("}")
        src = templates.render("opencl", "row_reduce.cl", name=k.name, params=self.params(),
                               width=str(self.sched.vector_width),
                               index="\n".join(index.lines),
                               body="\n".join(body.lines))
        return src, launch


def _dedent(lines: list[str]) -> str:
    """Loop-body lines one level shallower (the packing kernel has no reduction loop)."""
    return "\n".join(line.removeprefix("    ") for line in lines)


def _indent(lines: list[str]) -> str:
    """Lines one level deeper (inside the in-tile pack's sweep over row tiles)."""
    return "\n".join("    " + line if line else line for line in lines)


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _covering(sizes: list[int], local: tuple[int, ...]) -> tuple[int, ...]:
    """The global size: each of ``sizes`` rounded up to whole work-groups of ``local``."""
    return tuple(-(-s // l) * l for s, l in zip(sizes, local))


def _local_shape(sizes: list[int], target: int, limits: tuple[int, ...] | None = None
                 ) -> tuple[int, ...]:
    """A work-group shape of at most ``target`` items, filled from dimension 0 outward, each
    dimension within the device's ``limits``."""
    local, budget = [], target
    for dim, s in enumerate(sizes):
        take = max(1, min(s, budget, limits[dim] if limits else budget))
        # a divisor of the size, when not much smaller, spares the idle items of a last group
        divisor = max(d for d in range(1, take + 1) if s % d == 0)
        take = divisor if 2 * divisor >= take else take
        local.append(take)
        budget = max(1, budget // take)
    return tuple(local)

