"""The lowering passes from a fused block to the loop IR:

    flatten -> merge_reductions -> hoist -> stage_producers, stage_shared_terms (``staging.py``)
    -> merge_axes -> split_groups
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import sympy

from ..fusion import FusedBlock
from ..ir.expr import Expr, IndexCond, Load, Read, Reduce, free_index_symbols, transform, walk
from ..ir.loop import Axis, Buffer, LoopKernel, Store
from ..ir.substitute import specialise
from ..ir.node import Constant
from ..mapping_types import FloorDiv, fresh_reduce_symbol, out_symbols, simplify_index
from ..mapping_types.index_map import simplify_guard
from ..shapes import row_major_strides

# --- pass 1: Read -> Load at flat offsets ------------------------------------------------------

def flatten(fused: FusedBlock, name: str) -> LoopKernel:
    """Replace each Read by a Load of the input buffer at its flat row-major offset."""
    inputs = tuple(Buffer(v.name, v.shape, v.dtype) for v in fused.inputs)
    outputs = tuple(Buffer(o.name, o.shape, o.dtype) for o in fused.outputs)
    ranges = dict(fused.ranges)
    shape = fused.shape
    # size-1 output axes are index 0 everywhere; they do not become loops
    sub = {s: sympy.Integer(0) for s, n in zip(out_symbols(len(shape)), shape) if n == 1}
    domain = tuple((s, n) for s, n in zip(out_symbols(len(shape)), shape) if n > 1)

    def rewrite(node: Expr, recurse: Any) -> Expr | None:
        if isinstance(node, Read):
            buf = inputs[node.slot]
            strides = row_major_strides(buf.shape)
            offset = sum((e.xreplace(sub) * st for e, st in zip(node.exprs, strides)),
                         sympy.Integer(0))
            data = tuple((s, n, recurse(v)) for s, n, v in node.data)
            return Load(node.dtype, buf.name, simplify_index(sympy.expand(offset), ranges),
                        simplify_guard(node.guard.xreplace(sub), ranges), data)
        if isinstance(node, IndexCond):
            data = tuple((s, n, recurse(v)) for s, n, v in node.data)
            return IndexCond(node.dtype, simplify_guard(node.cond.xreplace(sub), ranges), data)
        return None

    stores = tuple(Store(o.name, transform(o.body, rewrite)) for o in fused.outputs)
    constants = frozenset(v.name for v in fused.inputs if isinstance(v, Constant))
    return LoopKernel(name, inputs, outputs, domain, stores, ranges=ranges, constants=constants)


# --- two axes as one (passes 2 and 4) ---------------------------------------------------------

def _index_exprs(roots: Iterable[Expr]) -> Iterable[tuple[sympy.Basic, bool]]:
    """(expression, is_offset) for every index expression under ``roots``."""
    for root in roots:
        for node in walk(root):
            if isinstance(node, Load):
                yield node.offset, True
                yield node.guard, False
            elif isinstance(node, IndexCond):
                yield node.cond, False


def _linear(expr: sympy.Expr, a: sympy.Symbol, b: sympy.Symbol) -> tuple[Any, Any] | None:
    """Coefficients of ``a`` and ``b`` if they occur only in linear terms, else None."""
    ca = cb = sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(expr)):
        if not term.has(a) and not term.has(b):
            continue
        coeff, factor = term.as_coeff_Mul()
        if factor == a:
            ca += coeff
        elif factor == b:
            cb += coeff
        else:
            return None
    return ca, cb


def _mergeable(roots: Iterable[Expr], a: Axis, b: Axis) -> bool:
    """Whether ``a`` then ``b`` can be one axis under ``roots``: every load offset is linear in
    both, ``a``'s stride ``b``'s extent times ``b``'s, and no guard or condition tests them."""
    for expr, is_offset in _index_exprs(roots):
        if not (expr.has(a[0]) or expr.has(b[0])):
            continue
        coeffs = _linear(expr, a[0], b[0]) if is_offset else None
        if coeffs is None or coeffs[0] != b[1] * coeffs[1]:
            return False
    return True


def _substitute_merge(a: Axis, b: Axis, q: sympy.Symbol) -> Callable:
    def fix(expr: sympy.Expr) -> sympy.Expr:
        coeffs = _linear(expr, a[0], b[0])
        if coeffs is None or coeffs == (0, 0):
            return expr
        return sympy.expand(expr - coeffs[0] * a[0] - coeffs[1] * b[0] + coeffs[1] * q)

    def rewrite(node: Expr, recurse: Any) -> Expr | None:
        if isinstance(node, Load):
            data = tuple((s, n, recurse(v)) for s, n, v in node.data)
            return Load(node.dtype, node.buffer, fix(node.offset), node.guard, data)
        if isinstance(node, Reduce):
            return Reduce(node.dtype, node.kind, recurse(node.body), node.axes)
        return None

    return rewrite


