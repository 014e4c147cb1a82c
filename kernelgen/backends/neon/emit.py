"""NEON C emitter: the loop IR as one C function with ARM NEON intrinsics.

The same source compiles on AArch64 (``arm_neon.h``) and on x86 through SIMDe. Threads: OpenMP
``parallel for`` over the parallel axes (the group axes of a reduction, the outer axes of an
elementwise kernel, or chunks of a 1-D one). OpenMP because it is in every GCC, including the
static AArch64 cross toolchain the qemu check uses, and its static schedule costs one barrier per
kernel; a hand-rolled pool would add code and no speed at this grain. The innermost contiguous
axis runs as ``float32x4_t`` loops with scalar tails; reductions use ``vaddvq_f32``/
``vmaxnmvq_f32`` for the horizontal step.

Parameters are positional (``in0``, ``out0``; the comment above the function names them), and
the function name carries a hash of the code, so identical kernels have identical source however
their tensors are named, and many kernels can share one translation unit (SIMDe's headers cost
about a second per unit to parse).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

import sympy

from ...dtypes import DType
from ...ir.expr import free_index_symbols
from ...ir.loop import Buffer, LoopKernel
from ...lower import unroll
from ...lower.contraction import (Contraction, contraction, operand_buffers,
                                  operand_has_reduction)
from ...shapes import prod
from ...version import __version__
from .. import templates
from ..base import Capabilities
from ..c.emitter import CEmitter, VectorSyntax, vector_columns_ok, vectorizable
from ..printer import Scope

_UNARY_F = ("exp", "expm1", "log", "log1p", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan",
            "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "rint")
_COMPARE = {"lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}",
            "eq": "{0} == {1}", "ne": "{0} != {1}"}


def _per_dtype(name: str) -> dict[DType, str]:
    return {DType.float32: name + "f", DType.float64: name}


_FLOAT: dict[str, Any] = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}",
    **{f: {dt: f"{n}({{0}})" for dt, n in _per_dtype(f).items()} for f in _UNARY_F},
    "abs": {dt: f"{n}({{0}})" for dt, n in _per_dtype("fabs").items()},
    "max": {dt: f"{n}({{0}}, {{1}})" for dt, n in _per_dtype("fmax").items()},
    "min": {dt: f"{n}({{0}}, {{1}})" for dt, n in _per_dtype("fmin").items()},
    "pow": {dt: f"{n}({{0}}, {{1}})" for dt, n in _per_dtype("pow").items()},
    "fmod": {dt: f"{n}({{0}}, {{1}})" for dt, n in _per_dtype("fmod").items()},
    "rsqrt": {DType.float32: "1.0f / sqrtf({0})", DType.float64: "1.0 / sqrt({0})"},
    "sign": "({0} > 0 ? 1 : ({0} < 0 ? -1 : {0}))",
    "isnan": "isnan({0})", "isinf": "isinf({0})", **_COMPARE,
}
_INT = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "abs": "({0} < 0 ? -{0} : {0})", "max": "({0} > {1} ? {0} : {1})",
    "min": "({0} < {1} ? {0} : {1})", "mod": "KG_FLOORMOD({0}, {1})",
    "sign": "(({0} > 0) - ({0} < 0))", **_COMPARE,
    "and": "{0} && {1}", "or": "{0} || {1}", "xor": "{0} != {1}", "not": "!{0}",
}
# Functions NEON has no instruction for run lane by lane through libm (kg_v_<fn>), except exp,
# which has a polynomial version (softmax and friends live on it).
_LANEWISE = [f for f in _UNARY_F if f not in ("exp", "sqrt", "floor", "ceil", "rint")]
VECTOR = VectorSyntax(
    width=4, vtype="float32x4_t", mtype="uint32x4_t", load="vld1q_f32({ptr} + {off})",
    load_stride2="vld2q_f32({ptr} + {off}).val[0]",
    store="vst1q_f32({ptr} + {off}, {v});", broadcast="vdupq_n_f32({0})",
    broadcast_mask="vdupq_n_u32(({0}) ? 0xFFFFFFFFu : 0u)", select="vbslq_f32({0}, {1}, {2})",
    functions={
        "add": "vaddq_f32({0}, {1})", "sub": "vsubq_f32({0}, {1})", "mul": "vmulq_f32({0}, {1})",
        "div": "vdivq_f32({0}, {1})", "neg": "vnegq_f32({0})", "abs": "vabsq_f32({0})",
        "max": "vmaxnmq_f32({0}, {1})", "min": "vminnmq_f32({0}, {1})",
        "sqrt": "vsqrtq_f32({0})", "rsqrt": "vdivq_f32(vdupq_n_f32(1.0f), vsqrtq_f32({0}))",
        "exp": "kg_vexpq_f32({0})", "floor": "vrndmq_f32({0})", "ceil": "vrndpq_f32({0})",
        "rint": "vrndnq_f32({0})", "pow": "kg_v_powf({0}, {1})", "fmod": "kg_v_fmodf({0}, {1})",
        "sign": "kg_v_signf({0})",
        **{f: f"kg_v_{f}f({{0}})" for f in _LANEWISE},
        "lt": "vcltq_f32({0}, {1})", "le": "vcleq_f32({0}, {1})", "gt": "vcgtq_f32({0}, {1})",
        "ge": "vcgeq_f32({0}, {1})", "eq": "vceqq_f32({0}, {1})",
        "ne": "vmvnq_u32(vceqq_f32({0}, {1}))", "isnan": "vmvnq_u32(vceqq_f32({0}, {0}))",
        "isinf": "vceqq_f32(vabsq_f32({0}), vdupq_n_f32(INFINITY))",
        "and": "vandq_u32({0}, {1})", "or": "vorrq_u32({0}, {1})",
        "xor": "veorq_u32({0}, {1})", "not": "vmvnq_u32({0})",
    },
    fma="vfmaq_f32({2}, {0}, {1})",
    lane_ints="kg_vlanes_s32({first}, {step})",
    sign_masks={">=": "vcgeq_s32({0}, vdupq_n_s32(0))", ">": "vcgtq_s32({0}, vdupq_n_s32(0))",
                "<=": "vcleq_s32({0}, vdupq_n_s32(0))", "<": "vcltq_s32({0}, vdupq_n_s32(0))"},
    mask_and="vandq_u32({0}, {1})", mask_load="vld1q_u32((const uint32_t*){ptr} + {off})",
    combine={"sum": "vaddq_f32({a}, {b})", "prod": "vmulq_f32({a}, {b})",
             "max": "vmaxnmq_f32({a}, {b})", "min": "vminnmq_f32({a}, {b})"},
    horizontal={"sum": "vaddvq_f32({v})", "max": "vmaxnmvq_f32({v})",
                "min": "vminnmvq_f32({v})", "prod": "kg_vmulvq_f32({v})"},
)

# Below this many output elements a kernel runs on one thread (OpenMP start-up costs more).
PARALLEL_MIN_ELEMENTS = 1 << 15
CHUNK = 1 << 14  # elements per parallel chunk of a 1-D elementwise kernel
# Pack the right operand of a contraction into per-tile panels above this size. Measured with
# the row-blocked tile order (GFLOP/s, 4x16 tiles, unpacked -> packed): 256^3 59 -> 101,
# 512^3 40 -> 99, 1024^3 31 -> 103. Packed 2048^3 went 64 -> 86-104 with the row blocks.
PACK_B_MIN_BYTES = 256 << 10
# The packed template sweeps the column panels with blocks of row tiles whose left-operand rows
# fit in this much cache (half a typical L2), so neither operand streams from memory per tile.
ROW_BLOCK_BYTES = 512 << 10
# ... and packs the panels in blocks of this many bytes, each consumed by the tiles while it is
# in cache (MegEngine's cache-sized im2col blocks) instead of the whole operand before any tile.
PACK_BLOCK_BYTES = 512 << 10
# At most this many channels of a packed AGO producer are computed together
# (``contraction_holes``'s ``k_group``). Conv3x3+ReLU -> 1x1, 32 channels at 56x56, ms, fused
# against the two kernels: 1 channel 4.1 / 1.4, 4: 2.1 / 1.3, 8: 1.31-1.35 / 1.34-1.37,
# 16: 1.23-1.26 / 1.35-1.40, 32: 2.35 / 1.34 (more accumulators than registers).
PRODUCER_GROUP = 16

# 'tiled': the register-tiled contraction template; 'columns': per-element reductions (a
# depthwise conv's window) as one vector accumulator per run of four output columns, loads
# through padding as vectors (``columns_plan``); 'row': one group point at a time, its
# reductions scalar or vectorised along their own axis.
SCHEDULES = ("tiled", "columns", "row")

CAPABILITIES = Capabilities(name="neon", vector_width=VECTOR.width, simd_within_work_item=True,
                            direct_schedule="row", im2col_max_channels=64)


@dataclass(frozen=True)
class NeonSource:
    """A kernel's C: the shared header, the helpers it uses, and its function."""

    function_name: str
    helpers: dict[str, str]
    function: str

    @property
    def text(self) -> str:
        return "\n".join([templates.render("neon", "header.c", version=__version__),
                          *self.helpers.values(), self.function])

    @property
    def code(self) -> str:
        """The text without the comment lines that name tensors: what the cache keys on, so
        the same kernel built from differently named tensors hits the same library."""
        return "\n".join(line for line in self.text.splitlines()
                         if not line.lstrip().startswith("//"))


