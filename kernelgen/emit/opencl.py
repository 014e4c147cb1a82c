"""OpenCL C emitter: the loop IR as one ``__kernel`` with an NDRange launch.

Schedules (``metadata['schedule']``):
- ``elementwise``: one work-item per domain point on a 1-3-D NDRange; the innermost domain axis
  is dimension 0 so neighbouring work-items touch neighbouring elements (PoCL vectorises across
  them), and merged axes keep integer division out of the index (TOOLCHAIN.md §3.4).
- ``group``: one work-group per group point; hoisted reductions are computed cooperatively
  (strided partial results, then a tree in ``__local`` memory), then the same work-items write the
  group's elements: single-kernel softmax, layer-norm-like blocks, reductions over long axes.
- ``item``: one work-item per group point, reducing serially; for short reductions over many
  groups, where SIMD lanes across groups beat a tree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy

import templates

from ..dtypes import DType
from ..errors import UnsupportedError
from ..expr import Call, Const, Expr, Load, Reduce, Select, free_index_symbols
from ..loop_ir import Axis, Buffer, LoopKernel
from ..shapes import prod
from .c_base import CEmitter, Scope

_FLOAT = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "abs": "fabs({0})", "max": "fmax({0}, {1})", "min": "fmin({0}, {1})",
    "pow": "pow({0}, {1})", "fmod": "fmod({0}, {1})", "sign": "sign({0})",
    **{f: f"{f}({{0}})" for f in (
        "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos",
        "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil",
        "rint", "isnan", "isinf")},
    "lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}",
    "eq": "{0} == {1}", "ne": "{0} != {1}",
}
_INT = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "abs": "({0} < 0 ? -{0} : {0})", "max": "max({0}, {1})",
    "min": "min({0}, {1})", "mod": "KG_FLOORMOD({0}, {1})", "sign": "(({0} > 0) - ({0} < 0))",
    "lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}",
    "eq": "{0} == {1}", "ne": "{0} != {1}",
    "and": "{0} && {1}", "or": "{0} || {1}", "xor": "{0} != {1}", "not": "!{0}",
}

_BARRIER = "barrier(CLK_LOCAL_MEM_FENCE);"
STRATEGIES = ("group", "item", "row")
# PoCL runs a work-group as one thread's loop over work-items; groups of 256 vectorise well and
# tiny groups (16) run 2-3x slower (TOOLCHAIN.md §3.4).
DEFAULT_LOCAL = 256
# Measured on PoCL (python -m kernelgen and bench/): 65536 rows of 64 run 1.3x faster with one
# work-item per row; 1024 rows of 4096 run 2.3x faster with one work-group per row.
GROUP_REDUCE_MIN = 512  # reductions at least this long use the cooperative 'group' schedule
GROUP_FEW = 64  # with fewer groups than this, 'item' would leave most SIMD lanes idle


@dataclass(frozen=True)
class Capabilities:
    """What the OpenCL backend offers, as data (shared code never asks which backend it is)."""

    name: str = "opencl"
    dtypes: frozenset[DType] = frozenset(DType)  # f16 as storage via vload_half/vstore_half
    vector_width: int = 8  # float lanes of the explicit vector loops (float8 = one AVX register)
    has_local_memory: bool = True
    max_work_group: int = 4096
    # A CPU device runs a work-group on one core: rows reduce fastest as one work-item with
    # explicit vector loops (measured 2.4 ms vs 13 ms for a 1024x4096 softmax on PoCL).
    simd_within_work_item: bool = True


CAPABILITIES = Capabilities()


@dataclass(frozen=True)
class Launch:
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None


class OpenCLEmitter(CEmitter):
    backend = "opencl"
    scalar_types = {DType.float32: "float", DType.float64: "double", DType.int32: "int",
                    DType.int64: "long", DType.bool: "bool", DType.float16: "float"}
    buffer_types = {DType.float32: "float", DType.float64: "double", DType.int32: "int",
                    DType.int64: "long", DType.bool: "uchar", DType.float16: "half"}
    float_formats = _FLOAT
    int_formats = _INT  # also bool, whose logic ops live here

    def __init__(self, kernel: LoopKernel, local_size: int | None = None,
                 reduce_strategy: str | None = None,
                 capabilities: Capabilities = CAPABILITIES) -> None:
        super().__init__(kernel)
        self.caps = capabilities
        for b in kernel.inputs + kernel.outputs:
            if b.dtype not in capabilities.dtypes:
                raise UnsupportedError(self.backend, f"dtype {b.dtype}", f"buffer '{b.name}' of "
                                       f"kernel '{kernel.name}'")
        self.width = capabilities.vector_width
        self.local = local_size or DEFAULT_LOCAL
        self.strategy = self._strategy(reduce_strategy)

    def _strategy(self, requested: str | None) -> str:
        if not self.kernel.hoisted:
            return "elementwise"
        if requested is not None:
            if requested not in STRATEGIES:
                raise ValueError(f"reduce_strategy must be one of {STRATEGIES}, got {requested!r}")
            if requested == "row" and not self._row_vectorizable():
                raise ValueError("reduce_strategy 'row' needs every hoisted reduction to run over "
                                 "one contiguous float32 axis")
            return requested
        if self.caps.simd_within_work_item and self._row_vectorizable():
            return "row"
        longest = max(_extent(r) for r in self.kernel.hoisted)
        groups = prod(self.kernel.domain[g][1] for g in self.kernel.group)
        few_groups = groups < GROUP_FEW
        return "group" if longest >= GROUP_REDUCE_MIN or few_groups else "item"

    # --- buffers ----------------------------------------------------------------------------

    def params(self) -> str:
        k = self.kernel
        ins = [f"__global const {self.buffer_types[b.dtype]}* restrict {self.arg_names[b.name]}"
               for b in k.inputs]
        outs = [f"__global {self.buffer_types[b.dtype]}* restrict {self.arg_names[b.name]}"
                for b in k.outputs]
        return ",\n        ".join(ins + outs)

    def load_text(self, buf: Buffer, offset: str) -> str:
        if buf.dtype is DType.float16:
            return f"vload_half({offset}, {self.arg_names[buf.name]})"
        return super().load_text(buf, offset)

    def store_text(self, buf: Buffer, offset: str, value: str) -> str:
        if buf.dtype is DType.float16:
            return f"vstore_half_rte({value}, {offset}, {self.arg_names[buf.name]});"
        if buf.dtype is DType.bool:
            value = f"(uchar)({value})"
        return super().store_text(buf, offset, value)

    # --- schedules ----------------------------------------------------------------------------

    def emit(self) -> tuple[str, Launch]:
        k = self.kernel
        needs_double = any(b.dtype is DType.float64 for b in k.inputs + k.outputs)
        head = templates.render("opencl", "preamble.cl", version=_version())
        if needs_double:
            head = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" + head
        body, launch = {"elementwise": self._elementwise, "group": self._group,
                        "item": self._item, "row": self._row}[self.strategy]()
        return head + "\n" + body, launch

    def _stores(self, scope: Scope, guard: str | None = None) -> None:
        offset = self.index(self.kernel.store_offset)
        for buf, st in zip(self.kernel.outputs, self.kernel.stores):
            store = self.store_text(buf, offset, self.expr(st.value, scope))
            scope.add(f"if ({guard}) {store}" if guard else store)

    def _ndrange(self, axes: list[Axis], scope: Scope, clamp: bool = False) -> Launch:
        """Map ``axes`` (outermost first) to NDRange dims: innermost -> 0, next -> 1, rest -> 2.

        Work-items past the end return early, or with ``clamp`` recompute the last point and set
        ``in_range`` to 0 (kernels with barriers must not return early)."""
        if not axes:
            if clamp:
                scope.add("const int in_range = 1;")
            return Launch((1,), (1,))
        dims = [[axes[-1]]] + ([[axes[-2]]] if len(axes) > 1 else [])
        if len(axes) > 2:
            dims.append(list(axes[:-2]))
        sizes = [prod(n for _, n in d) for d in dims]
        local = _local_shape(sizes, self.local)
        global_ = tuple(-(-s // l) * l for s, l in zip(sizes, local))
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
            if global_[dim] != size and not clamp:
                checks.append(f"{name} >= {size}")
        if clamp:
            scope.add(f"const int in_range = !({' || '.join(checks) or '0'});")
        elif checks:
            scope.add(f"if ({' || '.join(checks)}) return;")
        return Launch(global_, local)

    def _elementwise(self) -> tuple[str, Launch]:
        index, body = Scope([], 1), Scope([], 1)
        launch = self._ndrange(list(self.kernel.domain), index)
        body.parent = None
        self._stores(body)
        src = templates.render("opencl", "elementwise.cl", name=self.kernel.name,
                               params=self.params(), index="\n".join(index.lines),
                               body="\n".join(body.lines))
        return src, launch

    def _item(self) -> tuple[str, Launch]:
        k = self.kernel
        index, body = Scope([], 1), Scope([], 1)
        launch = self._ndrange([k.domain[g] for g in k.group], index, clamp=True)
        self.loop_tail = _BARRIER
        for r in k.hoisted:
            self.expr(r, body)
        inner = body
        for e in k.element_axes:
            s, n = k.domain[e]
            name = self.symbol_names[s]
            inner.add(f"for ({self.index_t} {name} = 0; {name} < {n}; ++{name}) {{")
            inner = inner.child()
        self._stores(inner, guard="in_range")
        if k.element_axes:
            inner.add(_BARRIER)
        for depth in reversed(range(len(k.element_axes))):
            body.lines.append("    " * (depth + 1) + "}")
        src = templates.render("opencl", "item_reduce.cl", name=k.name, params=self.params(),
                               index="\n".join(index.lines), body="\n".join(body.lines))
        return src, launch

    def _group(self) -> tuple[str, Launch]:
        k = self.kernel
        local = _pow2_floor(min(self.local, max(_extent(r) for r in k.hoisted)))
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
            self._stores(body, guard="lid == 0")
        else:
            pos = self._uniform_loop(count, local, body)
            inner = body.child()
            self.decompose(pos, elems, inner)
            self._stores(inner, guard=f"{pos}_ok")
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
        pos = self._uniform_loop(_extent(node), local, scope)
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

    # --- 'row': one work-item per group point, explicit vector loops --------------------------

    def _row_vectorizable(self) -> bool:
        k = self.kernel
        return bool(k.hoisted) and all(
            len(r.axes) == 1 and _extent(r) >= 2 * self.width
            and vectorizable(r.body, r.axes[0][0]) for r in k.hoisted)

    def _row(self) -> tuple[str, Launch]:
        k = self.kernel
        index, body = Scope([], 1), Scope([], 1)
        launch = self._ndrange([k.domain[g] for g in k.group], index)
        launch = Launch(launch.global_size, tuple(1 for _ in launch.global_size))
        for r in k.hoisted:
            self._vector_reduce(r, body)
        elems = [k.domain[e] for e in k.element_axes]
        last = k.element_axes[-1] if elems else None
        values = [st.value for st in k.stores]
        if (elems and last == len(k.domain) - 1 and elems[-1][1] >= 2 * self.width and all(
                vectorizable(v, elems[-1][0], hoisted=set(k.hoisted)) for v in values)
                and all(b.dtype is DType.float32 for b in k.outputs)):
            inner = body
            for s, n in elems[:-1]:
                name = self.symbol_names[s]
                inner.add(f"for ({self.index_t} {name} = 0; {name} < {n}; ++{name}) {{")
                inner = inner.child()
            self._vector_stores(elems[-1], inner)
            for depth in reversed(range(len(elems) - 1)):
                body.lines.append("    " * (depth + 1) + "}")
        else:
            inner = body
            for s, n in elems:
                name = self.symbol_names[s]
                inner.add(f"for ({self.index_t} {name} = 0; {name} < {n}; ++{name}) {{")
                inner = inner.child()
            self._stores(inner)
            for depth in reversed(range(len(elems))):
                body.lines.append("    " * (depth + 1) + "}")
        src = templates.render("opencl", "row_reduce.cl", name=k.name, params=self.params(),
                               width=str(self.width), index="\n".join(index.lines),
                               body="\n".join(body.lines))
        return src, launch

    def _vector_reduce(self, node: Reduce, scope: Scope) -> None:
        """``node`` as a vector loop over its axis plus a scalar tail; names the result."""
        (sym, n), w = node.axes[0], self.width
        t, vt = self.ctype(node.dtype), f"{self.ctype(node.dtype)}{w}"
        vacc, acc = self.fresh("vacc"), self.fresh("acc")
        self._hoist_invariants(node.body, sym, scope)
        scope.add(f"{vt} {vacc} = ({vt})({self.reduce_init(node)});")
        base = self.fresh("i")
        scope.add(f"for ({self.index_t} {base} = 0; {base} < {n - n % w}; {base} += {w}) {{")
        inner = scope.child()
        v = _VectorPrinter(self, sym, base, inner).expr(node.body)
        inner.add(f"{vacc} = {self.combine(node.kind, node.dtype, vacc, v)};")
        scope.add("}")
        scope.add(f"{t} {acc} = {self._horizontal(node, vacc, scope)};")
        if n % w:
            self.reduce_loops(node, scope, acc, start=n - n % w)
        scope.names[node] = acc

    def _hoist_invariants(self, root: Expr, sym: sympy.Symbol, scope: Scope) -> None:
        """Emit, before a vector loop over ``sym``, every largest sub-expression of ``root`` that
        does not depend on ``sym`` (the loop then broadcasts the scalar)."""
        if isinstance(root, Const):
            return
        if sym not in free_index_symbols(root) or root in self.kernel.hoisted:
            self.expr(root, scope)
            return
        for child in root.children():
            self._hoist_invariants(child, sym, scope)

    def _horizontal(self, node: Reduce, vacc: str, scope: Scope) -> str:
        """Combine the lanes of a vector accumulator by halving (float8 -> 4 -> 2 -> 1)."""
        parts, width = vacc, self.width
        while width > 1:
            width //= 2
            half = self.fresh("h")
            vt = self.ctype(node.dtype) + (str(width) if width > 1 else "")
            scope.add(f"const {vt} {half} = "
                      f"{self.combine(node.kind, node.dtype, f'{parts}.lo', f'{parts}.hi')};")
            parts = half
        return parts

    def _vector_stores(self, axis: Axis, scope: Scope) -> None:
        sym, n = axis
        w = self.width
        for st in self.kernel.stores:
            self._hoist_invariants(st.value, sym, scope)
        base = self.fresh("i")
        scope.add(f"for ({self.index_t} {base} = 0; {base} < {n - n % w}; {base} += {w}) {{")
        inner = scope.child()
        printer = _VectorPrinter(self, sym, base, inner)
        offset = self.index(self.kernel.store_offset.xreplace({sym: sympy.Symbol(base)}))
        for buf, st in zip(self.kernel.outputs, self.kernel.stores):
            inner.add(f"vstore{w}({printer.expr(st.value)}, 0, {self.arg_names[buf.name]} + "
                      f"{offset});")
        scope.add("}")
        if n % w:
            name = self.symbol_names[sym]
            scope.add(f"for ({self.index_t} {name} = {n - n % w}; {name} < {n}; ++{name}) {{")
            tail = scope.child()
            self._stores(tail)
            scope.add("}")



def _extent(r: Reduce) -> int:
    return prod(n for _, n in r.axes)


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _local_shape(sizes: list[int], target: int) -> tuple[int, ...]:
    """A work-group shape of about ``target`` items, filled from dimension 0 outward."""
    local, budget = [], target
    for s in sizes:
        take = max(1, min(s, budget))
        local.append(take)
        budget = max(1, budget // take)
    return tuple(local)


def vectorizable(root: Expr, sym: sympy.Symbol, hoisted: set[Reduce] | None = None) -> bool:
    """Whether ``root`` can run as float vectors along ``sym``: float32 arithmetic, selects and
    comparisons only; loads contiguous (stride 1) or invariant in ``sym``; index conditions and
    gathered indices free of ``sym``."""
    hoisted = hoisted or set()

    def ok(node: Expr) -> bool:
        if node in hoisted or sym not in free_index_symbols(node):
            return True  # computed once outside the vector loop
        if isinstance(node, Load):
            coeff = sympy.expand(node.offset).coeff(sym)
            rest = sympy.expand(node.offset - coeff * sym)
            return (node.dtype is DType.float32 and coeff == 1 and sym not in rest.free_symbols
                    and sym not in node.guard.free_symbols and not node.data)
        if isinstance(node, (Call, Select)):
            return node.dtype in (DType.float32, DType.bool) and all(ok(c) for c in node.children())
        return False  # Cast, IndexCond on sym, nested reductions: scalar code

    return ok(root)


class _VectorPrinter:
    """Prints an expression as ``float8`` code for positions ``base .. base+7`` of ``sym``.
    Sub-expressions that do not depend on ``sym`` are computed once, as scalars, before the loop
    (in the enclosing scope) and broadcast."""

    def __init__(self, emitter: OpenCLEmitter, sym: sympy.Symbol, base: str, scope: Scope) -> None:
        self.em, self.sym, self.base, self.scope = emitter, sym, base, scope
        self.names: dict[Expr, str] = {}
        self.w = emitter.width

    def vtype(self, dtype: DType) -> str:
        return f"int{self.w}" if dtype is DType.bool else f"float{self.w}"

    def expr(self, node: Expr) -> str:
        if node in self.names:
            return self.names[node]
        if isinstance(node, Const) or self.sym not in free_index_symbols(node) \
                or node in self.em.kernel.hoisted:
            scalar = self.em.expr(node, self.scope)  # named before the loop (_hoist_invariants)
            if node.dtype is DType.bool:
                return f"(({self.vtype(node.dtype)})(-({scalar})))"
            return f"(({self.vtype(node.dtype)})({scalar}))"
        text = self._text(node)
        name = self.em.fresh("v")
        self.scope.add(f"const {self.vtype(node.dtype)} {name} = {text};")
        self.names[node] = name
        return name

    def _text(self, node: Expr) -> str:
        if isinstance(node, Load):
            offset = self.em.index(node.offset.xreplace({self.sym: sympy.Symbol(self.base)}))
            return f"vload{self.w}(0, {self.em.arg_names[node.buffer]} + {offset})"
        if isinstance(node, Call):
            args = [self.expr(a) for a in node.args]
            table = self.em.float_formats if node.args[0].dtype.is_float else self.em.int_formats
            return table[node.fn].format(*args)
        if isinstance(node, Select):
            c, a, b = (self.expr(x) for x in (node.cond, node.if_true, node.if_false))
            return f"select({b}, {a}, {c})"
        raise TypeError(f"cannot vectorise {type(node).__name__}")


def _version() -> str:
    from .. import __version__
    return __version__


def emit_opencl(kernel: LoopKernel, **options: Any) -> tuple[str, Launch, dict[str, Any]]:
    """Source, launch geometry and tunables for ``kernel``."""
    unknown = set(options) - {"local_size", "reduce_strategy", "capabilities"}
    if unknown:
        raise TypeError(f"unknown OpenCL emit options {sorted(unknown)}; expected local_size, "
                        "reduce_strategy, capabilities")
    emitter = OpenCLEmitter(kernel, options.get("local_size"), options.get("reduce_strategy"),
                            options.get("capabilities", CAPABILITIES))
    source, launch = emitter.emit()
    tunables = {"local_size": emitter.local, "reduce_strategy": emitter.strategy,
                "index_type": emitter.index_t}
    return source, launch, {"schedule": emitter.strategy, "tunables": tunables}


__all__ = ["CAPABILITIES", "Capabilities", "Launch", "OpenCLEmitter", "emit_opencl"]
