"""Interleaved vector stores for an elementwise kernel whose output's contiguous axis walks
``f`` interleaved copies of its inputs' contiguous one (Winograd's output transform writes two
outputs of each tile, nearest-neighbour upsampling two of each input, depth-to-space one of
each of ``f`` planes): split by ``f`` (``lower/unroll.py``), every copy's loads are contiguous
along the axis's outer part, so a work-item computes each copy as a vector of ``width``
consecutive outer points and interleaves the ``f`` vectors in registers into ``f`` contiguous
vector stores. PoCL's own lanes, one point a work-item, read and write such kernels at
stride ``f``. When it applies (``plan``; ``choose`` with the ``interleave`` option, for
``schedule.choose``) and how it is printed (``print_kernel``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy

from ...dtypes import DType
from ...ir.fingerprint import by_structure
from ...ir.loop import LoopKernel
from ...lower import unroll
from ..base import Capabilities
from ..c.emitter import CEmitter
from ..c.vector import VectorPrinter
from ..c.vectorizable import split_guard, vectorizable
from ..printer import Scope
from .language import Launch, vector_syntax

# Measured on PoCL (Xeon, AVX-512) for Winograd F(2x2)'s output transform of 192 channels at
# 55x55 with bias and ReLU, hand-written beside the generated 4x4-output unroll, round-robin
# in one process: 0.34 ms with a float16 of tiles a work-item against 1.03. Generated, whole
# conv + ReLU programs against the same without this plan (60 rounds): 64->192 @55 (float16)
# 1.24x, 128->128 @27 (float8) 1.06x, @13 (float4, 7 tiles) 1.04-1.08x, but 512->512 @7 (4
# tiles, one float4 a row) 0.89x: a vector must leave tiles over (``plan``).
#
# Interleaved copies along the contiguous axis. Not 1 (plain vectors where the loads are
# stride 2: Winograd's input transform): whole F(2x2) programs 1.02-1.07x at 27x27 and 55x55
# but 0.93-0.94x at 13x13 (three convs, round-robin in one process).
FACTORS = (2, 3, 4)
MIN_WIDTH = 4  # narrower vectors leave the kernel to PoCL's lanes
# Chunks a work-group. Generated kernels, groups of 4/8/16/32/64, round-robin in one process
# (ms): the 64->192 @55 output transform 0.514/0.475/0.486/0.475/0.477, 128->128 @27
# 0.111/0.120/0.107/0.110/0.113, resize+concat 128x28 0.264/0.243/0.242/0.235/0.235,
# depth-to-space 256x28 0.087/0.079/0.075/0.074/0.069: 8 and more within 10 %.
LOCAL = 16


@dataclass(frozen=True)
class Interleaved:
    """``factors``: the unroll plan (the last axis split by its interleave factor, the others
    as ``unroll.plan`` shares their loads); ``width``: the lanes of each copy's vector."""

    factors: tuple[int, ...]
    width: int

    @property
    def factor(self) -> int:
        return self.factors[-1]


def choose(loop: LoopKernel, caps: Capabilities, asked: bool | None, unroll_given: Any,
           tile_given: Any) -> Interleaved | None:
    """The plan the options ask for: ``interleave=None``, ``plan`` wherever no ``unroll`` or
    ``tile`` is given; ``True``, ``plan``, which must apply (with a given ``unroll`` its own
    factors: a saved schedule's tunables); ``False``, none."""
    if asked is False or (asked is None and (unroll_given is not None or tile_given is not None)):
        return None
    woven = plan(loop, caps)
    if asked and woven is None:
        raise ValueError(f"kernel '{loop.name}': interleave needs, on a CPU, float32 outputs "
                         f"whose rows interleave copies of the inputs' rows, each copy a vector "
                         f"along the row's outer part; this kernel has none")
    if asked and woven is not None and tile_given is not None:
        raise ValueError(f"kernel '{loop.name}': interleave and a transposed tile are two ways "
                         f"to cover several points; give one")
    if asked and woven is not None and unroll_given is not None and \
            tuple(unroll_given) != woven.factors:
        raise ValueError(f"kernel '{loop.name}': interleaved stores split the axes by "
                         f"{woven.factors}, got unroll {tuple(unroll_given)}")
    return woven


