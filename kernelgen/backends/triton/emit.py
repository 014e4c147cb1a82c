"""The Triton printer: a schedule (``schedule.py``) printed as a ``@triton.jit`` kernel in a
generated module with its launch (grid and block sizes). It decides nothing: every choice is a
field of the ``TritonSchedule`` it is given."""
from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import sympy

from ...dtypes import DType
from ...ir.expr import Axis, Call, Cast, Expr, Load, Reduce, free_index_symbols, walk
from ...ir.loop import Staged
from ...lower.staging import hoist_order
from ...shapes import prod
from ...version import __version__
from .. import templates
from ..base import Capabilities
from ..printer import Emitter, Scope, recomputed_inside
from .language import (FINISH, FLOAT, INT, ROUNDED, SIGNATURE, TL, TritonSource, module_name,
                       py_name, used_helpers)
from .schedule import TritonSchedule, next_pow2


def render(schedule: TritonSchedule, caps: Capabilities) -> TritonSource:
    """``schedule.loop`` as a Triton module, as ``schedule`` says."""
    return TritonPrinter(schedule, caps).emit()


class TritonPrinter(Emitter):
    backend = "triton"
    comment = "#"
    ix_div = "{a} // {b}"
    ix_mod = "{a} % {b}"
    ix_floordiv = "kg_floordiv({a}, {b})"
    ix_floormod = "kg_floormod({a}, {b})"
    ix_max = "tl.maximum({a}, {b})"
    ix_min = "tl.minimum({a}, {b})"
    ix_not = "({a} == 0)"
    ix_true, ix_false = "True", "False"

    def __init__(self, schedule: TritonSchedule, caps: Capabilities) -> None:
        super().__init__(schedule.loop, caps)
        self.sched = schedule
        self.contraction = schedule.contraction
        self.scratch = 0  # float32 elements of the packed panels (pack)
        self.lanes: str | None = None   # the lane shape of the current vector context
        self.mask: str | None = None    # which lanes are live there
        self.lane_symbols: set[sympy.Symbol] = set()  # index symbols that vary across lanes
        # staged rows: buffer -> the block holding it; row symbols bound to a block's lanes ->
        # how a staged block lines up with the current lanes ('' 1-D, '[:, None]' in a tile)
        self.stage_blocks: dict[str, str] = {}
        self.row_lanes: dict[sympy.Symbol, str] = {}
        k = self.kernel
        self.arg_names = {b.name: f"{role}{i}" for role, bufs in (("in", k.inputs),
                                                                  ("out", k.outputs))
                          for i, b in enumerate(bufs)}

    @property
    def index_t(self) -> str:
        return "tl.int64" if self.wide else "tl.int32"

    def program_id(self, axis: int) -> str:
        """The program's index along ``axis``, widened where offsets need 64 bits."""
        return f"tl.program_id({axis})" + (".to(tl.int64)" if self.wide else "")

    def positions(self, start: str, block: str) -> str:
        """``block`` consecutive positions from ``start``, in the index type: a position times
        a stride (a contraction operand's row) may pass 2**31 where a buffer does."""
        lanes = f"tl.arange(0, {block})" + (".to(tl.int64)" if self.wide else "")
        return f"{start} + {lanes}"

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
        if dtype is DType.float64 and float(np.float32(v)) != v:
            # a Python float constant compiles as float32 (the interpreter keeps it float64):
            # clip(x, 0.1, 0.7) stored 0.10000000149 into a float64 output on an H200
            return f"tl.full([], {v!r}, tl.float64)"
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
        # a data symbol that only the guard reads (a gather's bounds test) makes the mask a
        # block, not the pointer: a scalar pointer under a block mask must be broadcast
        offset_varies = bool((node.offset.free_symbols - data) & self.lane_symbols) or any(
            free_index_symbols(v) & self.lane_symbols for s, _, v in node.data
            if s in node.offset.free_symbols)
        # a block mask needs a block of pointers; 2-D tiles may vary along one axis only
        if varies and (not offset_varies or "," in str(self.lanes)):
            offset = f"{offset} + tl.zeros([{self.lanes}], {self.index_t})"
        pointer = f"{self.arg_names[node.buffer]} + ({offset})"
        masks = [m for m in (self.mask if varies else None, guard) if m]
        if masks:
            text = f"tl.load({pointer}, mask={self.index_and(masks)}, other=0)"
        else:
            text = f"tl.load({pointer})"
        buf = self.buffers[node.buffer]
        return f"{text}.to(tl.float32)" if buf.dtype is DType.float16 else text

    def call_text(self, node: Call, args: list[str]) -> str:
        dtype = node.args[0].dtype
        if dtype.compute is DType.float32 and node.fn in ROUNDED:
            return ROUNDED[node.fn].format(*args)
        return (FLOAT if dtype.is_float else INT)[node.fn].format(*args)

    def select_text(self, cond: str, a: str, b: str) -> str:
        return f"tl.where({cond}, {a}, {b})"

    def cast_text(self, node: Cast, value: str) -> str:
        if node.dtype is DType.bool:
            return f"({value} != 0)"
        return f"{value}.to({TL[node.dtype.compute]})"

    def open_loop(self, scope: Scope, var: str, start: str, stop: str) -> Scope:
        scope.add(f"for {var} in range({start}, {stop}):")
        return scope.child()

    def int_limit(self, dtype: DType, largest: bool) -> str:
        bits = 63 if dtype is DType.int64 else 31
        return str(2**bits - 1) if largest else str(-(2**bits))

    def combine(self, kind: str, dtype: DType, a: str, b: str) -> str:
        return {"sum": "({a} + {b})", "prod": "({a} * {b})", "max": "kg_max({a}, {b})",
                "min": "kg_min({a}, {b})"}[kind].format(a=a, b=b)

    def declare_acc(self, scope: Scope, name: str, node: Reduce) -> None:
        shape = f"[{self.lanes}]" if self.lanes else "[]"
        scope.add(f"{name} = tl.full({shape}, {self.reduce_init(node)}, "
                  f"{TL[node.dtype.compute]})")

    # --- schedules -------------------------------------------------------------------------------

    def emit(self) -> TritonSource:
        k = self.kernel
        body = Scope([], 1)
        constexprs, grid = {"tiled": self._dot, "row": self._row,
                            "elementwise": self._elementwise}[self.sched.kind](body)
        text = "\n".join(body.lines)
        params = [self.arg_names[b.name] for b in k.inputs + k.outputs]
        params += ["scratch"] if self.scratch else []
        params += [f"{c}: tl.constexpr" for c in constexprs]
        joined = ", ".join(params)
        if len(joined) > 60:
            joined = ",\n        ".join(params)
        function_code = templates.render("triton", "kernel.py", name="KG_FN", params=joined,
                                         body=text)
        digest = hashlib.sha256(function_code.encode()).hexdigest()[:12]
        function = f"kg_{py_name(k.name)}_{digest}"
        # the name as a literal (repr): a newline in it would end the comment
        doc = "\n".join(f"#   {self.arg_names[b.name]}: {role} {b.name!r} {b.dtype}{list(b.shape)}"
                        for role, bufs in (("input", k.inputs), ("output", k.outputs))
                        for b in bufs)
        if self.scratch:
            doc += f"\n#   scratch: float32[{self.scratch}], the packed panels"
        helpers = used_helpers(function_code)
        helpers = f"{helpers}\n\n" if helpers else ""
        module = templates.render("triton", "module.py", version=__version__, helpers=helpers,
                                  doc=doc, kernel=function_code.replace("KG_FN", function))
        signature = {self.arg_names[b.name]: SIGNATURE[b.dtype] for b in k.inputs + k.outputs}
        if self.scratch:
            signature["scratch"] = SIGNATURE[DType.float32]
        launch: dict[str, Any] = {"grid": list(grid), "constexprs": dict(constexprs)}
        if self.scratch:
            launch.update(args="the inputs, the outputs, then the scratch buffer",
                          scratch_bytes=4 * self.scratch)
        facts = {"function": function, "signature": signature,
                 "module": module_name(module)}
        return TritonSource(module, launch, facts, function, signature, constexprs, grid,
                            self.scratch)

    def _elementwise(self, body: Scope) -> tuple[dict[str, int], tuple[int, ...]]:
        k = self.kernel
        n = k.numel
        if k.domain:
            body.add(f"offs = {self.program_id(0)} * BLOCK + tl.arange(0, BLOCK)")
            body.add(f"live = offs < {n}")
            self._enter_lanes("BLOCK", "live", list(k.domain))
            self.decompose("offs", list(k.domain), body)
        self._stores(body)
        block = self.sched.block
        assert block is not None
        return {"BLOCK": block}, (-(-n // block),)

    def _row(self, body: Scope) -> tuple[dict[str, int], tuple[int, ...]]:
        k = self.kernel
        group = [k.domain[g] for g in k.group]
        if group:
            self.decompose(self.program_id(0), group, body)
        order = hoist_order(k.staged, k.hoisted)
        for pos, st in enumerate(k.staged):  # each after the hoisted reductions it reads
            for r in order[pos]:
                self._row_reduce(r, body)
            self._stage_block(st, body)
        for r in order[-1]:
            self._row_reduce(r, body)
        elems = [k.domain[e] for e in k.element_axes]
        count = prod(n for _, n in elems)
        if not elems:  # a plain reduction: one value per program
            self._stores(body)
        else:
            inner = self._lane_loop(body, "BLOCK_E", count, elems)
            self._stores(inner)
            self._leave_lanes()
        blocks = {"BLOCK_R": self.sched.block_r, "BLOCK_E": self.sched.block_e}
        return blocks, (prod(n for _, n in group),)  # type: ignore[return-value]

    def _dot(self, body: Scope) -> tuple[dict[str, int], tuple[int, ...]]:
        """A contraction as tiles of tl.dot: operand tiles are the fused operand expressions
        evaluated on [BLOCK_M, BLOCK_K] and [BLOCK_K, BLOCK_N] index grids (prologues included),
        the epilogue runs on the accumulator tile. Batch axes (both operands depend on them)
        are grid dimension 2, scalars inside the program.

        ``pack``: each program owns a block of rows for every column. It first gathers
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
            self.decompose(self.program_id(2), batch, body)
        n_rows, n_cols = prod(n for _, n in rows), prod(n for _, n in cols)
        n_k = prod(n for _, n in c.reduce.axes)
        assert self.sched.tile is not None
        bm, bn, bk = self.sched.tile
        grid: tuple[int, ...] = (-(-n_rows // bm), 1 if self.sched.pack else -(-n_cols // bn))
        grid += (prod(n for _, n in batch),) if batch else ()
        body.add(f"rm = {self.positions(f'{self.program_id(0)} * BLOCK_M', 'BLOCK_M')}")
        sweep = body
        if self.sched.pack:
            k_pad = -(-n_k // bk) * bk  # whole BLOCK_K steps: the panel's loads need no mask
            self.scratch = prod(grid) * bm * k_pad
            program = self.program_id(0)
            if batch:
                program = f"(tl.program_id(2) * {grid[0]} + {program})"
            body.add(f"panel = scratch + {program} * {bm * k_pad}  # [{k_pad}][BLOCK_M]")
            body.add("slots = tl.arange(0, BLOCK_K)[None, :] * BLOCK_M + "
                     "tl.arange(0, BLOCK_M)[:, None]")
            body.add(f"for k0 in range(0, {n_k}, BLOCK_K):")
            pack = body.child()
            pack.add(f"rk = {self.positions('k0', 'BLOCK_K')}")
            self._operand_tile(pack, "a", "rm[:, None]", "rk[None, :]", n_rows, rows, n_k,
                               c.left, "BLOCK_M, BLOCK_K")
            pack.add("tl.store(panel + k0 * BLOCK_M + slots, a_tile)")
            self._leave_lanes()
            body.add("tl.debug_barrier()  # the program's panel stores before its loads")
            body.add(f"for n0 in range(0, {n_cols}, BLOCK_N):")
            sweep = body.child()
            sweep.add(f"rn = {self.positions('n0', 'BLOCK_N')}")
        else:
            body.add(f"rn = {self.positions(f'{self.program_id(1)} * BLOCK_N', 'BLOCK_N')}")
        sweep.add("acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)")
        sweep.add(f"for k0 in range(0, {n_k}, BLOCK_K):")
        loop = sweep.child()
        loop.add(f"rk = {self.positions('k0', 'BLOCK_K')}")
        if self.sched.pack:
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
        return blocks, grid

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
        inner.add(f"{pos} = {self.positions(base, block)}")
        inner.add(f"{pos}_live = {pos} < {count}")
        self._enter_lanes(block, f"{pos}_live", axes)
        domain = {s for s, _ in self.kernel.domain}
        for s, _ in axes:  # Triton rejects a name bound to an integer and later to a block:
            if s not in domain:  # two reductions over one pooling window's symbol
                self.symbol_names[s] = self.fresh("r")
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
        elif recomputed_inside(node, self.kernel.hoisted):
            self.expr(node, scope)  # in the order of its copies inside the other reductions
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
        scope.add(f"{j} = tl.arange(0, {next_pow2(n)})")
        scope.add(f"{j}_live = {j} < {n}")
        self.symbol_names[st.row] = j
        self.row_lanes[st.row] = ""  # an earlier staged row read at this one's positions
        self._enter_lanes(str(next_pow2(n)), f"{j}_live", [(st.row, n)])
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
        rows = next_pow2(n)
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
        scope.add(f"{acc} = " + FINISH[node.kind].format(
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
        scope.add(f"{acc} = {FINISH[node.kind].format(v=vacc)}")
        scope.names[node] = acc

    def _stores(self, scope: Scope) -> None:
        offset = self.index(self.kernel.store_offset)
        if "," in str(self.lanes):  # a 2-D tile: the offset may vary along one axis only
            offset = f"{offset} + tl.zeros([{self.lanes}], {self.index_t})"
        for buf, st in zip(self.kernel.outputs, self.kernel.stores):
            value = self.expr(st.value, scope)
            if buf.dtype is DType.float16:
                value = f"{value}.to(tl.float16)"
            if self.lanes is None:
                scope.add(f"tl.store({self.arg_names[buf.name]} + ({offset}), {value})")
            else:
                scope.add(f"tl.store({self.arg_names[buf.name]} + ({offset}), {value}, "
                          f"mask={self.mask})")
