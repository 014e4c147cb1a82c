"""OpenCL C emitter: the loop IR as one ``__kernel`` with an NDRange launch.

Schedules (``metadata['schedule']``):
- ``elementwise``: one work-item per domain point on a 1-3-D NDRange; the innermost domain axis
  is dimension 0 so neighbouring work-items touch neighbouring elements (PoCL vectorises across
  them), and merged axes keep integer division out of the index (TOOLCHAIN.md §3.4). Where
  neighbouring points share loads, each work-item computes several (``unroll.py``).
- ``group``: one work-group per group point; hoisted reductions are computed cooperatively
  (strided partial results, then a tree in ``__local`` memory), then the same work-items write the
  group's elements: single-kernel softmax, layer-norm-like blocks, reductions over long axes.
- ``item``: one work-item per group point, reducing serially; for short reductions over many
  groups, where SIMD lanes across groups beat a tree.
- ``row``: one work-item per group point with explicit ``float8`` loops along a contiguous
  reduced axis. A CPU device runs a work-group on one core anyway, so this beats ``group`` there
  (2.4 ms vs 13 ms for a 1024x4096 softmax on PoCL); chosen when the capabilities say so.
- ``tiled``: a contraction (GEMM, implicit-GEMM conv, Winograd's batched GEMM, AGO's fused
  pairs) as register tiles of rows x float16 column vectors (contraction*.cl.tmpl).
- ``window``: a sliding-window contraction with no rows (a depthwise or grouped conv): each
  work-item owns a few output rows and the whole row as vectors, reading each input row once for
  all of them (window.cl.tmpl).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any

import sympy

from ...dtypes import DType
from ...ir.expr import Axis, Expr, Load, Reduce, free_index_symbols, walk
from ...ir.loop import Buffer, LoopKernel
from ...ir.substitute import flatten_axes, flatten_offset, specialise, specialise_index
from ...lower import unroll as unroll_mod
from ...lower.contraction import (Contraction, contraction, operand_buffers,
                                  operand_has_reduction, producer_redundancy)
from ...shapes import prod
from ...version import __version__
from .. import templates
from ..base import Capabilities
from ..c.emitter import (CEmitter, VectorPrinter, VectorSyntax, extent, read_together,
                         split_guard, vectorizable)
from ..printer import Scope

_MATH = ("exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos",
         "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "rint")
_COMPARE = {"lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}",
            "eq": "{0} == {1}", "ne": "{0} != {1}"}
_LOGIC = {"and": "{0} && {1}", "or": "{0} || {1}", "xor": "{0} != {1}", "not": "!{0}"}
# OpenCL builtins are overloaded for scalars and vectors alike, so one table serves both.
_FLOAT = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "abs": "fabs({0})", "max": "fmax({0}, {1})", "min": "fmin({0}, {1})",
    "pow": "pow({0}, {1})", "fmod": "fmod({0}, {1})", "sign": "sign({0})",
    "isnan": "isnan({0})", "isinf": "isinf({0})",
    **{f: f"{f}({{0}})" for f in _MATH}, **_COMPARE,
}
_INT = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "abs": "({0} < 0 ? -{0} : {0})", "max": "max({0}, {1})",
    "min": "min({0}, {1})", "mod": "KG_FLOORMOD({0}, {1})", "sign": "(({0} > 0) - ({0} < 0))",
    **_COMPARE, **_LOGIC,
}
# Vector masks are -1 or 0 a lane: bitwise logic keeps them so ('&&' and '!' of vectors fold
# to 1 per lane in PoCL's clang when the operands are constants, and select() reads the top bit)
_VECTOR_LOGIC = {"and": "{0} & {1}", "or": "{0} | {1}", "xor": "{0} ^ {1}", "not": "~{0}"}
VECTOR = VectorSyntax(
    width=8, vtype="float8", mtype="int8", load="vload8(0, {ptr} + {off})",
    store="vstore8({v}, 0, {ptr} + {off});", broadcast="((float8)({0}))",
    broadcast_mask="((int8)(-({0})))", select="select({2}, {1}, {0})",
    functions={**{k: v for k, v in _FLOAT.items() if k != "sign"}, **_VECTOR_LOGIC},
    combine={"sum": "{a} + {b}", "prod": "{a} * {b}", "max": "fmax({a}, {b})",
             "min": "fmin({a}, {b})"},
    horizontal={"sum": "", "prod": "", "max": "", "min": ""},  # halving with .lo/.hi
)

_BARRIER = "barrier(CLK_LOCAL_MEM_FENCE);"
STRATEGIES = ("group", "item", "row", "tiled", "window")
STAGED_STRATEGIES = ("item", "row")  # a staged row is an array of one work-item
# PoCL runs a work-group as one thread's loop over work-items; groups of 256 vectorise well and
# tiny groups (16) run 2-3x slower (TOOLCHAIN.md §3.4).
DEFAULT_LOCAL = 256
# Measured on PoCL (python -m kernelgen and bench/): 65536 rows of 64 run 1.3x faster with one
# work-item per row; 1024 rows of 4096 run 2.3x faster with one work-group per row.
GROUP_REDUCE_MIN = 512  # reductions at least this long use the cooperative 'group' schedule
ITEM_UNROLL_MAX = 32  # 'item' reductions up to this many points unroll completely
GROUP_FEW = 64  # with fewer groups than this, 'item' would leave most SIMD lanes idle
AGO_MAX_COLUMNS = 64  # widest register tile a fused-producer contraction takes by default
# The vector operand's producer channels computed together, at most (the largest divisor of
# the reduction's extent up to this): conv3x3+ReLU -> 1x1, 32 channels at 56x56, hand-edited
# from the generated kernel and timed side by side: 1 channel 1.27-1.37 ms, 2: 0.74-0.87,
# 4: 0.45-0.57, 8: 0.42-0.62, 16: 0.47-0.48. A prime count takes a group that does not divide
# it, the last step shifted back (11 channels: 0.255 ms in groups of 6 against 0.591 one by
# one; 13: 0.274 in groups of 7 against 0.711; generated kernels, timed alternately).
AGO_PRODUCER_GROUP = 8
# most consumer rows one tile spans when the producer is the vector operand: one sum vector a
# row, so 32 rows fill AVX-512's registers
AGO_MAX_ROWS = 32
# Vector-column contraction (contraction_vec.cl.tmpl): 8 rows x 2 float16 = 16 of AVX-512's 32
# registers hold the sums. Measured on PoCL, 1024^3 GEMM: 140-220 GFLOP/s against 24 for the
# scalar 8x8 tile, whose arrays PoCL left in memory. Work-groups of a few rows share the right
# operand's panel; 4 measured as good as 1 and better than 64.
VECTOR_TILE = (8, 32)
UNROLLED_LANES = 16  # work-group width multiple for work-items that compute several points
VECTOR_WIDTHS = (16, 8, 4)
VECTOR_LOCAL = 4
# The right operand packed in panels by a first kernel (pack_panels.cl.tmpl), hand-edited from the
# generated 2048^3 GEMM and timed side by side: 326-333 GFLOP/s against 176-181 reading its rows
# (packing the left operand too: no faster). 1024^3: 197 against 179. Generated, 6x64 tiles,
# packed against in place: 1024x512x1024 3.77 against 6.01 ms, 512x1024x512 1.90 / 2.97,
# 64x1024x1024 0.69 / 0.91; 768^3 2.95 / 2.74 and 512^3 0.95-1.00 / 0.87-1.06 (about even).
PACK_MIN_ROW_TILES = 4  # row tiles that read each panel, at least, for the pass to pay
PACK_MIN_BYTES = 1 << 20
PACK_LOCAL = 16
# Each column tile's work-item packing its own panel, then sweeping every row tile over it while
# it is in cache (contraction_tile_pack.cl.tmpl, one launch), against a first kernel packing
# every panel: im2col of a 3x3 64->64 conv at 56x56 (8x32 tiles, 74 KiB panels), generated and
# hand-merged, alternating in one process, three runs: 1.11/1.11/1.10 ms against 1.27/1.18/1.17;
# GEMM 2048^3 (6x64, 512 KiB panels) 345 against 339 GFLOP/s, 1024^3 and 512^3 within the noise.
# It needs enough column tiles to keep every core busy, and panels that fit a core's L2.
PACK_TILE_MIN_ITEMS = 16
PACK_TILE_MAX_BYTES = 1 << 20
PACK_TILE_LOCAL = 2
# 'window' (window.cl.tmpl), measured on PoCL for a depthwise 3x3 over 128x56x56 in one run:
# 0.078-0.087 ms with 4 rows a work-item, 0.109 ms with 1 and 0.093 with 8, against 0.19 ms for
# the vector-column tiles; groups of 8 to 128 items within 10% of each other.
WINDOW_MAX_RUN = 128  # the longest run one work-item covers whole (8 float16 vectors)
WINDOW_ROWS = 4  # default rows a work-item owns (the largest divisor of the axis up to this)
WINDOW_MAX_FMAS = 2048  # straight-line code: rows x taps x vectors at most
WINDOW_LOCAL = 32

CAPABILITIES = Capabilities(
    name="opencl", vector_width=VECTOR.width, max_work_group=4096,
    # A CPU device runs a work-group on one core: rows reduce fastest as one work-item with
    # explicit vector loops (measured 2.4 ms vs 13 ms for a 1024x4096 softmax on PoCL).
    simd_within_work_item=True, pads_aliased_rows=True, direct_schedule="item",
    pointwise_conv_in_place=True, winograd_4x4=True)


@dataclass(frozen=True)
class Launch:
    """NDRange of the kernel. ``scratch`` > 0: a buffer of that many float32 elements the kernel
    takes after its outputs (panels of a packed operand). ``pack``, when set, is a packing
    kernel launched first (entry point ``<name>_pack`` in the same source; arguments: the
    inputs, then the scratch buffer); without it, the kernel packs its panels itself."""

    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    pack: Launch | None = None
    scratch: int = 0


class OpenCLEmitter(CEmitter):
    backend = "opencl"
    scalar_types = {DType.float32: "float", DType.float64: "double", DType.int32: "int",
                    DType.int64: "long", DType.bool: "bool", DType.float16: "float"}
    buffer_types = {DType.float32: "float", DType.float64: "double", DType.int32: "int",
                    DType.int64: "long", DType.bool: "uchar", DType.float16: "half"}
    float_formats = _FLOAT
    int_formats = _INT  # also bool, whose logic ops live here
    vector = VECTOR
    input_qualifier, output_qualifier = "__global const ", "__global "

    def __init__(self, kernel: LoopKernel, local_size: int | None = None,
                 reduce_strategy: str | None = None,
                 capabilities: Capabilities = CAPABILITIES,
                 tile: tuple[int, int] | None = None,
                 unroll: tuple[int, ...] | None = None,
                 window_rows: int | None = None, group_rows: int | None = None,
                 pack_b: bool | None = None, pack_in_tile: bool | None = None) -> None:
        tile_default = tile is None
        # requested; None: decided by the tile (_packs_right, _packs_in_tile). pack_in_tile
        # says how a packed operand is packed: pack_b=False (im2col's in-place implicit GEMM
        # over a stored packed tile) wins over it
        self.pack_b = True if pack_in_tile and pack_b is None else pack_b
        self.pack_in_tile = pack_in_tile
        self.packed: bool | None = None  # decided, where the vector template runs
        self.packed_in_tile = False
        self.right_reads: list[str] = []  # what its right (packed or vector) operand loads
        self.tile_explicit = not tile_default
        self.producer_recomputed: float | None = None  # set when the producer is the vector side
        super().__init__(kernel, capabilities)
        self.local = local_size or DEFAULT_LOCAL
        self.local_explicit = local_size is not None
        self._barrier_loops = False
        # float32 sums in vector registers; the scalar template keeps other dtypes
        self.vector_columns = all(b.dtype is DType.float32 for b in kernel.outputs)
        self.contraction = opencl_contraction(kernel)
        self.window = opencl_window(kernel)
        tile = tile or (VECTOR_TILE if self.vector_columns else (4, 4))
        if min(tile) < 1:
            raise ValueError(f"tile sizes must be positive, got {tile}")
        self.tile = tile
        # AGO: with a producer reduction inside the left operand and no explicit tile, one
        # column tile covers every column so no producer element is computed twice
        self.ago_full_columns = tile_default and self.contraction is not None and \
            operand_has_reduction(self.contraction.left) and \
            prod(kernel.domain[i][1] for i in self.contraction.cols) <= AGO_MAX_COLUMNS
        self.strategy = self._strategy(reduce_strategy)
        # 'elementwise': several domain points per work-item where they share loads (unroll.py)
        self.unroll = unroll_mod.none(kernel)
        if unroll is not None and tuple(unroll) != self.unroll:
            if self.strategy != "elementwise":
                raise ValueError(f"unroll applies to the 'elementwise' schedule; kernel "
                                 f"'{kernel.name}' runs '{self.strategy}'")
            unroll_mod.check(kernel, tuple(unroll))
            self.unroll = tuple(unroll)
        elif unroll is None and self.strategy == "elementwise":
            self.unroll = unroll_mod.plan(kernel)
        # 'window': rows of the outer axis each work-item owns
        self.window_rows = 1
        if self.strategy == "window":
            assert self.window is not None
            choices = self.window.row_choices
            if window_rows is None:
                window_rows = self.window.default_rows
            elif window_rows not in choices:
                raise ValueError(f"kernel '{kernel.name}': window_rows must be one of "
                                 f"{choices} (divisors of the axis, within the code budget), "
                                 f"got {window_rows}")
            self.window_rows = window_rows
        elif window_rows is not None:
            raise ValueError(f"window_rows applies to the 'window' schedule; kernel "
                             f"'{kernel.name}' runs '{self.strategy}'")
        # 'row' and 'item' on a staged kernel: several group points (queries) per work-item
        self.group_rows = 1
        if self.strategy in STAGED_STRATEGIES:  # the points share vector loads on 'row'
            self.group_rows = unroll_mod.choose_group_rows(kernel, group_rows,
                                                           share=self.strategy == "row")
            self.group_plan = unroll_mod.split_group(kernel, self.group_rows)
            if kernel.staged and self.strategy == "row":  # measured: float16 with fma
                self.vector = _vector_syntax(16)        # 1.4-1.6x float8 (hand-written)
        elif group_rows not in (None, 1):
            raise ValueError(f"group_rows applies to the {STAGED_STRATEGIES} schedules; "
                             f"kernel '{kernel.name}' runs '{self.strategy}'")

    def _strategy(self, requested: str | None) -> str:
        k = self.kernel
        if not k.grouped:
            return "elementwise"
        if requested is not None:
            if requested not in STRATEGIES:
                raise ValueError(f"reduce_strategy must be one of {STRATEGIES}, got {requested!r}")
            if k.staged and requested not in STAGED_STRATEGIES:
                raise ValueError(f"kernel '{k.name}' stages a producer row per group point, "
                                 f"which runs on the {STAGED_STRATEGIES} schedules, not "
                                 f"{requested!r}")
            if requested == "row" and not self._row_vectorizable():
                raise ValueError("reduce_strategy 'row' needs every hoisted reduction to run over "
                                 "one contiguous float32 axis")
            if requested == "tiled" and self.contraction is None:
                raise ValueError("reduce_strategy 'tiled' needs a contraction: one sum of a "
                                 "product of operands on disjoint output axes")
            if requested == "window" and self.window is None:
                raise ValueError(f"reduce_strategy 'window' needs a short sum of products whose "
                                 f"one operand reads a run of at most {WINDOW_MAX_RUN} output "
                                 f"columns as vectors and has no axis of its own (a depthwise "
                                 f"conv); kernel '{k.name}' has none")
            return requested
        if k.staged:  # a work-item holds the row: one per group point
            return "row" if self.caps.simd_within_work_item and self._row_vectorizable() \
                else "item"
        if self.window is not None and not self.tile_explicit:
            return "window"
        if self.contraction is not None:
            return "tiled"
        if self.caps.simd_within_work_item and self._row_vectorizable():
            return "row"
        longest = max(extent(r) for r in k.hoisted)
        few_groups = prod(k.domain[g][1] for g in k.group) < GROUP_FEW
        return "group" if longest >= GROUP_REDUCE_MIN or few_groups else "item"

    def _row_vectorizable(self) -> bool:
        return all(self._vector_reduction_ok(r) for r in self.kernel.hoisted)

    def loop_tail(self, scope: Scope) -> None:
        if self._barrier_loops:
            scope.add(_BARRIER)

    unroll_pragma = '_Pragma("unroll")'

    def unrolls(self, node: Reduce) -> bool:
        # a short 'item' reduction unrolled is straight-line code PoCL vectorises across
        # work-items (depthwise 3x3, 128x56x56: 0.4-0.6 ms against 4-6 ms with a barrier per tap)
        return self.strategy == "item" and extent(node) <= ITEM_UNROLL_MAX

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
                        "tiled": self._tiled, "window": self._window}[self.strategy]()
        return head + "\n" + body, launch

    def _ndrange(self, axes: list[Axis], scope: Scope, clamp: bool = False,
                 lanes: int = 1, explicit_vectors: bool = False) -> Launch:
        """Map ``axes`` (outermost first) to NDRange dims: innermost -> 0, next -> 1, rest -> 2.

        Work-items past the end return early, or with ``clamp`` recompute the last point and set
        ``in_range`` to 0 (kernels with barriers must not return early). With ``lanes``, the
        work-group's dimension 0, when longer, is a multiple of it (idle items return). With
        ``explicit_vectors`` the test on dimension 0 is there even when no item is idle: PoCL
        then runs the work-items one after the other instead of vectorising across them, which
        split a depthwise conv's float16 reads into 8-byte pieces (0.14 against 0.08 ms)."""
        if not axes:
            if clamp:
                scope.add("const int in_range = 1;")
            return Launch((1,), (1,))
        dims = [[axes[-1]]] + ([[axes[-2]]] if len(axes) > 1 else [])
        if len(axes) > 2:
            dims.append(list(axes[:-2]))
        sizes = [prod(n for _, n in d) for d in dims]
        width = -(-sizes[0] // lanes) * lanes if sizes[0] > lanes else sizes[0]
        local = _local_shape([width, *sizes[1:]], self.local)
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
        if self.unroll == unroll_mod.none(self.kernel):
            launch = self._ndrange(list(self.kernel.domain), index)
            self.stores(body)
        else:
            launch = self._unrolled(index, body)
        src = templates.render("opencl", "elementwise.cl", name=self.kernel.name,
                               params=self.params(), index="\n".join(index.lines),
                               body="\n".join(body.lines))
        return src, launch

    def _unrolled(self, index: Scope, body: Scope) -> Launch:
        """Work-items over the axes ``self.unroll`` leaves parallel; each stores every copy,
        specialised to its constants, so copies share their loads and partial sums."""
        k = self.kernel
        plan = self._split(self.unroll)
        # PoCL vectorises a work-group's items along dimension 0 by UNROLLED_LANES; a group 28
        # items wide ran its last 12 items as scalar code (Winograd's input transform: 0.78 ms,
        # against 0.53 ms 32 wide with 4 idle items)
        launch = self._ndrange(list(plan.parallel), index, lanes=UNROLLED_LANES)
        for copy in plan.copies:
            offset = self.index(plan.offset(k.store_offset, copy))
            for buf, st in zip(k.outputs, k.stores):
                value = self.expr(plan.value(st.value, copy), body)
                body.add(self.buffer_store(buf, offset, value))
        return launch

    def _split(self, factors: tuple[int, ...]) -> unroll_mod.Unrolled:
        """``unroll.split``, with the outer parts of split axes bound: in range, and named
        like the axis they split."""
        plan = unroll_mod.split(self.kernel, factors)
        self.ranges.update(plan.ranges)
        for s, outer in plan.outer_of.items():
            self.symbol_names[outer] = self.symbol_names[s]
        return plan

    def _item(self) -> tuple[str, Launch]:
        k = self.kernel
        index, body = Scope([], 1), Scope([], 1)
        launch = self._ndrange(self.group_axes(), index, clamp=True)
        self._barrier_loops = True
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
            inner.add(_BARRIER)
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
        ``<pos>_ok`` is 0. Returns the position variable."""
        base, pos = self.fresh("base"), self.fresh("p")
        scope.add(f"for ({self.index_t} {base} = 0; {base} < {count}; {base} += {local}) {{")
        scope.add(f"    const int {pos}_ok = {base} + lid < {count};")
        scope.add(f"    const {self.index_t} {pos} = {pos}_ok ? {base} + lid : {count - 1};")
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
        inner.add(_BARRIER)
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

    # --- 'tiled': register-tiled contraction (templates/opencl/contraction*.cl.tmpl) ----------

    def _tiled(self) -> tuple[str, Launch]:
        k, c = self.kernel, self.contraction
        assert c is not None
        n_rows = prod(k.domain[i][1] for i in c.rows)
        n_cols = prod(k.domain[i][1] for i in c.cols)
        ago = self._ago_vector_plan(c) if self.vector_columns else None
        if ago is not None:
            return self._tiled_vector(*ago)
        if self.vector_columns:
            plan = _vector_plan(k, c, self.tile, self.ago_full_columns)
            if (plan is None or plan.right is None) and not operand_has_reduction(c.left):
                # the sum is symmetric: vectorise the left operand's run if it has one
                # (a 1x1 conv reads pixels contiguously but output channels strided)
                swapped = c.swapped()
                other = _vector_plan(k, swapped, self.tile, False)
                if other is not None and other.right is not None:
                    plan, c = other, swapped
            if plan is not None:
                return self._tiled_vector(c, plan)
        tm, tn = min(self.tile[0], n_rows), min(self.tile[1], n_cols)
        if self.ago_full_columns:  # compute each fused producer element once (AGO)
            tn = n_cols
        self.effective_tile = (tm, tn)
        holes = self.contraction_holes(tm, tn, depth=3)
        sizes = [int(holes["tiles_c"]), int(holes["tiles_r"]), int(holes["batches"])]
        local = _local_shape(sizes, min(self.local, 64))
        global_ = _covering(sizes, local)
        src = templates.render("opencl", "contraction.cl", name=k.name, params=self.params(),
                               **holes)
        return src, Launch(global_, local)

    def _ago_vector_plan(self, c: Contraction) -> tuple[Contraction, _VectorPlan, int] | None:
        """AGO with the producer as the vector operand: when the producer (a reduction in the
        left operand, e.g. conv3x3 + ReLU before a 1x1 conv) reads a run of its pixels
        contiguously, swap the operands so each work-item computes the producer for
        ``width`` pixels at once, in one vector accumulator, and feeds every consumer row
        (output channel) of its tile. The producer is then computed once per row tile; by
        default one tile spans all rows (up to ``AGO_MAX_ROWS``), so once in all. Returns the
        swapped contraction, its column plan and the rows per tile."""
        if not operand_has_reduction(c.left) or operand_has_reduction(c.right):
            return None
        swapped = c.swapped()
        n_rows = prod(self.kernel.domain[i][1] for i in swapped.rows)
        if self.tile_explicit:
            tile = self.tile
        elif n_rows <= AGO_MAX_ROWS:
            tile = (n_rows, VECTOR_WIDTHS[0])  # one vector of columns: the sums stay few
        else:
            return None
        plan = _vector_plan(self.kernel, swapped, tile, False, producer=True)
        if plan is None or plan.right is None:
            return None
        return swapped, plan, min(tile[0], n_rows)

    def _tiled_vector(self, c: Contraction, plan: _VectorPlan, tm: int | None = None
                      ) -> tuple[str, Launch]:
        """Holes of templates/opencl/contraction_vec.cl.tmpl: the right operand as ``vloadN``
        of its contiguous run (prologue in vector code) or, when it has none, lane by lane.
        ``tm``: rows per tile (default: the tile's, at most all rows)."""
        k = self.kernel
        n_rows = prod(k.domain[i][1] for i in c.rows)
        t, w, tn = self.index_t, plan.width, plan.tile_n
        tm = tm or min(self.tile[0], n_rows)
        self.effective_tile = (tm, tn)
        if operand_has_reduction(c.right):  # AGO, producer as the vector operand
            self.producer_recomputed = float(-(-n_rows // tm))
        run = [k.domain[i] for i in plan.run]
        outer = [k.domain[i] for i in c.cols if i not in plan.run]
        n_run = prod(n for _, n in run)
        tiles_run = -(-n_run // tn)
        tile = Scope([], 1)
        self.decompose("kg_bt", [k.domain[i] for i in c.batch], tile)
        if outer:
            tile.add(f"const {t} kg_outer = kg_tc / {tiles_run};")
            self.decompose("kg_outer", outer, tile)
        own = f"(kg_tc % {tiles_run}) * {tn}" if outer else f"kg_tc * {tn}"
        tile.add(f"const {t} kg_own = {own};  // first column this item stores")
        tile.add(f"const {t} kg_c0 = kg_min(kg_own, ({t}){n_run - tn});  // whole tile")
        k_scope = Scope([], 2, parent=tile)
        self.decompose("kg_k", list(c.reduce.axes), k_scope)
        b = Scope([], 2, parent=k_scope)
        k_extent, flat_k = prod(n for _, n in c.reduce.axes), sympy.Symbol("kg_k")
        left = self.flat_reduction(c.left)
        right = None if plan.right is None else self.flat_reduction(plan.right)
        group = self._producer_group(c, left, right)
        a_bind = Scope([], 3, parent=k_scope)
        if plan.right is not None:
            first = flat_k  # the group's first position
            if k_extent % group:  # the last group shifts back to stay whole
                first = sympy.Symbol("kg_k0")
                k_scope.add(f"const {t} kg_k0 = kg_min(kg_k, ({t}){k_extent - group});"
                            f"  // the last group shifts back")
                self.ranges[first] = k_extent
            rows = [plan.right] if group == 1 else [
                specialise(right, {flat_k: first + g}, self.ranges) for g in range(group)]
            b.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v) {{")
            lane = b.child()
            lane.add(f"const {t} kg_col = kg_c0 + kg_v * {w};")
            value = VectorPrinter(self, plan.flat, "kg_col", lane, _vector_syntax(w))
            value.reduce_together(rows)
            for g, row in enumerate(rows):
                lane.add(f"kg_b[{g}][kg_v] = {value.expr(row)};")
            b.add("}")
            if group > 1:  # the left operand at the group's kg_g-th position
                a_bind.add(f"const {t} kg_kg = {first} + kg_g;")
                self.ranges[sympy.Symbol("kg_kg")] = k_extent
                left = specialise(left, {flat_k: sympy.Symbol("kg_kg")}, self.ranges)
        else:
            b.add(f"float kg_lanes[{tn}];")
            b.add(f"_Pragma(\"unroll\") for (int kg_j = 0; kg_j < {tn}; ++kg_j) {{")
            lane = b.child()
            lane.add(f"const {t} kg_col = kg_c0 + kg_j;")
            self.decompose("kg_col", run, lane)
            lane.add(f"kg_lanes[kg_j] = {self.expr(c.right, lane)};")
            b.add("}")
            b.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v)")
            b.child().add(f"kg_b[0][kg_v] = vload{w}(kg_v, kg_lanes);")
        a = Scope([], 4, parent=k_scope)  # within the kg_g and kg_i loops
        a.add(f"const {t} kg_row = kg_r0 + kg_i;")
        self.decompose("kg_row", [k.domain[i] for i in c.rows], a)
        a_value = self.expr(left, a)
        if k_extent % group:  # positions the shifted last group repeats weigh nothing
            a_value = f"kg_kg >= kg_k ? {a_value} : 0.0f"
        a.add(f"const float kg_a = {a_value};")
        store = Scope([], 2, parent=tile)
        self.decompose("kg_row", [k.domain[i] for i in c.rows], store)
        self._tile_stores(c, plan, store)
        tiles_r = -(-n_rows // tm)
        sizes = [tiles_r, tiles_run * prod(n for _, n in outer),
                 prod(k.domain[i][1] for i in c.batch)]
        local = _local_shape(sizes, self.local if self.local_explicit else VECTOR_LOCAL)
        global_ = _covering(sizes, local)
        self.local = prod(local)
        holes = dict(index_t=t, tn=str(tn), nv=str(tn // w), width=str(w),
                     vtype=_vector_syntax(w).vtype, tiles_c=str(sizes[1]),
                     batches=str(sizes[2]), k_extent=str(k_extent))
        params, pack, panel = self.params(), None, k_extent * tn
        k_unroll = '_Pragma("unroll") ' if extent(c.reduce) <= ITEM_UNROLL_MAX and \
            not operand_has_reduction(c.right) else ""
        self.packed = self._packs_right(c, tiles_r, panel * sizes[1] * sizes[2])
        self.right_reads = operand_buffers(c.right)  # the operands maybe swapped above
        self.packed_in_tile = self.packed and self._packs_in_tile(sizes[1] * sizes[2], panel)
        if self.packed_in_tile:  # each column tile packs its panel, then every row tile reads it
            src = templates.render(
                "opencl", "contraction_tile_pack.cl", name=k.name, tm=str(tm),
                params=params + ",\n        __global float* restrict kg_packed",
                tiles_r=str(tiles_r), last_r0=str(n_rows - tm), panel=str(panel),
                panel_size=f"{4 * panel / 1024:.0f} KiB" if panel >= 256 else
                f"{4 * panel} bytes", k_unroll=k_unroll,
                col_bind="\n".join(tile.lines), k_bind="\n".join(k_scope.lines),
                b_load="\n".join(b.lines), row_k_bind=_indent(k_scope.lines),
                a_load="\n".join(a.lines), store=_indent(store.lines), **holes)
            items = sizes[1:]
            local = _local_shape(items, self.local if self.local_explicit else PACK_TILE_LOCAL)
            self.local = prod(local)
            return src, Launch(_covering(items, local), local,
                               scratch=items[0] * items[1] * panel)
        if self.packed:  # a first kernel packs the operand; the tiles read its panels
            pack_src = templates.render(
                "opencl", "pack_panels.cl", name=f"{k.name}_pack", main=k.name,
                params=self.params(outputs=False), panel=str(panel),
                col_bind="\n".join(tile.lines), k_bind=_dedent(k_scope.lines),
                b_load=_dedent(b.lines), **holes)
            pack_sizes = [k_extent, sizes[1], sizes[2]]
            pack_local = _local_shape(pack_sizes, PACK_LOCAL)
            pack = Launch(_covering(pack_sizes, pack_local), pack_local)
            params += ",\n        __global const float* restrict kg_packed"
            tile.add(f"__global const float* kg_panel = kg_packed + "
                     f"((long)kg_bt * {sizes[1]} + kg_tc) * {panel};")
            b = Scope([], 2)  # the panel's row for kg_k in place of the operand's loads
            b.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v)")
            b.child().add(f"kg_b[0][kg_v] = vload{w}(kg_v, kg_panel + kg_k * {tn});")
        src = templates.render(
            "opencl", "contraction_vec.cl", name=k.name, params=params, tm=str(tm),
            tiles_r=str(sizes[0]), last_r0=str(n_rows - tm), k_unroll=k_unroll,
            col_bind="\n".join(tile.lines), k_bind="\n".join(k_scope.lines),
            k_group=str(group), a_bind="\n".join(a_bind.lines),
            b_load="\n".join(b.lines), a_load="\n".join(a.lines),
            store="\n".join(store.lines), **holes)
        if pack is None:
            return src, Launch(global_, local)
        return pack_src + "\n" + src, Launch(global_, local, pack, sizes[1] * sizes[2] * panel)

    def _packs_right(self, c: Contraction, tiles_r: int, packed: int) -> bool:
        """Whether the right operand is laid out in panels first (``pack_b``; by default when
        ``PACK_MIN_ROW_TILES`` row tiles or more read an operand of at least ``PACK_MIN_BYTES``;
        ``_packs_in_tile`` then says by whom). Never for an AGO block: its producer is computed
        within the tiles."""
        ago = operand_has_reduction(c.left) or operand_has_reduction(c.right)
        if self.pack_b and ago:
            raise ValueError(f"kernel '{self.kernel.name}': pack_b needs a contraction of "
                             f"plain operands; this one computes a fused producer (AGO) in "
                             f"its tiles, which a pack would materialise")
        if self.pack_b is not None or ago:
            return bool(self.pack_b)
        return tiles_r >= PACK_MIN_ROW_TILES and 4 * packed >= PACK_MIN_BYTES

    def _packs_in_tile(self, panels: int, panel: int) -> bool:
        """Whether each column tile packs its own panel (``pack_in_tile``; by default when there
        are ``PACK_TILE_MIN_ITEMS`` panels or more, each at most ``PACK_TILE_MAX_BYTES``) rather
        than a first kernel packing them all."""
        if self.pack_in_tile is not None:
            return self.pack_in_tile
        return panels >= PACK_TILE_MIN_ITEMS and 4 * panel <= PACK_TILE_MAX_BYTES

    def _producer_group(self, c: Contraction, left: Expr, right: Expr | None) -> int:
        """Positions of the reduction one step of the vector template computes: for an AGO
        producer as the vector operand, its channels, the largest divisor of their count up
        to ``AGO_PRODUCER_GROUP`` (their sums then share every load of the input window),
        when both operands (``flat_reduction``'s forms) read the reduction through the flat
        ``kg_k`` alone; else 1. Where the largest such divisor is below half the group (a
        prime count of channels above the group), a group from half to all of
        ``AGO_PRODUCER_GROUP`` that does not divide the count: its last step starts at
        ``kg_k0``, shifted back to stay whole, and weighs the positions it repeats by zero."""
        if right is None or not operand_has_reduction(right):
            return 1
        flat_k, axes = sympy.Symbol("kg_k"), {s for s, _ in c.reduce.axes}
        if flat_k not in free_index_symbols(right) or axes & free_index_symbols(left):
            return 1
        k_extent = prod(n for _, n in c.reduce.axes)
        divisor = max(g for g in range(1, AGO_PRODUCER_GROUP + 1) if k_extent % g == 0)
        if divisor >= AGO_PRODUCER_GROUP // 2 or k_extent <= AGO_PRODUCER_GROUP:
            return divisor
        # no divisor that shares loads well (11 or 13 channels): the group whose steps cover
        # the fewest positions, the last step shifted back over channels already summed
        return min(range(AGO_PRODUCER_GROUP, AGO_PRODUCER_GROUP // 2 - 1, -1),
                   key=lambda g: -(-k_extent // g) * g)

    def _tile_stores(self, c: Contraction, plan: _VectorPlan, scope: Scope) -> None:
        """Row ``kg_i``'s epilogue and stores: whole tiles store vectors when every output is
        contiguous along the run and the epilogue has a vector form; the shifted last tile
        (and any other) goes lane by lane from ``kg_own`` on."""
        k, t, w, tn = self.kernel, self.index_t, plan.width, plan.tile_n
        run = [k.domain[i] for i in plan.run]
        vectors = _vector_epilogue(k, c, plan)
        lanes = scope
        if vectors is not None:
            syntax = _vector_syntax(w)
            scope.add("if (kg_c0 == kg_own) {  // a whole tile: one vector store a column block")
            whole = scope.child()
            whole.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v) {{")
            lane = whole.child()
            lane.add(f"const {t} kg_col = kg_c0 + kg_v * {w};")
            printer = VectorPrinter(self, plan.flat, "kg_col", lane, syntax,
                                     lanes={c.reduce: "kg_acc[kg_i][kg_v]"})
            for buf, offset, value in vectors:
                text = printer.expr(value)
                off = self.index(offset.xreplace({plan.flat: sympy.Symbol("kg_col")}))
                lane.add(syntax.store.format(v=text, ptr=self.arg_names[buf.name], off=off))
            whole.add("}")
            scope.add("} else {  // the shifted last tile: only the columns from kg_own on")
            lanes = scope.child()
        lanes.add(f"float kg_sums[{tn}];")
        lanes.add(f"_Pragma(\"unroll\") for (int kg_v = 0; kg_v < {tn // w}; ++kg_v)")
        lanes.child().add(f"vstore{w}(kg_acc[kg_i][kg_v], kg_v, kg_sums);")
        lanes.add(f"_Pragma(\"unroll\") for (int kg_j = 0; kg_j < {tn}; ++kg_j) {{")
        lane = lanes.child()
        lane.add(f"const {t} kg_col = kg_c0 + kg_j;")
        lane.add("if (kg_col < kg_own) continue;")
        self.decompose("kg_col", run, lane)
        lane.names[c.reduce] = "kg_sums[kg_j]"
        self.stores(lane)
        lanes.add("}")
        if vectors is not None:
            scope.add("}")

    # --- 'window': sliding-window contraction (templates/opencl/window.cl.tmpl) -------------

    def _window(self) -> tuple[str, Launch]:
        """Each work-item owns ``window_rows`` points of the axis outside the run and every
        column of the run; the taps and the rows are unrolled, each copy specialised to its
        constants (``loop_ir.specialise``), so equal reads of different taps and rows compare
        equal: each is read once and added into every sum that uses it."""
        k, c, win = self.kernel, self.contraction, self.window
        assert c is not None and win is not None
        cols = win.columns
        syntax = _vector_syntax(cols.width)
        # the block axis split by the rows each work-item owns; the run's axes are vector lanes
        unrolled = self._split(tuple(self.window_rows if pos == win.block else 1
                                     for pos in range(len(k.domain))))
        copies = unrolled.copies
        lanes = {k.domain[i][0] for i in cols.run}
        parallel = [axis for axis in unrolled.parallel if axis[0] not in lanes]
        self.ranges[cols.flat] = prod(k.domain[i][1] for i in cols.run)  # bounds edge reads
        ranges = dict(self.ranges)
        if not self.local_explicit:
            self.local = WINDOW_LOCAL
        index = Scope([], 1)
        launch = self._ndrange(parallel, index, explicit_vectors=True)
        self.local = prod(launch.local_size or (1,))
        sums, taps, stores = Scope([], 1), Scope([], 1), Scope([], 1)
        acc = [[f"kg_acc{i}_{j}" for j in range(len(win.starts))] for i in range(len(copies))]
        zero = syntax.broadcast.format("0.0f")
        for name in (a for row in acc for a in row):
            sums.add(f"{syntax.vtype} {name} = {zero};")
        # the copies of the right operand, each with the sums it goes into, in first-use order
        users: dict[Expr, list[tuple[int, Expr]]] = {}
        axes = [s for s, _ in c.reduce.axes]
        for i, copy in enumerate(copies):
            for point in itertools.product(*(range(n) for _, n in c.reduce.axes)):
                at = {**copy, **dict(zip(axes, map(sympy.Integer, point)))}
                right = specialise(cols.right, at, ranges)
                users.setdefault(right, []).append((i, specialise(c.left, at, ranges)))
        for left in dict.fromkeys(left for uses in users.values() for _, left in uses):
            self.expr(left, taps)  # the weights, read once up front
        readers = [VectorPrinter(self, cols.flat, start, taps, syntax) for start in win.starts]

        def row_test(right: Expr) -> frozenset[sympy.Basic]:
            """The lane-free guard parts of ``right``'s loads (a padded window's row test)."""
            tests = (split_guard(n.guard, cols.flat) for n in walk(right)
                     if isinstance(n, Load) and n.guard is not sympy.true)
            return frozenset(t[0] for t in tests if t is not None) - {sympy.true}

        for test, run in itertools.groupby(users, row_test):
            # copies under one row test read under one 'if' (one branch, not one per vector);
            # untested ones read just before their use, to keep few vectors live
            group = list(run)
            for batch in [group] if test else [[right] for right in group]:
                loads = [n for right in batch for n in walk(right) if isinstance(n, Load)]
                read_together(readers, loads)
                for right in batch:
                    for j, reader in enumerate(readers):
                        vector = reader.expr(right)
                        for i, left in users[right]:
                            taps.add(f"{acc[i][j]} = fma({reader.expr(left)}, {vector}, "
                                     f"{acc[i][j]});")
        for i, copy in enumerate(copies):
            for j, start in enumerate(win.starts):
                writer = VectorPrinter(self, cols.flat, start, stores, syntax,
                                       lanes={c.reduce: acc[i][j]})
                for buf, offset, value in win.epilogue:
                    text = writer.expr(specialise(value, copy, ranges, keep={c.reduce}))
                    off = specialise_index(offset, {**copy, cols.flat: start}, ranges)
                    stores.add(syntax.store.format(v=text, ptr=self.arg_names[buf.name],
                                                   off=self.index(off)))
        src = templates.render("opencl", "window.cl", name=k.name, params=self.params(),
                               rows=str(len(copies)), nv=str(len(win.starts)),
                               width=str(cols.width), index="\n".join(index.lines),
                               sums="\n".join(sums.lines), taps="\n".join(taps.lines),
                               stores="\n".join(stores.lines))
        return src, launch

    # --- 'row': one work-item per group point, explicit vector loops ---------------------------

    def _row(self) -> tuple[str, Launch]:
        k = self.kernel
        index, body = Scope([], 1), Scope([], 1)
        launch = self._ndrange(self.group_axes(), index)
        launch = Launch(launch.global_size, tuple(1 for _ in launch.global_size))
        self.group_body(body, vectorize=True)
        src = templates.render("opencl", "row_reduce.cl", name=k.name, params=self.params(),
                               width=str((self.vector or VECTOR).width),
                               index="\n".join(index.lines),
                               body="\n".join(body.lines))
        return src, launch


@lru_cache(maxsize=256)  # asked by the tuner's search space and the emitter, per emit
def opencl_contraction(kernel: LoopKernel) -> Contraction | None:
    """The contraction the 'tiled' schedule runs: ``loop_ir.contraction``'s, or a rowless one
    (depthwise conv) when its columns load as vectors; the row-less form with lanes loaded one
    by one would lose to the 'item' and 'row' schedules."""
    found = contraction(kernel)
    if found is not None or not all(b.dtype is DType.float32 for b in kernel.outputs):
        return found
    rowless = contraction(kernel, rowless=True)
    if rowless is None or operand_has_reduction(rowless.right):
        return None
    plan = _vector_plan(kernel, rowless, VECTOR_TILE, False)
    return rowless if plan is not None and plan.right is not None else None


@dataclass(frozen=True)
class _WindowPlan:
    """A 'window' kernel's columns: the run ``columns`` walks as vectors starting at ``starts``
    (the last one overlaps its neighbour where the run is no multiple of the width), ``block``
    the domain position of the axis whose points one work-item owns several of (None: no axis
    outside the run), and each output's flat store offset and vector epilogue."""

    columns: _VectorPlan
    starts: tuple[int, ...]
    block: int | None
    epilogue: tuple[tuple[Buffer, sympy.Expr, Expr], ...]
    # rows of ``block`` a work-item may own: divisors of its extent up to 8 whose copies of the
    # taps stay within the straight-line code budget
    row_choices: tuple[int, ...]

    @property
    def default_rows(self) -> int:
        return max(r for r in self.row_choices if r <= WINDOW_ROWS)


@lru_cache(maxsize=256)
def opencl_window(kernel: LoopKernel) -> _WindowPlan | None:
    """The 'window' plan when ``kernel`` is a row-less contraction (one operand has no axis of
    its own: a depthwise conv's weights) whose other operand reads a run of at most
    ``WINDOW_MAX_RUN`` output columns as vectors, with a vector epilogue, and whose taps times
    vectors fit the straight-line code budget; else None."""
    c = opencl_contraction(kernel)
    if c is None or c.rows or operand_has_reduction(c.left) or operand_has_reduction(c.right):
        return None
    plan = _vector_plan(kernel, c, (1, WINDOW_MAX_RUN), False)
    if plan is None or plan.right is None:
        return None
    n_run = prod(kernel.domain[i][1] for i in plan.run)
    epilogue = _vector_epilogue(kernel, c, plan)
    if n_run > WINDOW_MAX_RUN or epilogue is None:
        return None
    # two vectors at least where the run allows: a vector as wide as the run has no read
    # inside it to move a lane over at the padded ends (16 columns: two float8)
    w = next((w for w in VECTOR_WIDTHS if 2 * w <= n_run), plan.width)
    plan = replace(plan, width=w)
    starts = list(range(0, n_run - w + 1, w))
    if starts[-1] + w < n_run:
        starts.append(n_run - w)
    per_row = extent(c.reduce) * len(starts)
    if per_row > WINDOW_MAX_FMAS:  # a long window: straight-line code
        return None
    outer = [i for i in c.cols if i not in plan.run]
    block = outer[-1] if outer else None
    n = kernel.domain[block][1] if block is not None else 1
    rows = tuple(r for r in range(1, min(n, 8) + 1)
                 if n % r == 0 and r * per_row <= WINDOW_MAX_FMAS)
    return _WindowPlan(plan, tuple(starts), block, tuple(epilogue), rows)


def _vector_epilogue(k: LoopKernel, c: Contraction, plan: _VectorPlan
                     ) -> list[tuple[Buffer, sympy.Expr, Any]] | None:
    """(output, flat store offset, flat value) for each output when all store ``width``
    lanes contiguously and have a vector form, else None."""
    run = [k.domain[i] for i in plan.run]
    offset = flatten_offset(k.store_offset, run, plan.flat)
    if offset is None or offset.coeff(plan.flat) != 1:
        return None
    syntax, keep = _vector_syntax(plan.width), frozenset({c.reduce})
    out = []
    for buf, st in zip(k.outputs, k.stores):
        value = flatten_axes(st.value, run, plan.flat, keep)
        if value is None or not vectorizable(value, plan.flat, syntax, keep):
            return None
        out.append((buf, offset, value))
    return out


@cache
def _vector_syntax(width: int) -> VectorSyntax:
    return replace(VECTOR, width=width, vtype=f"float{width}", mtype=f"int{width}",
                   load=f"vload{width}(0, {{ptr}} + {{off}})",
                   store=f"vstore{width}({{v}}, 0, {{ptr}} + {{off}});",
                   broadcast=f"((float{width})({{0}}))",
                   broadcast_mask=f"((int{width})(-({{0}})))",
                   iota=f"((int{width})({', '.join(str(j) for j in range(width))}))",
                   fma="fma({0}, {1}, {2})", lane="{v}.s{j:x}",
                   compose=f"((float{width})({{0}}))")


@dataclass(frozen=True)
class _VectorPlan:
    """Columns of a vector-column contraction tile: ``run`` (domain positions, row-major) is
    the column axes one tile walks as ``tile_n`` consecutive flat positions, ``width`` lanes a
    vector; ``right`` is the right operand over the flat position ``flat`` when it reads the run
    contiguously (vector loads), else None (lanes loaded one by one)."""

    run: tuple[int, ...]
    width: int
    tile_n: int
    flat: sympy.Symbol
    right: Expr | None


def _vector_plan(k: LoopKernel, c: Contraction, tile: tuple[int, int],
                 full_columns: bool, producer: bool = False) -> _VectorPlan | None:
    """The widest contiguous run of trailing column axes the right operand reads, and the
    vector width and tile that fit it; None when no run has 4 columns (scalar template).
    ``full_columns`` (AGO) needs one tile spanning every column; ``producer`` lets the right
    operand hold a reduction (AGO's producer as the vector operand)."""
    flat = sympy.Symbol("kg_col")
    syntax = _vector_syntax(VECTOR_WIDTHS[0])
    cols = list(c.cols)
    # default: lanes loaded one by one over every column
    choice: tuple[tuple[int, ...], Expr | None] = (tuple(cols), None)
    for start in range(len(cols) if not full_columns else 1):
        run = tuple(cols[start:])
        merged = flatten_axes(c.right, [k.domain[i] for i in run], flat)
        if merged is not None and vectorizable(merged, flat, syntax, guarded=True,
                                               reductions=producer):
            choice = (run, merged)
            break
    run, right = choice
    n_run = prod(k.domain[i][1] for i in run)
    if full_columns:
        width = next((w for w in VECTOR_WIDTHS if n_run % w == 0), 0)
        return _VectorPlan(run, width, n_run, flat, right) if width else None
    want = max(tile[1], 1)
    widths = [w for w in VECTOR_WIDTHS if w <= min(want, n_run)]
    if not widths:
        return None
    width = next((w for w in widths if want % w == 0), widths[0])
    return _VectorPlan(run, width, min(want - want % width, n_run - n_run % width), flat, right)


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


def _local_shape(sizes: list[int], target: int) -> tuple[int, ...]:
    """A work-group shape of at most ``target`` items, filled from dimension 0 outward."""
    local, budget = [], target
    for s in sizes:
        take = max(1, min(s, budget))
        # a divisor of the size, when not much smaller, spares the idle items of a last group
        divisor = max(d for d in range(1, take + 1) if s % d == 0)
        take = divisor if 2 * divisor >= take else take
        local.append(take)
        budget = max(1, budget // take)
    return tuple(local)


def emit_opencl(kernel: LoopKernel, **options: Any) -> tuple[str, Launch, dict[str, Any]]:
    """Source, launch geometry and tunables for ``kernel``."""
    allowed = {"local_size", "reduce_strategy", "capabilities", "tile_m", "tile_n", "unroll",
               "window_rows", "group_rows", "pack_b", "pack_in_tile"}
    if unknown := set(options) - allowed:
        raise TypeError(f"unknown OpenCL emit options {sorted(unknown)}; expected "
                        f"{sorted(allowed)}")
    explicit = "tile_m" in options or "tile_n" in options
    emitter = OpenCLEmitter(kernel, options.get("local_size"), options.get("reduce_strategy"),
                            options.get("capabilities", CAPABILITIES),
                            (options.get("tile_m", 4), options.get("tile_n", 4)) if explicit
                            else None, options.get("unroll"), options.get("window_rows"),
                            options.get("group_rows"), options.get("pack_b"),
                            options.get("pack_in_tile"))
    source, launch = emitter.emit()
    tunables = {"local_size": emitter.local, "reduce_strategy": emitter.strategy,
                "index_type": emitter.index_t}
    extra: dict[str, Any] = {"schedule": emitter.strategy, "tunables": tunables}
    if emitter.strategy == "elementwise":
        tunables["unroll"] = emitter.unroll
    if emitter.strategy == "window":
        tunables["window_rows"] = emitter.window_rows
    if emitter.strategy in STAGED_STRATEGIES and kernel.staged:
        tunables["group_rows"] = emitter.group_rows
    if kernel.staged:  # each staged producer row once per group point (staging.py)
        extra.update(staged_rows=[st.buffer.name for st in kernel.staged],
                     producer_redundancy=1.0)
    if emitter.strategy == "tiled":
        tunables.update(tile_m=emitter.effective_tile[0], tile_n=emitter.effective_tile[1])
        if emitter.packed is not None:  # the vector template decided
            tunables["pack_b"] = emitter.packed
            extra["right_operand_reads"] = emitter.right_reads
            if emitter.packed:
                tunables["pack_in_tile"] = emitter.packed_in_tile
                extra["packed_operand_reads"] = emitter.right_reads
        extra["producer_redundancy"] = emitter.producer_recomputed or producer_redundancy(
            kernel, emitter.effective_tile[1])
    return source, launch, extra


__all__ = ["CAPABILITIES", "Capabilities", "Launch", "OpenCLEmitter", "emit_opencl",
           "opencl_contraction", "opencl_window"]