@by_structure(maxsize=1024)
def plan(loop: LoopKernel, caps: Capabilities) -> Interleaved | None:
    """The interleaved plan of an elementwise ``loop`` on a CPU (a work-item is a SIMD thread):
    float32 outputs stored contiguously along the last axis, some load not contiguous along it
    (else PoCL's lanes read it whole), and a factor of ``FACTORS`` after which every copy's
    value has a vector form along the axis's outer part, whose stores are the copies in turn,
    in the widest vectors shorter than that part. None where nothing qualifies."""
    if loop.grouped or not caps.simd_within_work_item or not loop.domain or \
            not all(b.dtype is DType.float32 for b in loop.outputs):
        return None
    last, n = loop.domain[-1]
    if sympy.expand(loop.store_offset).coeff(last) != 1 or all(
            vectorizable(st.value, last, vector_syntax(4), guarded=True) for st in loop.stores):
        return None
    shared = unroll.plan(loop)[:-1]
    for f in FACTORS:
        outer = -(-n // f)
        width = next((w for w in caps.vector_widths if MIN_WIDTH <= w < outer), 0)
        factors = (*shared, f)
        if width and _interleaves(loop, factors, width):
            return Interleaved(factors, width)
    return None


def _interleaves(loop: LoopKernel, factors: tuple[int, ...], width: int) -> bool:
    """Whether, split by ``factors``, copy ``d`` along the last axis stores at ``f * q + d``
    (``q`` its outer part) and every copy's value is a vector along ``q``; not where the
    split is invalid (a copy past the axis's end would read past a buffer)."""
    try:
        split = unroll.split(loop, factors)
    except ValueError:
        return False
    last = loop.domain[-1][0]
    q, f = split.outer_of[last], factors[-1]
    syntax = vector_syntax(width, stride2=True)
    for copy in split.copies:
        offset = sympy.expand(split.offset(loop.store_offset, copy))
        at = copy[last] - f * q  # this copy's place in the interleave
        if offset.coeff(q) != f or not at.is_Integer:
            return False
        if not all(vectorizable(split.value(st.value, copy), q, syntax, guarded=True)
                   for st in loop.stores):
            return False
    return True


def print_kernel(em: CEmitter, inter: Interleaved, split: Callable[..., unroll.Unrolled],
                 ndrange: Callable[..., Launch], index: Scope, body: Scope) -> Launch:
    """Work-items over the parallel axes but the last one's outer part, and chunks of
    ``width`` of its points (the last chunk shifted back to stay whole); per group of copies
    that differ only along the last axis, their vectors interleaved into ``f`` vector stores,
    or lane by lane from the chunk's own first point where the chunk is shifted or passes the
    axis's end. ``split`` and ``ndrange`` are the printer's."""
    k, t = em.kernel, em.index_t
    w, f = inter.width, inter.factor
    last, n = k.domain[-1]
    plan = split(inter.factors)
    q = plan.outer_of[last]
    outer = -(-n // f)
    chunk = sympy.Symbol("kg_chunk")
    em.symbol_names[chunk] = "kg_chunk"
    parallel = [axis for axis in plan.parallel if axis[0] != q]
    launch = ndrange([*parallel, (chunk, -(-outer // w))], index, explicit_vectors=True)
    index.add(f"const {t} kg_own = kg_chunk * {w};  // the chunk's first point")
    index.add(f"const {t} kg_q0 = min(kg_own, ({t}){outer - w});  // whole: the last shifts back")
    base = sympy.Symbol("kg_q0")
    em.ranges[base] = outer - w + 1
    syntax = vector_syntax(w, stride2=True)
    rows: dict[tuple[tuple[sympy.Symbol, sympy.Expr], ...], list[int]] = {}
    for i, copy in enumerate(plan.copies):  # copies alike but along the last axis, in order
        rows.setdefault(tuple((s, e) for s, e in copy.items() if s != last), []).append(i)
    # whole vector stores: the chunk is its own (not shifted) and ends inside the axis
    whole = "kg_q0 == kg_own" + ("" if n % f == 0 else f" && {f} * (kg_q0 + {w}) <= {n}")
    shared = VectorPrinter(em, q, "kg_q0", body, syntax)  # rows read each vector once
    for members in rows.values():
        members.sort(key=lambda i: sympy.Integer(plan.copies[i][last] - f * q))
        first = plan.copies[members[0]]
        uniform = split_guard(plan.guards[members[0]], q)
        assert uniform is not None, "a copy's guard is linear in the split axis"
        scope = body
        if uniform[0] is not sympy.true:
            body.add(f"if ({em.index(uniform[0])}) {{")
            scope = body.child()
        printer = shared
        if scope is not body:  # inside a row's guard: the body's vectors, and its own
            printer = VectorPrinter(em, q, "kg_q0", scope, syntax)
            printer.names.update(shared.names)
        start = em.index(plan.offset(k.store_offset, first).xreplace({q: base}))
        for buf, st in zip(k.outputs, k.stores):
            vectors = [_named(em, scope, syntax.vtype, printer.expr(
                plan.value(st.value, plan.copies[i]))) for i in members]
            runs = [syntax.compose.format(", ".join(
                syntax.lane.format(v=vectors[m % f], j=m // f) for m in range(j * w, j * w + w)))
                for j in range(f)]
            ptr = em.arg_names[buf.name]
            scope.add(f"if ({whole}) {{")
            inner = scope.child()
            for j, run in enumerate(runs):
                inner.add(syntax.store.format(v=run, ptr=ptr, off=f"{start} + {j * w}"
                                              if j else start))
            scope.add("} else {  // lane by lane: from the chunk's own first point, inside")
            lanes = scope.child()
            lanes.add(f"float kg_run[{f * w}];")
            for j, run in enumerate(runs):
                lanes.add(syntax.store.format(v=run, ptr="kg_run", off=str(j * w)))
            lanes.add(f"for (int kg_j = 0; kg_j < {f * w}; ++kg_j)")
            lanes.child().add(f"if (kg_q0 + kg_j / {f} >= kg_own && {f} * kg_q0 + kg_j < {n}) "
                              f"{ptr}[{start} + kg_j] = kg_run[kg_j];")
            scope.add("}")
        if uniform[0] is not sympy.true:
            body.add("}")
    return launch


def _named(em: CEmitter, scope: Scope, vtype: str, text: str) -> str:
    """``text`` as a name whose lanes can be taken (a broadcast is an expression)."""
    if text.isidentifier():
        return text
    name = em.fresh("v")
    scope.add(f"const {vtype} {name} = {text};")
    return name