class NeonEmitter(CEmitter):
    backend = "neon"
    scalar_types = {DType.float32: "float", DType.float64: "double", DType.int32: "int32_t",
                    DType.int64: "int64_t", DType.bool: "bool", DType.float16: "float"}
    buffer_types = {DType.float32: "float", DType.float64: "double", DType.int32: "int32_t",
                    DType.int64: "int64_t", DType.bool: "uint8_t", DType.float16: "_Float16"}
    float_formats = _FLOAT
    int_formats = _INT
    vector = VECTOR
    long_t = "int64_t"
    input_qualifier, output_qualifier = "const ", ""
    ix_max = "(({a}) > ({b}) ? ({a}) : ({b}))"
    ix_min = "(({a}) < ({b}) ? ({a}) : ({b}))"

    guarded_element_vectors = True

    def __init__(self, kernel: LoopKernel, capabilities: Capabilities = CAPABILITIES,
                 tile: tuple[int, int] | None = None, schedule: str | None = None,
                 pack_b: bool | None = None, group_rows: int | None = None,
                 pack_block_kib: int | None = None) -> None:
        if schedule is not None and schedule not in SCHEDULES:
            raise ValueError(f"kernel '{kernel.name}': NEON schedule must be one of {SCHEDULES}, "
                             f"got {schedule!r}")
        self.tile_default = tile is None
        tile = tile or (4, 8)
        if tile[0] < 1 or tile[1] < 4 or tile[1] % 4:
            raise ValueError(f"NEON tiles need tile_m >= 1 and tile_n a multiple of 4, got {tile}")
        self.tile = tile
        self.pack_b = pack_b
        if pack_block_kib is not None and pack_block_kib < 1:
            raise ValueError(f"kernel '{kernel.name}': pack_block_kib must be at least 1, "
                             f"got {pack_block_kib}")
        self.pack_block_kib = pack_block_kib or PACK_BLOCK_BYTES >> 10
        self.pack_panels = 0  # panels per packed block, once the tiles are known
        self.contraction = contraction(kernel) if schedule in (None, "tiled") else None
        c = self.contraction
        if c is not None and not _loads_rows_as_vectors(kernel, c) and \
                _loads_rows_as_vectors(kernel, c.swapped(), producer=True):
            # the right operand is the one packed and loaded in vectors along its columns: a
            # conv's patches (x[..., ow + kw]) rather than its weights (w[m, c, kh, kw]); an
            # AGO producer (conv3x3 -> 1x1) as vector accumulators, each packed element once
            self.contraction = c.swapped()
            if pack_b is None and operand_has_reduction(c.left):
                self.pack_b = True
        self.producer_recomputed = 1.0  # how often a fused producer element is computed
        if schedule == "tiled" and self.contraction is None:
            raise ValueError("schedule 'tiled' needs a contraction (one sum of a product of "
                             "operands on disjoint output axes)")
        # a contraction takes the tiles: no need to plan columns for it
        columns = columns_plan(kernel) if self.contraction is None and \
            schedule in (None, "columns") else None
        if schedule == "columns" and columns is None:
            raise ValueError(f"kernel '{kernel.name}' cannot run schedule 'columns', which "
                             f"needs reductions computed per element and every store as "
                             f"float32 vectors along the last axis (contiguous or padded "
                             f"loads, at least {2 * VECTOR.width} columns)")
        self.columns = columns is not None
        if self.columns:
            kernel = columns  # type: ignore[assignment]
        elif not kernel.grouped:  # elementwise: the outer axes are the parallel ones
            kernel = replace(kernel, group=tuple(range(len(kernel.domain) - 1)))
        super().__init__(kernel, capabilities)
        # a staged kernel's 'row' schedule: several group points (queries) per iteration
        if self.contraction is not None and group_rows not in (None, 1):
            raise ValueError(f"group_rows applies to the 'row' schedule; kernel "
                             f"'{kernel.name}' runs 'tiled'")
        self.group_rows = 1 if self.contraction is not None else \
            unroll.choose_group_rows(kernel, group_rows, share=True)
        self.group_plan = unroll.split_group(kernel, self.group_rows)
        roles = [("in", b) for b in kernel.inputs] + [("out", b) for b in kernel.outputs]
        counts = {"in": 0, "out": 0}
        for role, b in roles:
            self.arg_names[b.name] = f"{role}{counts[role]}"
            counts[role] += 1

    def combine(self, kind: str, dtype: DType, a: str, b: str) -> str:
        if kind in ("max", "min"):  # fmaxf / fmax / integer ternary, by dtype
            table = self.float_formats if dtype.is_float else self.int_formats
            fmt = table[kind]
            fmt = fmt[dtype.compute] if isinstance(fmt, dict) else fmt
            return fmt.format(a, b)
        return super().combine(kind, dtype, a, b)

    def buffer_load(self, buf: Buffer, offset: str) -> str:
        if buf.dtype is DType.float16:
            return f"(float){self.arg_names[buf.name]}[{offset}]"
        return super().buffer_load(buf, offset)

    def buffer_store(self, buf: Buffer, offset: str, value: str) -> str:
        cast = {DType.float16: "_Float16", DType.bool: "uint8_t"}.get(buf.dtype)
        return super().buffer_store(buf, offset, f"({cast})({value})" if cast else value)

    def _tiled(self) -> str:
        k, c = self.kernel, self.contraction
        assert c is not None
        n_rows = prod(k.domain[i][1] for i in c.rows)
        n_cols = prod(k.domain[i][1] for i in c.cols)
        tm, tn = min(self.tile[0], n_rows), self.tile[1]
        if self.tile_default and operand_has_reduction(c.left) and n_cols <= 64:
            tn = -(-n_cols // 4) * 4  # AGO: one column tile, each producer element once
        self.tile = (tm, tn)
        if operand_has_reduction(c.left):  # once per column tile
            self.producer_recomputed = float(-(-n_cols // tn))
        pragma = "#pragma omp parallel for schedule(static)" \
            if k.numel >= PARALLEL_MIN_ELEMENTS else "// one thread: too small to split"
        if self.pack_b is None:  # measured: packing pays from 256^3 up
            right_bytes = 4 * prod(n for _, n in c.reduce.axes) * \
                prod(k.domain[i][1] for i in c.cols + c.batch)
            self.pack_b = right_bytes > PACK_B_MIN_BYTES
        if operand_has_reduction(c.right) and not self.pack_b:  # once per row tile
            self.producer_recomputed = float(-(-n_rows // tm))
        # a packed producer (AGO) computes several of its channels at once: their sums share
        # each input load and run as independent chains (one would wait on each FMA)
        grouped = self.pack_b and operand_has_reduction(c.right) and sympy.Symbol("kg_k") in \
            free_index_symbols(self.flat_reduction(c.right))
        k_extent = prod(n for _, n in c.reduce.axes)
        groups = -(-k_extent // PRODUCER_GROUP)
        self.k_group = -(-k_extent // groups) if grouped else 1  # even groups, none wasted
        holes = self.contraction_holes(tm, tn, depth=5 if self.pack_b else 4,
                                       b_row=5 if self.pack_b else 4, k_group=self.k_group)
        if self.pack_b:
            tiles_r = int(holes["tiles_r"])
            block = min(tiles_r, max(1, ROW_BLOCK_BYTES // (4 * tm * k_extent)))
            panels = int(holes["batches"]) * int(holes["tiles_c"])
            self.pack_panels = min(panels, max(1, (self.pack_block_kib << 10) //
                                               (4 * tn * k_extent)))
            holes.update(row_block=str(block), row_blocks=str(-(-tiles_r // block)),
                         k_group=str(self.k_group),
                         block_panels=str(self.pack_panels),
                         block_kib=str(-(-4 * tn * k_extent * self.pack_panels // 1024)))
        template = "contraction_packed.c" if self.pack_b else "contraction.c"
        return templates.render("neon", template, name="KG_FN", params=self.params(),
                                pragma=pragma, tn_vec=str(tn // 4), **holes)

    def emit(self) -> NeonSource:
        k = self.kernel
        if self.contraction is not None:
            return self._finish(self._tiled(), "tiled")
        body = Scope([], 1)
        parallel = self.group_axes()
        threads = k.numel >= PARALLEL_MIN_ELEMENTS
        pragma = "#pragma omp parallel for schedule(static)"
        if parallel:
            groups = prod(n for _, n in parallel)
            if threads and groups > 1:
                body.add(pragma)
            g = self.fresh("g")
            inner = self.open_loop(body, g, "0", self.int_literal(groups))
            self.decompose(g, parallel, inner)
            self.group_body(inner, vectorize=True)
            self.close_loop(body)
        elif not k.grouped and len(k.domain) == 1 and threads:
            n = k.domain[0][1]
            chunks = -(-n // CHUNK)
            body.add(pragma)
            c = self.fresh("c")
            inner = self.open_loop(body, c, "0", self.int_literal(chunks))
            start, stop = self.fresh("start"), self.fresh("stop")
            self.declare_index(inner, start, f"{c} * {CHUNK}")
            self.declare_index(inner, stop, f"{start} + {CHUNK} < {n} ? {start} + {CHUNK} : {n}")
            self.group_body(inner, vectorize=True, element_range=(start, stop))
            self.close_loop(body)
        else:
            self.group_body(body, vectorize=True)
        code = templates.render("neon", "function.c", name="KG_FN", params=self.params(),
                                body="\n".join(body.lines))
        return self._finish(code, "columns" if self.columns else
                            "row" if k.grouped else "elementwise")

    def _finish(self, code: str, schedule: str) -> NeonSource:
        """Name the function by a hash of its code, document its parameters, pick helpers."""
        k = self.kernel
        self.schedule = schedule
        doc = "\n".join(f"//   {self.arg_names[b.name]}: {role} '{b.name}' {b.dtype}{list(b.shape)}"
                        for role, bufs in (("input", k.inputs), ("output", k.outputs))
                        for b in bufs)
        digest = hashlib.sha256(code.encode()).hexdigest()[:12]
        name = f"kg_{_c_name(k.name)}_{digest}"
        function = f"// {k.name}\n{doc}\n" + code.replace("KG_FN", name)
        helpers = {h: body for h, body in _helpers().items() if h in code}
        return NeonSource(name, helpers, function)


def columns_plan(kernel: LoopKernel) -> LoopKernel | None:
    """``kernel`` with the reductions that the last axis keys computed per element inside a
    vector loop over that axis (the 'columns' schedule), or None where that does not apply. It
    applies when the hoisted reductions key every domain axis together (so a group point is
    one element, and 'row' runs each window scalar: a depthwise conv) and every store
    vectorises along the last axis, those reductions as vector accumulators. The others stay
    hoisted, now once per row of the last axis (inside a vector accumulator's loop they would
    be computed again at every step)."""
    if not kernel.hoisted or kernel.staged or not kernel.domain or \
            len(kernel.group) != len(kernel.domain):
        return None
    last, _ = kernel.domain[-1]
    rows = tuple(r for r in kernel.hoisted if last not in free_index_symbols(r))
    plan = replace(kernel, hoisted=rows, group=tuple(range(len(kernel.domain) - 1)))
    return plan if vector_columns_ok(plan, VECTOR, guarded=True) else None


def _loads_rows_as_vectors(kernel: LoopKernel, c: Contraction, producer: bool = False) -> bool:
    """Whether ``c``'s right operand loads as float32 vectors along its last column axis
    (``producer``: computes so, a fused producer's reduction as vector accumulators)."""
    if not c.cols:
        return False
    sym = kernel.domain[c.cols[-1]][0]
    return vectorizable(c.right, sym, VECTOR, frozenset(kernel.hoisted), guarded=True,
                        reductions=producer)


def _c_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)[:40]


def _helpers() -> dict[str, str]:
    """Vector helpers by name, defined only in kernels that use them."""
    out = {"kg_vexpq_f32": templates.render("neon", "vexp.c"),
           "kg_vmulvq_f32": templates.render("neon", "vmulv.c")}
    for f in _LANEWISE:
        out[f"kg_v_{f}f"] = templates.render("neon", "lanewise.c", name=f"kg_v_{f}f", fn=f"{f}f")
    out["kg_v_signf"] = templates.render("neon", "vsign.c")
    out["kg_vlanes_s32"] = templates.render("neon", "vlanes.c")
    for f in ("pow", "fmod"):
        out[f"kg_v_{f}f"] = templates.render("neon", "lanewise2.c", name=f"kg_v_{f}f",
                                             fn=f"{f}f")
    return out


def emit_neon(kernel: LoopKernel, **options: Any) -> tuple[NeonSource, dict[str, Any]]:
    allowed = {"capabilities", "tile_m", "tile_n", "schedule", "pack_b", "group_rows",
               "pack_block_kib"}
    if unknown := set(options) - allowed:
        raise TypeError(f"unknown NEON emit options {sorted(unknown)}; expected {sorted(allowed)}")
    explicit = "tile_m" in options or "tile_n" in options
    emitter = NeonEmitter(kernel, options.get("capabilities", CAPABILITIES),
                          (options.get("tile_m", 4), options.get("tile_n", 8)) if explicit
                          else None, options.get("schedule"), options.get("pack_b"),
                          options.get("group_rows"), options.get("pack_block_kib"))
    source = emitter.emit()
    schedule = emitter.schedule
    tunables = {"vector_width": VECTOR.width, "index_type": emitter.index_t,
                "parallel_min_elements": PARALLEL_MIN_ELEMENTS, "chunk": CHUNK}
    if schedule == "tiled":
        tunables.update(tile_m=emitter.tile[0], tile_n=emitter.tile[1], pack_b=emitter.pack_b)
        if emitter.pack_b:
            tunables.update(pack_block_kib=emitter.pack_block_kib,
                            pack_panels=emitter.pack_panels)
        c = emitter.contraction
        assert c is not None
        tiled = {"schedule": schedule, "tunables": tunables,
                 "function": source.function_name, "threads": "openmp",
                 "producer_redundancy": emitter.producer_recomputed,
                 # the buffers the right operand (the one packed, if any) reads
                 "right_operand_reads": operand_buffers(c.right)}
        if emitter.pack_b:
            tiled["packed_operand_reads"] = tiled["right_operand_reads"]
        return source, tiled
    extra: dict[str, Any] = {"schedule": schedule, "tunables": tunables,
                             "function": source.function_name, "threads": "openmp"}
    if kernel.staged:  # each staged producer row once per group point (staging.py)
        extra.update(staged_rows=[st.buffer.name for st in kernel.staged],
                     producer_redundancy=1.0)
        tunables["group_rows"] = emitter.group_rows
    return source, extra
