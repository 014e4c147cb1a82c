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

import templates

from ..dtypes import DType
from ..expr import Reduce
from ..loop_ir import Axis, Buffer, LoopKernel
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

# PoCL runs a work-group as one thread's loop over work-items; groups of 256 vectorise well and
# tiny groups (16) run 2-3x slower (TOOLCHAIN.md §3.4).
DEFAULT_LOCAL = 256
GROUP_REDUCE_MIN = 64  # reductions at least this long use the cooperative 'group' schedule


@dataclass(frozen=True)
class Capabilities:
    """What the OpenCL backend offers, as data (shared code never asks which backend it is)."""

    name: str = "opencl"
    dtypes: frozenset[DType] = frozenset(DType)  # f16 as storage via vload_half/vstore_half
    vector_width: int = 1  # the device vectorises across work-items itself
    has_local_memory: bool = True
    max_work_group: int = 4096


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
                 reduce_strategy: str | None = None) -> None:
        super().__init__(kernel)
        self.local = local_size or DEFAULT_LOCAL
        self.strategy = self._strategy(reduce_strategy)

    def _strategy(self, requested: str | None) -> str:
        if not self.kernel.hoisted:
            return "elementwise"
        if requested is not None:
            if requested not in ("group", "item"):
                raise ValueError(f"reduce_strategy must be 'group' or 'item', got {requested!r}")
            return requested
        longest = max(_extent(r) for r in self.kernel.hoisted)
        return "group" if longest >= GROUP_REDUCE_MIN or not self.kernel.group else "item"

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
                        "item": self._item}[self.strategy]()
        return head + "\n" + body, launch

    def _stores(self, scope: Scope) -> None:
        offset = self.index(self.kernel.store_offset)
        for buf, st in zip(self.kernel.outputs, self.kernel.stores):
            scope.add(self.store_text(buf, offset, self.expr(st.value, scope)))

    def _ndrange(self, axes: list[Axis], scope: Scope) -> Launch:
        """Map ``axes`` (outermost first) to NDRange dims: innermost -> 0, next -> 1, rest -> 2."""
        if not axes:
            return Launch((1,), (1,))
        dims = [[axes[-1]]] + ([[axes[-2]]] if len(axes) > 1 else [])
        if len(axes) > 2:
            dims.append(list(axes[:-2]))
        sizes = [_prod(n for _, n in d) for d in dims]
        local = _local_shape(sizes, self.local)
        global_ = tuple(-(-s // l) * l for s, l in zip(sizes, local))
        checks = []
        for dim, (d, size) in enumerate(zip(dims, sizes)):
            gid = f"({self.index_t})get_global_id({dim})"
            if len(d) == 1:
                name = self.symbol_names.setdefault(d[0][0], str(d[0][0]))
                scope.add(f"const {self.index_t} {name} = {gid};")
            else:
                flat = self.fresh("flat")
                scope.add(f"const {self.index_t} {flat} = {gid};")
                self.decompose(flat, d, scope)
                name = flat
            if global_[dim] != size:
                checks.append(f"{name} >= {size}")
        if checks:
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
        launch = self._ndrange([k.domain[g] for g in k.group], index)
        for r in k.hoisted:
            self.expr(r, body)
        inner = body
        for e in k.element_axes:
            s, n = k.domain[e]
            name = self.symbol_names.setdefault(s, str(s))
            inner.add(f"for ({self.index_t} {name} = 0; {name} < {n}; ++{name}) {{")
            inner = inner.child()
        self._stores(inner)
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
        count = _prod(n for _, n in elems)
        pos = self.fresh("e")
        body.add(f"for ({self.index_t} {pos} = lid; {pos} < {count}; {pos} += {local}) {{")
        inner = body.child()
        self.decompose(pos, elems, inner)
        self._stores(inner)
        body.add("}")
        src = templates.render("opencl", "group_reduce.cl", name=k.name, params=self.params(),
                               local=str(local), index_t=self.index_t, scratch=scratch,
                               index="\n".join(index.lines), body="\n".join(body.lines))
        groups = _prod(n for _, n in group_axes)
        return src, Launch((groups * local,), (local,))

    def _cooperative_reduce(self, node: Reduce, scope: Scope, local: int) -> None:
        t = self.ctype(node.dtype)
        acc = self.fresh("acc")
        scope.add(f"{t} {acc} = {self.reduce_init(node)};")
        pos = self.fresh("p")
        scope.add(f"for ({self.index_t} {pos} = lid; {pos} < {_extent(node)}; {pos} += {local}) {{")
        inner = scope.child()
        self.decompose(pos, list(node.axes), inner)
        value = self.expr(node.body, inner)
        inner.add(f"{acc} = {self.combine(node.kind, node.dtype, acc, value)};")
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


def _extent(r: Reduce) -> int:
    return _prod(n for _, n in r.axes)


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


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


def _version() -> str:
    from .. import __version__
    return __version__


def emit_opencl(kernel: LoopKernel, **options: Any) -> tuple[str, Launch, dict[str, Any]]:
    """Source, launch geometry and tunables for ``kernel``."""
    emitter = OpenCLEmitter(kernel, options.get("local_size"), options.get("reduce_strategy"))
    source, launch = emitter.emit()
    tunables = {"local_size": emitter.local, "reduce_strategy": emitter.strategy,
                "index_type": emitter.index_t}
    return source, launch, {"schedule": emitter.strategy, "tunables": tunables}


__all__ = ["CAPABILITIES", "Capabilities", "Launch", "OpenCLEmitter", "emit_opencl"]