# --- pass 2: merge a reduction's contiguous axes -----------------------------------------------

MERGE_REDUCTIONS = True  # bench/global_pools.py switches it off to time the kernels before


def merge_reductions(kernel: LoopKernel) -> LoopKernel:
    """Merge adjacent axes of each reduction wherever every load under it reads them as one
    contiguous run (a global pool's H and W; C, KH and KW of a GEMM over a patch matrix): one
    loop, which the 'row' schedule reads as vectors and whose index needs no division. The
    merged symbol is named after the pair, so equal copies of a reduction stay equal."""
    if not MERGE_REDUCTIONS:
        return kernel
    ranges = dict(kernel.ranges)

    def rewrite(node: Expr, recurse: Any) -> Expr | None:
        if not isinstance(node, Reduce):
            return None
        body, axes = recurse(node.body), list(node.axes)
        k = 0
        while k < len(axes) - 1:
            a, b = axes[k], axes[k + 1]
            if not _mergeable([body], a, b):
                k += 1
                continue
            q = sympy.Symbol(f"{a[0].name}_{b[0].name}", integer=True, nonnegative=True)
            body = transform(body, _substitute_merge(a, b, q))
            axes[k:k + 2] = [(q, a[1] * b[1])]
            ranges[q] = a[1] * b[1]
        if axes == list(node.axes):
            return None
        return Reduce(node.dtype, node.kind, body, tuple(axes))

    stores = tuple(Store(st.buffer, transform(st.value, rewrite)) for st in kernel.stores)
    return replace(kernel, stores=stores, ranges=ranges)


# --- pass 3: hoist reductions that depend only on the group axes -----------------------------

def hoist(kernel: LoopKernel) -> LoopKernel:
    """Find reductions whose free symbols are all domain axes; they key the group axes."""
    domain_syms = {s for s, _ in kernel.domain}
    hoisted: list[Reduce] = []
    for st in kernel.stores:
        for node in walk(st.value):  # children first: inner reductions come before outer ones
            if isinstance(node, Reduce) and free_index_symbols(node) <= domain_syms \
                    and node not in hoisted:
                hoisted.append(node)
    keyed = set().union(*(free_index_symbols(r) for r in hoisted)) if hoisted else set()
    group = tuple(k for k, (s, _) in enumerate(kernel.domain) if s in keyed)
    return replace(kernel, hoisted=tuple(hoisted), group=group)


# --- pass 4: merge contiguous axes -------------------------------------------------------------

def merge_axes(kernel: LoopKernel) -> LoopKernel:
    """Merge adjacent domain axes of the same kind (group/element) wherever every load offset is
    linear in both with matching strides, so kernels index with fewer divisions (PoCL stops
    vectorising at the first integer division)."""
    k = 0
    while k < len(kernel.domain) - 1:
        a, b = kernel.domain[k], kernel.domain[k + 1]
        if (k in kernel.group) == (k + 1 in kernel.group) and \
                _visited_together(kernel.group, k) and _mergeable(kernel.roots(), a, b):
            kernel = _merge_pair(kernel, k)
            k = 0
        else:
            k += 1
    return kernel


def _visited_together(group: tuple[int, ...], k: int) -> bool:
    """Whether domain axes ``k`` and ``k + 1``, if both are group axes, follow each other in
    the group's order too (a staged kernel may list its queries last, ``staging.py``)."""
    return k not in group or k + 1 not in group or group.index(k) + 1 == group.index(k + 1)


def _merge_pair(kernel: LoopKernel, k: int) -> LoopKernel:
    """Replace domain axes ``k`` and ``k+1`` by one axis of their combined extent."""
    a, b = kernel.domain[k], kernel.domain[k + 1]
    q = fresh_reduce_symbol("m")
    rewrite = _substitute_merge(a, b, q)
    stores = tuple(Store(st.buffer, transform(st.value, rewrite)) for st in kernel.stores)
    # rewriting is deterministic, so each hoisted reduction equals its copy inside the stores
    hoisted = tuple(transform(r, rewrite) for r in kernel.hoisted)
    staged = tuple(replace(st, value=transform(st.value, rewrite)) for st in kernel.staged)
    domain = kernel.domain[:k] + ((q, a[1] * b[1]),) + kernel.domain[k + 2:]
    group = tuple(dict.fromkeys(g if g <= k else g - 1 for g in kernel.group))
    return replace(kernel, domain=domain, stores=stores, hoisted=hoisted,  # type: ignore[arg-type]
                   staged=staged, group=group, ranges={**kernel.ranges, q: a[1] * b[1]})


