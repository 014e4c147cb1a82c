"""The NEON printer: a schedule (``schedule.py``) printed as one C function with ARM NEON
intrinsics. It decides nothing: every choice is a field of the ``NeonSchedule`` it is given.
The innermost contiguous axis runs as ``float32x4_t`` loops with scalar tails; reductions use
``vaddvq_f32``/``kg_vmaxvq_f32`` for the horizontal step; OpenMP runs the parallel axes."""
from __future__ import annotations

import hashlib

from ...dtypes import DType
from ...ir.loop import Buffer
from ...lower import unroll
from ...shapes import prod
from .. import templates
from ..base import Capabilities
from ..c.contraction import ContractionEmitter
from ..printer import Scope
from . import transposed
from .language import BUFFER_TYPES, FLOAT, INT, SCALAR_TYPES, VECTOR, NeonSource, c_name, helpers
from .schedule import NeonSchedule

PARALLEL_FOR = "#pragma omp parallel for schedule(static)"


def render(schedule: NeonSchedule, caps: Capabilities) -> NeonSource:
    """``schedule.loop`` as NEON C, as ``schedule`` says."""
    return NeonPrinter(schedule, caps).emit()


class NeonPrinter(ContractionEmitter):
    backend = "neon"
    scalar_types = SCALAR_TYPES
    buffer_types = BUFFER_TYPES
    float_formats = FLOAT
    int_formats = INT
    vector = VECTOR
    long_t = "int64_t"
    input_qualifier, output_qualifier = "const ", ""
    ix_max = "(({a}) > ({b}) ? ({a}) : ({b}))"
    ix_min = "(({a}) < ({b}) ? ({a}) : ({b}))"

    guarded_element_vectors = True

    def __init__(self, schedule: NeonSchedule, caps: Capabilities) -> None:
        super().__init__(schedule.loop, caps)
        self.sched = schedule
        self.contraction = schedule.contraction
        # a staged kernel's 'row' schedule: several group points (queries) per iteration
        self.group_plan = unroll.split_group(self.kernel, schedule.group_rows or 1)
        self.row_vectors = schedule.row_vectors or 1
        k = self.kernel
        roles = [("in", b) for b in k.inputs] + [("out", b) for b in k.outputs]
        counts = {"in": 0, "out": 0}
        for role, b in roles:
            self.arg_names[b.name] = f"{role}{counts[role]}"
            counts[role] += 1

    def combine(self, kind: str, dtype: DType, a: str, b: str) -> str:
        if kind in ("max", "min"):  # NaN-propagating float or integer ternary, by dtype
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
        c, sched = self.contraction, self.sched
        assert c is not None and sched.tile is not None
        tm, tn = sched.tile
        pragma = PARALLEL_FOR if sched.threads else "// one thread: too small to split"
        depth = 5 if sched.pack else 4
        holes = self.contraction_holes(tm, tn, depth=depth, b_row=depth, k_group=sched.k_group,
                                       vector_epilogue=True)
        if sched.pack:
            k_extent = prod(n for _, n in c.reduce.axes)
            tiles_r, block = int(holes["tiles_r"]), sched.row_block
            holes.update(row_block=str(block), row_blocks=str(-(-tiles_r // block)),
                         k_group=str(sched.k_group), block_panels=str(sched.pack_panels),
                         block_kib=str(-(-4 * tn * k_extent * sched.pack_panels // 1024)))
        template = "contraction_packed.c" if sched.pack else "contraction.c"
        return templates.render("neon", template, name="KG_FN", params=self.params(),
                                pragma=pragma, tn_vec=str(tn // 4), **holes)

    def emit(self) -> NeonSource:
        k = self.kernel
        if self.sched.kind == "tiled":
            return self._finish(self._tiled())
        body = Scope([], 1)
        if self.sched.transposed is not None:  # transposed tiles: their own loops
            transposed.print_kernel(self, self.sched.transposed,
                                    PARALLEL_FOR if self.sched.threads else None, body)
            return self._finish(templates.render("neon", "function.c", name="KG_FN",
                                                 params=self.params(),
                                                 body="\n".join(body.lines)))
        parallel = self.group_axes()
        threads = self.sched.threads
        pragma = PARALLEL_FOR
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
            chunk = self.sched.chunk
            chunks = -(-n // chunk)
            body.add(pragma)
            c = self.fresh("c")
            inner = self.open_loop(body, c, "0", self.int_literal(chunks))
            start, stop = self.fresh("start"), self.fresh("stop")
            self.declare_index(inner, start, f"{c} * {chunk}")
            self.declare_index(inner, stop, f"{start} + {chunk} < {n} ? {start} + {chunk} : {n}")
            self.group_body(inner, vectorize=True, element_range=(start, stop))
            self.close_loop(body)
        else:
            self.group_body(body, vectorize=True)
        code = templates.render("neon", "function.c", name="KG_FN", params=self.params(),
                                body="\n".join(body.lines))
        return self._finish(code)

    def _finish(self, code: str) -> NeonSource:
        """Name the function by a hash of its code, document its parameters, pick helpers."""
        k = self.kernel
        # the name as a literal (repr): a newline in it would end the comment
        doc = "\n".join(f"//   {self.arg_names[b.name]}: {role} {b.name!r} {b.dtype}{list(b.shape)}"
                        for role, bufs in (("input", k.inputs), ("output", k.outputs))
                        for b in bufs)
        digest = hashlib.sha256(code.encode()).hexdigest()[:12]
        name = f"kg_{c_name(k.name)}_{digest}"
        function = f"// {k.name}\n{doc}\n" + code.replace("KG_FN", name)
        used = {h: body for h, body in helpers().items() if h in code}
        return NeonSource.of(name, used, function)
