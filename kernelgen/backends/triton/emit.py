"""Triton emitter: the loop IR as a ``@triton.jit`` kernel in a generated Python module.

Schedules:
- ``elementwise``: each program handles ``BLOCK`` consecutive domain points (masked at the
  ragged end); domain indices come from the flat position by ``//`` and ``%``.
- ``row``: one program per group point; each hoisted reduction runs over its extent in blocks of
  ``BLOCK_R`` lanes (masked lanes hold the combiner's identity) and finishes with ``tl.sum``/
  ``tl.max``/``tl.min``/``tl.reduce``; then the group's elements go out in blocks of
  ``BLOCK_E``. A single-kernel softmax is one such program per row. A staged producer row
  (``staging.py``: attention's score row) is one block of the program, the row padded to a power
  of two; every reduction over it reads the block whole, and one computed per element (the
  output's sum over the keys) runs as a ``[row, BLOCK_E]`` tile reduced along the row.

Only ``triton.language`` core functions are used: primitives it lacks (tanh, expm1, pow, rint,
atan...) are ``@triton.jit`` helpers in ``templates/triton/helpers.py.tmpl`` built from them,
because libdevice externs do not run under ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

import sympy

from ...dtypes import DType
from ...ir.expr import Axis, Call, Cast, Expr, Load, Reduce, free_index_symbols, walk
from ...ir.loop import LoopKernel, Staged
from ...lower.contraction import contraction, operand_buffers, operand_has_reduction
from ...lower.staging import hoist_order, unstage
from ...shapes import prod
from ...version import __version__
from .. import templates
from ..base import Capabilities
from ..printer import Emitter, Scope

_TL = {DType.float32: "tl.float32", DType.float16: "tl.float16", DType.float64: "tl.float64",
       DType.int32: "tl.int32", DType.int64: "tl.int64", DType.bool: "tl.int1"}
SIGNATURE = {DType.float32: "*fp32", DType.float16: "*fp16", DType.float64: "*fp64",
             DType.int32: "*i32", DType.int64: "*i64", DType.bool: "*i1"}
_FLOAT = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "neg": "(-{0})", "abs": "tl.abs({0})", "max": "tl.maximum({0}, {1})",
    "min": "tl.minimum({0}, {1})",
    **{f: f"tl.{f}({{0}})" for f in ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "erf",
                                     "floor", "ceil")},
    **{f: f"kg_{f}({{0}})" for f in ("tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                                     "asinh", "acosh", "atanh", "expm1", "log1p", "rint",
                                     "sign", "isnan", "isinf")},
    "pow": "kg_pow({0}, {1})", "fmod": "kg_fmod({0}, {1})",
    "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})",
}
_INT = {
    **{k: v for k, v in _FLOAT.items() if k in ("add", "sub", "mul", "neg", "abs", "max", "min",
                                                 "lt", "le", "gt", "ge", "eq", "ne")},
    "div": "kg_idiv({0}, {1})", "mod": "kg_imod({0}, {1})", "sign": "kg_isign({0})",
    # tl.where, not & and |: the interpreter cannot mix a scalar and a vector boolean in them
    "and": "tl.where({0}, {1}, False)", "or": "tl.where({0}, True, {1})", "xor": "({0} != {1})",
    "not": "({0} == 0)",
}
_IDENTITY = {"sum": "0", "prod": "1"}
_FINISH = {"sum": "tl.sum({v}, axis=0)", "max": "tl.max({v}, axis=0)",
           "min": "tl.min({v}, axis=0)", "prod": "tl.reduce({v}, 0, kg_mul)"}

CAPABILITIES = Capabilities(name="triton", vector_width=1, direct_schedule="row")
DEFAULT_BLOCK = 1024
MAX_ROW_BLOCK = 1024
# A per-element reduction over a staged row is a [row, BLOCK_E] tile: by default at most this
# many elements (32 KiB of float32 per program), and never past Triton's limit on a tensor.
STAGED_TILE = 1 << 13
MAX_TENSOR = 1 << 20


@dataclass(frozen=True)
class TritonSource:
    """The generated module: its text, the kernel function's name, the pointer signature and
    block sizes (constexprs) it is launched with, the grid, and the float32 elements of the
    scratch buffer it takes after its outputs (0: none)."""

    text: str
    function: str
    signature: dict[str, str]
    constexprs: dict[str, int]
    grid: tuple[int, ...]
    scratch: int = 0

    @property
    def module_name(self) -> str:
        """A stable file name: Triton reads a kernel's source from its file."""
        return f"kg_{hashlib.sha256(self.text.encode()).hexdigest()[:16]}"