# --- pass 5: split a domain axis that reads its groups ---------------------------------------

SPLIT_GROUPS = True  # bench/grouped_convs.py switches it off to time the kernels before
# The fewest channels a group must have to be split: rows enough for a register tile. Fewer
# (a depthwise conv's channel multiplier) stay one axis, which OpenCL's 'window' schedule takes.
SPLIT_MIN_CHANNELS = 8
# The same for a sum over a window as well as the channels (a grouped 3x3 or 5x5 conv). Few
# channels a group, the 'window' schedule runs it unsplit faster than tiles of a group's rows
# (32 groups of 8 channels, 3x3 at 28x28: 1.17 against 1.63 ms split; 2 groups of 20, 5x5 at
# 11x11: 0.34 against 0.49); AlexNet's 2 groups of 128 to 192 channels (3x3 and 5x5, whose
# taps overflow the window's straight-line code: one-row tiles unsplit) ran 2.9-3.0x faster
# split, 25.1 against 74.1 ms for its 5x5 (bench/grouped_convs.py --windows, PoCL on the
# Zen 1 VM, 2026-12-06).
SPLIT_WINDOW_MIN_CHANNELS = 32


def split_groups(kernel: LoopKernel) -> LoopKernel:
    """Split each domain axis ``o`` that the hoisted reductions index through ``o // q`` alone
    somewhere (a grouped conv's input channels: ``x[(o // 68) * 68 + c]``) and through ``o``
    itself elsewhere (its weights) into ``(o // q, o % q)``: the group becomes an axis both
    operands of the sum depend on and the channel within it one only the weights do, so a
    contraction template tiles the channels of a group as rows. Unsplit, every output channel
    was an axis of both operands: tiles of one row, each input load used by one FMA
    (ShuffleNet's grouped 1x1 convs, bench/grouped_convs.py). The output's offsets stay the
    same: the two axes are row-major in place of the one."""
    if not SPLIT_GROUPS or not kernel.hoisted:
        return kernel
    windowed = any(sum(n > 1 for _, n in r.axes) > 1 for r in kernel.hoisted)
    least = SPLIT_WINDOW_MIN_CHANNELS if windowed else SPLIT_MIN_CHANNELS
    k = 0
    while k < len(kernel.domain):
        q = _group_size(kernel, k, least)
        kernel = _split_axis(kernel, k, q) if q is not None else kernel
        k += 1 if q is None else 2
    return kernel


def _group_size(kernel: LoopKernel, k: int, least: int) -> int | None:
    """The one ``q`` with which the hoisted reductions divide domain axis ``k`` (and use it
    undivided too), if it splits the axis into groups of ``least`` or more; else None."""
    s, n = kernel.domain[k]
    divisors: set[int] = set()
    plain = False
    for expr, _ in _index_exprs(kernel.hoisted):
        divs = [d for d in expr.atoms(FloorDiv) if d.args[0] == s]
        divisors.update(int(d.args[1]) for d in divs)
        plain = plain or s in expr.xreplace({d: sympy.S.Zero for d in divs}).free_symbols
    if len(divisors) != 1 or not plain:
        return None
    q = divisors.pop()
    return q if least <= q < n and n % q == 0 else None


def _split_axis(kernel: LoopKernel, k: int, q: int) -> LoopKernel:
    """Domain axis ``k`` as ``(o // q, o % q)``, its uses rewritten and simplified."""
    s, n = kernel.domain[k]
    outer, inner = fresh_reduce_symbol("g"), fresh_reduce_symbol("m")
    ranges = {**kernel.ranges, outer: n // q, inner: q}
    values = {s: q * outer + inner}

    def split(root: Expr) -> Expr:
        return specialise(root, values, ranges)
    stores = tuple(Store(st.buffer, split(st.value)) for st in kernel.stores)
    # specialising is deterministic, so each hoisted reduction equals its copy in the stores
    hoisted = tuple(split(r) for r in kernel.hoisted)
    staged = tuple(replace(st, value=split(st.value)) for st in kernel.staged)
    domain = kernel.domain[:k] + ((outer, n // q), (inner, q)) + kernel.domain[k + 1:]
    group = tuple(sorted({p for g in kernel.group
                          for p in ((g, g + 1) if g == k else (g if g < k else g + 1,))}))
    return replace(kernel, domain=domain, stores=stores, hoisted=hoisted,  # type: ignore[arg-type]
                   staged=staged, group=group, ranges=ranges)