class TritonEmitter(Emitter):
    backend = "triton"
    ix_div = "{a} // {b}"
    ix_mod = "{a} % {b}"
    ix_floordiv = "kg_floordiv({a}, {b})"
    ix_floormod = "kg_floormod({a}, {b})"
    ix_max = "tl.maximum({a}, {b})"
    ix_min = "tl.minimum({a}, {b})"
    ix_not = "({a} == 0)"
    ix_true, ix_false = "True", "False"

    def __init__(self, kernel: LoopKernel, block: int | None = None, block_r: int | None = None,
                 block_e: int | None = None, capabilities: Capabilities = CAPABILITIES,
                 dot_blocks: tuple[int, int, int] | None = None,
                 schedule: str | None = None, pack_rows: bool = False) -> None:
        super().__init__(kernel, capabilities)
        self.block = _pow2(block or DEFAULT_BLOCK, "block")
        self.block_r, self.block_e = block_r, block_e
        self.dot_blocks = tuple(_pow2(b, "block_m/n/k") for b in (dot_blocks or (32, 32, 32)))
        if any(b < 16 for b in self.dot_blocks):
            raise ValueError("tl.dot needs block_m, block_n and block_k of at least 16")
        self.contraction = contraction(kernel) if schedule in (None, "dot") else None
        if schedule == "dot" and self.contraction is None:
            raise ValueError("schedule 'dot' needs a contraction (one sum of a product of "
                             "operands on disjoint output axes)")
        c = self.contraction
        if pack_rows and c is not None and (operand_has_reduction(c.left)
                                            or operand_has_reduction(c.right)):
            raise ValueError(f"kernel '{kernel.name}': pack_rows needs a contraction of plain "
                             f"operands; this one computes a fused producer (AGO) in its "
                             f"tiles, which a pack would materialise")
        self.pack_rows = pack_rows and c is not None  # packs only on the 'dot' schedule
        self.scratch = 0  # float32 elements of the packed panels (pack_rows)
        self.lanes: str | None = None   # the lane shape of the current vector context
        self.mask: str | None = None    # which lanes are live there
        self.lane_symbols: set[sympy.Symbol] = set()  # index symbols that vary across lanes
        # staged rows: buffer -> the block holding it; row symbols bound to a block's lanes ->
        # how a staged block lines up with the current lanes ('' 1-D, '[:, None]' in a tile)
        self.stage_blocks: dict[str, str] = {}
        self.row_lanes: dict[sympy.Symbol, str] = {}
        self.params = {b.name: f"{role}{k}" for role, bufs in (("in", kernel.inputs),
                                                                ("out", kernel.outputs))
                       for k, b in enumerate(bufs)}

    @property
    def index_t(self) -> str:
        return "tl.int64" if self.wide else "tl.int32"

    def index_and(self, parts: list[str]) -> str:
        out = parts[0]
        for p in parts[1:]:
            out = f"tl.where({out}, {p}, False)"
        return out

    def index_or(self, parts: list[str]) -> str:
        out = parts[0]
        for p in parts[1:]:
            out = f"tl.where({out}, True, {p})"
        return out

    # --- hooks ---------------------------------------------------------------------------------

    def literal(self, value: float | int | bool, dtype: DType) -> str:
        if dtype is DType.bool:
            return "True" if value else "False"
        if dtype.is_int:
            return str(int(value))
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)

    def declare(self, scope: Scope, name: str, dtype: DType, text: str) -> None:
        scope.add(f"{name} = {text}")

    def declare_index(self, scope: Scope, name: str, text: str) -> None:
        scope.add(f"{name} = {text}")

    def to_index(self, value: str) -> str:
        return f"{value}.to({self.index_t})"

    def load_text(self, node: Load, guard: str | None) -> str:
        if node.buffer in self.stage_blocks:  # a staged row: read whole, as a block
            if node.offset not in self.row_lanes:
                raise TypeError(f"staged row '{node.buffer}' read at {node.offset}, not along "
                                f"a reduction over the row")
            return f"{self.stage_blocks[node.buffer]}{self.row_lanes[node.offset]}"
        offset = self.index(node.offset)
        varies = bool(free_index_symbols(node) & self.lane_symbols)
        data = {s for s, _, _ in node.data}
        offset_varies = bool((node.offset.free_symbols - data) & self.lane_symbols) or any(
            free_index_symbols(v) & self.lane_symbols for _, _, v in node.data)
        # a block mask needs a block of pointers; 2-D tiles may vary along one axis only
        if varies and (not offset_varies or "," in str(self.lanes)):
            offset = f"{offset} + tl.zeros([{self.lanes}], tl.int32)"
        pointer = f"{self.params[node.buffer]} + ({offset})"
        masks = [m for m in (self.mask if varies else None, guard) if m]
        if masks:
            text = f"tl.load({pointer}, mask={self.index_and(masks)}, other=0)"
        else:
            text = f"tl.load({pointer})"
        buf = self.buffers[node.buffer]
        return f"{text}.to(tl.float32)" if buf.dtype is DType.float16 else text

    def call_text(self, node: Call, args: list[str]) -> str:
        table = _FLOAT if node.args[0].dtype.is_float else _INT
        return table[node.fn].format(*args)

    def select_text(self, cond: str, a: str, b: str) -> str:
        return f"tl.where({cond}, {a}, {b})"

    def cast_text(self, node: Cast, value: str) -> str:
        if node.dtype is DType.bool:
            return f"({value} != 0)"
        return f"{value}.to({_TL[node.dtype.compute]})"

    def open_loop(self, scope: Scope, var: str, start: str, stop: str) -> Scope:
        scope.add(f"for {var} in range({start}, {stop}):")
        return scope.child()

    def int_limit(self, dtype: DType, largest: bool) -> str:
        bits = 63 if dtype is DType.int64 else 31
        return str(2**bits - 1) if largest else str(-(2**bits))

    def combine(self, kind: str, dtype: DType, a: str, b: str) -> str:
        return {"sum": "({a} + {b})", "prod": "({a} * {b})", "max": "tl.maximum({a}, {b})",
                "min": "tl.minimum({a}, {b})"}[kind].format(a=a, b=b)

    def declare_acc(self, scope: Scope, name: str, node: Reduce) -> None:
        shape = f"[{self.lanes}]" if self.lanes else "[]"
        scope.add(f"{name} = tl.full({shape}, {self.reduce_init(node)}, "
                  f"{_TL[node.dtype.compute]})")

    # --- schedules -------------------------------------------------------------------------------

    def emit(self) -> TritonSource:
        k = self.kernel
        body = Scope([], 1)
        if self.contraction is not None:
            schedule, constexprs, grid = self._dot(body)
        elif k.grouped:
            schedule, constexprs, grid = self._row(body)
        else:
            schedule, constexprs, grid = self._elementwise(body)
        self.schedule = schedule
        text = "\n".join(body.lines)
        params = [self.params[b.name] for b in k.inputs + k.outputs]
        params += ["scratch"] if self.scratch else []
        params += [f"{c}: tl.constexpr" for c in constexprs]
        joined = ", ".join(params)
        if len(joined) > 60:
            joined = ",\n        ".join(params)
        function_code = templates.render("triton", "kernel.py", name="KG_FN", params=joined,
                                         body=text)
        digest = hashlib.sha256(function_code.encode()).hexdigest()[:12]
        function = f"kg_{_py_name(k.name)}_{digest}"
        doc = "\n".join(f"#   {self.params[b.name]}: {role} '{b.name}' {b.dtype}{list(b.shape)}"
                        for role, bufs in (("input", k.inputs), ("output", k.outputs))
                        for b in bufs)
        if self.scratch:
            doc += f"\n#   scratch: float32[{self.scratch}], the packed panels"
        helpers = _used_helpers(function_code)
        helpers = f"{helpers}\n\n" if helpers else ""
        module = templates.render("triton", "module.py", version=__version__, helpers=helpers,
                                  doc=doc, kernel=function_code.replace("KG_FN", function))
        signature = {self.params[b.name]: SIGNATURE[b.dtype] for b in k.inputs + k.outputs}
        if self.scratch:
            signature["scratch"] = SIGNATURE[DType.float32]
        return TritonSource(module, function, signature, constexprs, grid, self.scratch)

    def _elementwise(self, body: Scope) -> tuple[str, dict[str, int], tuple[int, ...]]:
        k = self.kernel
        n = k.numel
        pid = "tl.program_id(0)" + (".to(tl.int64)" if self.wide else "")
        if k.domain:
            body.add(f"offs = {pid} * BLOCK + tl.arange(0, BLOCK)")
            body.add(f"live = offs < {n}")
            self._enter_lanes("BLOCK", "live", list(k.domain))
            self.decompose("offs", list(k.domain), body)
        self._stores(body)
        block = min(self.block, _next_pow2(n))
        return "elementwise", {"BLOCK": block}, (-(-n // block),)

    def _row(self, body: Scope) -> tuple[str, dict[str, int], tuple[int, ...]]:
        k = self.kernel
        group = [k.domain[g] for g in k.group]
        if group:
            self.decompose("tl.program_id(0)" + (".to(tl.int64)" if self.wide else ""),
                           group, body)
        longest = max((prod(n for _, n in r.axes) for r in k.hoisted), default=1)
        block_r = _pow2(self.block_r or min(_next_pow2(longest), MAX_ROW_BLOCK), "block_r")
        order = hoist_order(k.staged, k.hoisted)
        for pos, st in enumerate(k.staged):  # each after the hoisted reductions it reads
            for r in order[pos]:
                self._row_reduce(r, body)
            self._stage_block(st, body)
        for r in order[-1]:
            self._row_reduce(r, body)
        elems = [k.domain[e] for e in k.element_axes]
        count = prod(n for _, n in elems)
        block_e = self.block_e or min(_next_pow2(count), MAX_ROW_BLOCK)
        row = staged_block(k)
        if self.block_e is None:  # a per-element sum over a staged row is a [row, BLOCK_E] tile
            block_e = max(1, min(block_e, STAGED_TILE // row))
        _pow2(block_e, "block_e")
        if row * block_e > MAX_TENSOR:
            raise ValueError(f"kernel '{k.name}': block_e {block_e} makes a [{row}, {block_e}] "
                             f"tile over its staged row, past Triton's {MAX_TENSOR} elements")
        if not elems:  # a plain reduction: one value per program
            self._stores(body)
        else:
            inner = self._lane_loop(body, "BLOCK_E", count, elems)
            self._stores(inner)
            self._leave_lanes()
        return "row", {"BLOCK_R": block_r, "BLOCK_E": block_e}, (prod(n for _, n in group),)

    def _dot(self, body: Scope) -> tuple[str, dict[str, int], tuple[int, ...]]:
        """A contraction as tiles of tl.dot: operand tiles are the fused operand expressions
        evaluated on [BLOCK_M, BLOCK_K] and [BLOCK_K, BLOCK_N] index grids (prologues included),
        the epilogue runs on the accumulator tile. Batch axes (both operands depend on them)
        are grid dimension 2, scalars inside the program.

        ``pack_rows``: each program owns a block of rows for every column. It first gathers
        that block's rows of the left operand (prologue applied: for a conv, its patches),
        BLOCK_K positions at a time, into a contiguous panel of the scratch buffer; then it
        sweeps every column block over the panel while it is in cache (MegEngine's im2col:
        a cache-sized block packed, then consumed, the pack fused into the gather)."""
        k, c = self.kernel, self.contraction
        assert c is not None
        rows = [k.domain[i] for i in c.rows]
        cols = [k.domain[i] for i in c.cols]
        batch = [k.domain[i] for i in c.batch]
        if batch:
            self.decompose("tl.program_id(2)" + (".to(tl.int64)" if self.wide else ""),
                           batch, body)
        n_rows, n_cols = prod(n for _, n in rows), prod(n for _, n in cols)
        n_k = prod(n for _, n in c.reduce.axes)
        bm, bn, bk = self.dot_blocks
        grid: tuple[int, ...] = (-(-n_rows // bm), 1 if self.pack_rows else -(-n_cols // bn))
        grid += (prod(n for _, n in batch),) if batch else ()
        body.add("rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)")
        sweep = body
        if self.pack_rows:
            k_pad = -(-n_k // bk) * bk  # whole BLOCK_K steps: the panel's loads need no mask
            self.scratch = prod(grid) * bm * k_pad
            program = "tl.program_id(0)" + (".to(tl.int64)" if self.wide else "")
            if batch:
                program = f"(tl.program_id(2) * {grid[0]} + {program})"
            body.add(f"panel = scratch + {program} * {bm * k_pad}  # [{k_pad}][BLOCK_M]")
            body.add("slots = tl.arange(0, BLOCK_K)[None, :] * BLOCK_M + "
                     "tl.arange(0, BLOCK_M)[:, None]")
            body.add(f"for k0 in range(0, {n_k}, BLOCK_K):")
            pack = body.child()
            pack.add("rk = k0 + tl.arange(0, BLOCK_K)")
            self._operand_tile(pack, "a", "rm[:, None]", "rk[None, :]", n_rows, rows, n_k,
                               c.left, "BLOCK_M, BLOCK_K")
            pack.add("tl.store(panel + k0 * BLOCK_M + slots, a_tile)")
            self._leave_lanes()
            body.add("tl.debug_barrier()  # the program's panel stores before its loads")
            body.add(f"for n0 in range(0, {n_cols}, BLOCK_N):")
            sweep = body.child()
            sweep.add("rn = n0 + tl.arange(0, BLOCK_N)")
        else:
            body.add("rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)")
        sweep.add("acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)")
        sweep.add(f"for k0 in range(0, {n_k}, BLOCK_K):")
        loop = sweep.child()
        loop.add("rk = k0 + tl.arange(0, BLOCK_K)")
        if self.pack_rows:
            loop.add("a_tile = tl.load(panel + k0 * BLOCK_M + slots)")
        else:
            self._operand_tile(loop, "a", "rm[:, None]", "rk[None, :]", n_rows, rows, n_k,
                               c.left, "BLOCK_M, BLOCK_K")
        self._operand_tile(loop, "b", "rn[None, :]", "rk[:, None]", n_cols, cols, n_k,
                           c.right, "BLOCK_K, BLOCK_N")
        loop.add('acc = tl.dot(a_tile, b_tile, acc, input_precision="ieee")')
        self._leave_lanes()
        out = Scope(sweep.lines, sweep.depth)
        for s, n in rows + cols:
            self.symbol_names[s] = f"o{k.domain.index((s, n))}"
        out.add("om = rm[:, None]")
        out.add("on = rn[None, :]")
        out.add(f"out_live = tl.where(om < {n_rows}, on < {n_cols}, False)")
        self._enter_lanes("BLOCK_M, BLOCK_N", "out_live", rows + cols)
        self.decompose("om", rows, out)
        self.decompose("on", cols, out)
        out.names[c.reduce] = "acc"
        self._stores(out)
        self._leave_lanes()
        blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
        return "dot", blocks, grid

    def _operand_tile(self, loop: Scope, side: str, pos_o: str, pos_k: str, n_o: int,
                      axes: list[Axis], n_k: int, operand: Expr, lanes: str) -> None:
        """``<side>_tile``: ``operand`` on the index grid ``pos_o`` x ``pos_k`` (zero outside)."""
        c = self.contraction
        assert c is not None
        scope = Scope(loop.lines, loop.depth)  # its own names: the two tiles' shapes differ
        o_var, k_var, live = self.fresh(f"{side}o"), self.fresh(f"{side}k"), f"{side}_live"
        scope.add(f"{o_var} = {pos_o}")
        scope.add(f"{k_var} = {pos_k}")
        scope.add(f"{live} = tl.where({o_var} < {n_o}, {k_var} < {n_k}, False)")
        for s, _ in axes:
            self.symbol_names[s] = self.fresh("o")
        for s, _ in c.reduce.axes:
            self.symbol_names[s] = self.fresh("r")
        self._enter_lanes(lanes, live, list(axes) + list(c.reduce.axes))
        self.decompose(o_var, axes, scope)
        self.decompose(k_var, list(c.reduce.axes), scope)
        scope.add(f"{side}_tile = tl.where({live}, {self.expr(operand, scope)}, 0.0)")

    def _lane_loop(self, scope: Scope, block: str, count: int,
                   axes: list[tuple[sympy.Symbol, int]]) -> Scope:
        """Open ``for`` over ``count`` positions in blocks of ``block`` lanes and bind ``axes``
        (row-major over the positions) as lane vectors; returns the loop body."""
        base, pos = self.fresh("base"), self.fresh("p")
        scope.add(f"for {base} in range(0, {count}, {block}):")
        inner = scope.child()
        inner.add(f"{pos} = {base} + tl.arange(0, {block})")
        inner.add(f"{pos}_live = {pos} < {count}")
        self._enter_lanes(block, f"{pos}_live", axes)
        self.decompose(pos, axes, inner)
        return inner

    def _enter_lanes(self, block: str, mask: str, axes: list[tuple[sympy.Symbol, int]]) -> None:
        self.lanes, self.mask = block, mask
        self.lane_symbols = {s for s, _ in axes}

    def _leave_lanes(self) -> None:
        self.lanes = self.mask = None
        self.lane_symbols = set()

    def _row_reduce(self, node: Reduce, scope: Scope) -> None:
        """A hoisted reduction: over a staged row as one block, else in BLOCK_R blocks."""
        axis = self._stage_axis(node)
        if axis is not None:
            scope.names[node] = self._staged_reduce(node, axis, scope)
        else:
            self._block_reduce(node, scope)

    def _stage_axis(self, node: Reduce) -> tuple[sympy.Symbol, int] | None:
        """``node``'s one axis when its body reads a staged row along it."""
        if len(node.axes) != 1 or not self.stage_blocks:
            return None
        (s, _), = node.axes
        reads = any(isinstance(n, Load) and n.buffer in self.stage_blocks and n.offset == s
                    for n in walk(node.body))
        return node.axes[0] if reads else None

    def _stage_block(self, st: Staged, scope: Scope) -> None:
        """A staged row as one block of the program (its tail lanes 0)."""
        n = st.buffer.numel
        j = self.fresh("j")
        scope.add(f"{j} = tl.arange(0, {_next_pow2(n)})")
        scope.add(f"{j}_live = {j} < {n}")
        self.symbol_names[st.row] = j
        self.row_lanes[st.row] = ""  # an earlier staged row read at this one's positions
        self._enter_lanes(str(_next_pow2(n)), f"{j}_live", [(st.row, n)])
        value = self.expr(st.value, Scope(scope.lines, scope.depth, parent=scope))
        self._leave_lanes()
        del self.row_lanes[st.row]
        name = self.fresh("stage")
        scope.add(f"{name} = tl.where({j}_live, {value}, 0.0)")
        self.stage_blocks[st.buffer.name] = name

    def serial_reduce(self, node: Reduce, scope: Scope) -> str:
        """A reduction inside an expression; over a staged row, one block or tile of it."""
        axis = self._stage_axis(node)
        if axis is not None:
            return self._staged_reduce(node, axis, scope)
        return super().serial_reduce(node, scope)

    def _staged_reduce(self, node: Reduce, axis: tuple[sympy.Symbol, int], scope: Scope) -> str:
        """A reduction over a staged row, the whole row at once: at group level a block of the
        row, inside the elements' lanes a [row, lanes] tile (the row down, the elements
        across) reduced along the row (``axis``). Returns the name of its value."""
        s, n = axis
        rows = _next_pow2(n)
        saved = (self.lanes, self.mask, set(self.lane_symbols), dict(self.symbol_names))
        j, live = self.fresh("j"), self.fresh("live")
        if self.lanes is None:
            scope.add(f"{j} = tl.arange(0, {rows})")
            scope.add(f"{live} = {j} < {n}")
            self._enter_lanes(str(rows), live, [(s, n)])
            self.row_lanes[s] = ""
        else:
            if "," in self.lanes:
                raise TypeError("a staged row's reduction inside a 2-D tile")
            scope.add(f"{j} = tl.arange(0, {rows})[:, None]")
            scope.add(f"{live} = tl.where({j} < {n}, {self.mask}[None, :], False)")
            for sym in self.lane_symbols:  # the elements' lanes go across the tile
                self.symbol_names[sym] = f"{self.symbol_names[sym]}[None, :]"
            self._enter_lanes(f"{rows}, {self.lanes}", live,
                              [*((e, self.ranges[e]) for e in saved[2]), (s, n)])
            self.row_lanes[s] = "[:, None]"
        self.symbol_names[s] = j
        value = self.expr(node.body, Scope(scope.lines, scope.depth, parent=scope))
        acc = self.fresh("red")
        scope.add(f"{acc} = " + _FINISH[node.kind].format(
            v=f"tl.where({live}, {value}, {self.reduce_init(node)})"))
        self.lanes, self.mask, self.lane_symbols, self.symbol_names = saved
        del self.row_lanes[s]
        return acc

    def _block_reduce(self, node: Reduce, scope: Scope) -> None:
        """One hoisted reduction: blocks of BLOCK_R lanes, then the cross-lane finish."""
        n = prod(e for _, e in node.axes)
        vacc = self.fresh("vacc")
        self.lanes = "BLOCK_R"
        self.declare_acc(scope, vacc, node)
        inner = self._lane_loop(scope, "BLOCK_R", n, list(node.axes))
        value = self.expr(node.body, inner)
        live = f"tl.where({self.mask}, {value}, {self.reduce_init(node)})"
        inner.add(f"{vacc} = {self.combine(node.kind, node.dtype, vacc, live)}")
        self._leave_lanes()
        acc = self.fresh("red")
        scope.add(f"{acc} = {_FINISH[node.kind].format(v=vacc)}")
        scope.names[node] = acc

    def _stores(self, scope: Scope) -> None:
        offset = self.index(self.kernel.store_offset)
        if "," in str(self.lanes):  # a 2-D tile: the offset may vary along one axis only
            offset = f"{offset} + tl.zeros([{self.lanes}], tl.int32)"
        for buf, st in zip(self.kernel.outputs, self.kernel.stores):
            value = self.expr(st.value, scope)
            if buf.dtype is DType.float16:
                value = f"{value}.to(tl.float16)"
            if self.lanes is None:
                scope.add(f"tl.store({self.params[buf.name]} + ({offset}), {value})")
            else:
                scope.add(f"tl.store({self.params[buf.name]} + ({offset}), {value}, "
                          f"mask={self.mask})")


def _pow2(n: int, name: str) -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"Triton block size '{name}' must be a power of two, got {n}")
    return n


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _py_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)[:40]


def _used_helpers(code: str) -> str:
    """The helper definitions ``code`` calls, with the helpers they call in turn."""
    helpers = _helper_blocks()
    wanted: list[str] = []
    pending = set(re.findall(r"\b(kg_\w+)\b", code))  # called, or passed (tl.reduce)
    while pending:
        name = pending.pop()
        if name in helpers and name not in wanted:
            wanted.append(name)
            pending |= set(re.findall(r"\b(kg_\w+)\b", helpers[name])) - set(wanted)
    return "\n\n".join(helpers[n] for n in sorted(wanted))


def _helper_blocks() -> dict[str, str]:
    text = templates.render("triton", "helpers.py")
    blocks = [b.strip() for b in text.split("\n\n\n") if b.strip()]
    return {re.search(r"def (kg_\w+)\(", b).group(1): b for b in blocks}  # type: ignore[union-attr]


def emit_triton(kernel: LoopKernel, **options: Any) -> tuple[TritonSource, dict[str, Any],
                                                               dict[str, Any]]:
    """The Triton module for ``kernel``, its launch (grid and block sizes) and metadata."""
    allowed = {"block", "block_r", "block_e", "block_m", "block_n", "block_k", "schedule",
               "capabilities", "pack_rows"}
    if unknown := set(options) - allowed:
        raise TypeError(f"unknown Triton emit options {sorted(unknown)}; expected "
                        f"{sorted(allowed)}")
    dot = tuple(options.get(f"block_{d}", 32) for d in "mnk")
    if not staged_as_blocks(kernel):  # a row read other than along a reduction over it
        kernel = unstage(kernel)
    emitter = TritonEmitter(kernel, options.get("block"), options.get("block_r"),
                            options.get("block_e"), options.get("capabilities", CAPABILITIES),
                            dot, options.get("schedule"),  # type: ignore[arg-type]
                            bool(options.get("pack_rows")))
    source = emitter.emit()
    launch: dict[str, Any] = {"grid": list(source.grid), "constexprs": dict(source.constexprs)}
    tunables: dict[str, Any] = dict(source.constexprs)
    extra: dict[str, Any] = {"schedule": emitter.schedule, "tunables": tunables,
                             "function": source.function, "signature": source.signature,
                             "module": source.module_name}
    if emitter.schedule == "dot":
        tunables["pack_rows"] = emitter.pack_rows
    if source.scratch:  # the left operand's panels
        extra["packed_operand_reads"] = operand_buffers(emitter.contraction.left)
    if kernel.staged:  # each staged producer row once per program (staging.py)
        extra.update(staged_rows=[st.buffer.name for st in kernel.staged],
                     producer_redundancy=1.0)
    return source, launch, extra


def staged_block(kernel: LoopKernel) -> int:
    """The block a staged row takes in a program: its longest row padded to a power of two
    (1 without staged rows)."""
    return max((_next_pow2(st.buffer.numel) for st in kernel.staged), default=1)


def staged_as_blocks(kernel: LoopKernel) -> bool:
    """Whether every read of a staged row is along a one-axis reduction over the whole row (its
    axis symbol, the row's extent), so the row can live in one block of the program (a block
    cannot be indexed at run time), and no such reduction computed per element holds another
    (a tile inside a tile); ``staging.py`` stages only such reads."""
    extents = {st.buffer.name: st.buffer.numel for st in kernel.staged}

    def reads_row(node: Expr) -> bool:
        return isinstance(node, Reduce) and node not in kernel.hoisted and any(
            isinstance(n, Load) and n.buffer in extents for n in walk(node.body))

    for root in kernel.roots():
        for node in walk(root):
            if isinstance(node, Reduce) and reads_row(node) and (len(node.axes) != 1 or any(
                    m is not node and reads_row(m) for m in walk(node))):
                return False
            if isinstance(node, Load) and node.buffer in extents and not (
                    node.offset.is_Symbol and kernel.ranges.get(node.offset)
                    == extents[node.buffer]):
                return False
    return True
