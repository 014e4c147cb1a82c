"""Staging a fused producer's row: AGO's no-redundancy rule for the attention pattern.

In ``MatMul -> Softmax -> MatMul`` fused into one kernel, every output element ``(i, j)`` is a sum
over keys ``r`` of ``softmax(S)[i, r] * V[r, j]``, and the softmax's max and sum read ``S[i, r]``
too. Inlined naively, each output column recomputes the whole score row ``S[i, :]`` (a reduction
itself) three times. Its only keys are the row ``i`` and the key ``r``, so this pass computes the
row once per ``i`` into a scratch array (``LoopKernel.staged``) and makes every use a load of it:
each producer element is computed once, the consumer's tile (one query row, every output column)
covering the producer's (one score row).

A row operator over the scores themselves, softmax(Q Kᵀ) written out (a model that outputs
its attention weights), is staged the same way: the score row once per query, read by the max,
the sum and every output element (``_stage_row_producer``), instead of each element
recomputing its row's scores for the max and again for the sum.

The same scratch row serves a costly term that a row's hoisted reduction and its stores both
compute: a softmax sums exp(x - max) and scales it by 1 / sum, so the exp row is staged once and
both read it (``stage_shared_terms``; OpenCL 'row' on PoCL, 1024x4096: 2.6 against 4.1 ms).
In attention the softmax's weights ``E / sum(E)`` are then no row of their own: P V sums the
exps times V and divides each output by the sum once (``_normalise_after_sums``).

    stage_producers, stage_shared_terms: run after ``hoist``; ``unstage`` undoes them (the
    interpreter's semantics, and a schedule that cannot hold a row).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import sympy

from ..dtypes import DType
from ..ir.expr import (Call, Const, Expr, IndexCond, Load, Reduce, free_index_symbols, rebuild,
                       transform, walk)
from ..ir.loop import Buffer, LoopKernel, Staged, Store, inline_staged
from ..ir.substitute import specialise
from .contraction import contraction
from .passes import hoist

# The scratch row lives per group point (a work-item's private array, a thread's stack): rows
# longer than this stay recomputed rather than risk the stack.
STAGE_MAX = 4096
SHARE_WITH_ROWS = True  # bench/attention_exp.py switches it off to time the kernels before
NORMALISE_AFTER_SUMS = True  # False: P V reads a row of weights (the form before)
STAGE_ROW_PRODUCERS = True  # bench/score_rows.py switches it off to time the kernel before


def _canonical(node: Expr, names: dict[sympy.Symbol, sympy.Symbol], prefix: str) -> Expr:
    """``node`` with ``names`` applied to its index symbols and its own bound symbols renamed in
    the order they are bound: equal for two copies of one producer inlined with fresh reduction
    symbols (the softmax's max, its sum and the MatMul each inline the score). Bound symbols
    are named ``prefix`` and a number."""
    def bound(k: int) -> sympy.Symbol:
        return sympy.Symbol(f"{prefix}_{k}", integer=True, nonnegative=True)

    if isinstance(node, Reduce):
        inner = dict(names)
        axes = []
        for s, n in node.axes:
            inner[s] = bound(len(inner))
            axes.append((inner[s], n))
        return Reduce(node.dtype, node.kind, _canonical(node.body, inner, prefix), tuple(axes))
    if isinstance(node, Load):
        inner = dict(names)
        data = []
        for s, n, v in node.data:
            value = _canonical(v, names, prefix)
            inner[s] = bound(len(inner))
            data.append((inner[s], n, value))
        return Load(node.dtype, node.buffer, node.offset.xreplace(inner),
                    node.guard.xreplace(inner), tuple(data))
    if isinstance(node, IndexCond):
        inner = dict(names)
        data = []
        for s, n, v in node.data:
            value = _canonical(v, names, prefix)
            inner[s] = bound(len(inner))
            data.append((inner[s], n, value))
        return IndexCond(node.dtype, node.cond.xreplace(inner), tuple(data))
    return rebuild(node, [_canonical(c, names, prefix) for c in node.children()])


def _candidate(kernel: LoopKernel, stage: sympy.Symbol) -> tuple[Expr, int, frozenset] | None:
    """The first producer worth staging: a float32 reduction inside a one-axis reduction ``R``
    of the stores keyed by every domain axis (a per-element sum, such as attention's P V) that
    depends on ``R``'s axis and on some but fewer domain axes (so ``R``'s points recompute it).
    Returns its canonical form (``R``'s axis renamed ``stage``), the row's extent and the
    domain symbols it keys on.

    Why only per-element ``R``: staging makes the kernel's group the producer's keys, and the
    reductions keyed by more than those then run per element. For a per-element ``R`` that
    costs nothing (its group was the whole domain); for one keyed by fewer axes (softmax of a
    softmax over another axis) it would recompute ``R`` for every element of its row. A
    producer keyed by no axis would be recomputed per element all the same."""
    domain = {s for s, _ in kernel.domain}
    outers = [node for st in kernel.stores for node in walk(st.value)
              if isinstance(node, Reduce) and free_index_symbols(node) == domain]
    for outer in outers:
        if len(outer.axes) != 1 or outer.axes[0][1] > STAGE_MAX:
            continue
        (row, extent), = outer.axes
        for node in walk(outer.body):
            if not isinstance(node, Reduce) or node.dtype is not DType.float32:
                continue
            free = free_index_symbols(node)
            keys = free & domain
            if row in free and free <= domain | {row} and keys and keys < domain:
                return _canonical(node, {row: stage}, stage.name), extent, frozenset(keys)
    return None


def _replace_uses(root: Expr, key: Expr, stage: Staged, extent: int) -> Expr:
    """``root`` with every copy of the staged producer, inside a one-axis reduction of the
    row's extent and indexed by its axis, replaced by a load of the staged row."""
    def visit(node: Expr, recurse: object) -> Expr | None:
        if not (isinstance(node, Reduce) and len(node.axes) == 1
                and node.axes[0][1] == extent):
            return None
        (row, _), = node.axes

        def use(inner: Expr, _recurse: object) -> Expr | None:
            if isinstance(inner, Reduce) and row in free_index_symbols(inner) \
                    and _canonical(inner, {row: stage.row}, stage.row.name) == key:
                return Load(inner.dtype, stage.buffer.name, row)
            return None

        body = transform(node.body, use)
        return Reduce(node.dtype, node.kind, recurse(body), node.axes)  # type: ignore[operator]

    return transform(root, visit)


def stage_producers(kernel: LoopKernel) -> LoopKernel:
    """Stage each producer row that a per-element reduction would recompute (module docstring).
    A contraction is left to the tiled templates, which already compute a fused producer once
    per tile; after staging, only reductions keyed by the staged rows' own axes stay hoisted
    (the softmax's max and sum), and the consumer's sum runs per element over the row."""
    if kernel.staged or contraction(kernel) is not None:
        return kernel
    row_kernel = _stage_row_producer(kernel) if STAGE_ROW_PRODUCERS else None
    if row_kernel is not None:
        return _queries_innermost(row_kernel)
    staged: list[Staged] = []
    keys: frozenset = frozenset()
    while True:
        row = sympy.Symbol(f"_row{len(staged)}", integer=True, nonnegative=True)
        found = _candidate(kernel, row)
        if found is None:
            break
        key, extent, own_keys = found
        stage = Staged(Buffer(_scratch_name(kernel, len(staged)), (extent,), DType.float32),
                       row, key)
        stores = tuple(Store(st.buffer, _replace_uses(st.value, key, stage, extent))
                       for st in kernel.stores)
        if stores == kernel.stores:  # no use matched its canonical form: leave it inlined
            break
        staged.append(stage)
        keys |= own_keys
        kernel = _rehoist(replace(kernel, stores=stores), keys, staged)
    return _queries_innermost(_stage_weights(kernel, keys, staged)) if staged else kernel


QUERIES_INNERMOST = True  # False: the group axes in the domain's order, as before


def _queries_innermost(kernel: LoopKernel) -> LoopKernel:
    """The group axes listed (``LoopKernel.group``: the order work-items and a work-item's
    group points visit them) so that those the fewest reads depend on come last: the queries,
    which only Q's reads key, after the heads, which K's and V's reads key too. A work-item's
    consecutive group points (``group_rows``) are then queries of one head, which share its
    keys (one panel), even where the output's order puts the heads inside the queries
    (attention written back as (sequence, heads, depth)). The domain keeps the output's
    order."""
    if not QUERIES_INNERMOST or len(kernel.group) < 2:
        return kernel
    reads = [free_index_symbols(n) for root in kernel.roots() for n in walk(root)
             if isinstance(n, Load)]
    group = tuple(sorted(kernel.group, key=lambda g: -sum(
        kernel.domain[g][0] in r for r in reads)))
    return replace(kernel, group=group)


def _stage_row_producer(kernel: LoopKernel) -> LoopKernel | None:
    """A row operator over a fused producer row: softmax(Q K^T) written out, whose max and
    sum over the keys read the score ``S[i, r]`` (a reduction over the head's features) at
    their axis and whose every output element reads ``S[i, e]`` at its own. ``S`` staged
    once per group point (every domain axis but the row's), the row's reductions and the
    stores load it, and the costly term the sum and the stores share (the exp) is staged
    after it (``stage_shared_terms``): a 'row' kernel, not each element recomputing the
    whole score row twice; a copy at a fixed point (a LayerNorm's shift) loads it there.
    None where no producer is shared so (or a reduction keyed by the element would remain).
    The producer is a plain sum of products (``_plain_sum``)."""
    symbols = frozenset(s for s, _ in kernel.domain)
    nodes = [n for st in kernel.stores for n in walk(st.value)]
    for element, extent in kernel.domain:
        keys = symbols - {element}
        if extent > STAGE_MAX or not keys or not any(
                isinstance(n, Reduce) and len(n.axes) == 1 and n.axes[0][1] == extent
                and free_index_symbols(n) <= keys for n in nodes):
            continue
        for producer in nodes:
            if not (isinstance(producer, Reduce) and _plain_sum(producer)
                    and free_index_symbols(producer) == symbols):
                continue
            row = sympy.Symbol("_row0", integer=True, nonnegative=True)
            stage = Staged(Buffer(_scratch_name(kernel, 0), (extent,), DType.float32), row,
                           _canonical(producer, {element: row}, row.name))
            at_element = Load(DType.float32, stage.buffer.name, element)
            uses = {producer: at_element, **_at_points(
                nodes, producer, element, extent, {**kernel.ranges, **dict(kernel.domain)},
                stage)}
            stores = tuple(Store(st.buffer, _replace_uses(
                _replaced(st.value, uses), stage.value, stage, extent)) for st in kernel.stores)
            left = [n for st in stores for n in walk(st.value)
                    if isinstance(n, Reduce) and not free_index_symbols(n) <= keys]
            if left or stores == kernel.stores or not any(
                    isinstance(n, Load) and n.buffer == stage.buffer.name
                    and n != at_element
                    for st in stores for n in walk(st.value)):
                continue
            return _stage_shared_term(_rehoist(replace(kernel, stores=stores), keys, [stage]))
    return None


def _at_points(nodes: Sequence[Expr], producer: Reduce, element: sympy.Symbol, extent: int,
               ranges: Mapping[sympy.Symbol, int], stage: Staged) -> dict[Expr, Expr]:
    """Copies of ``producer`` at a fixed point of its row among ``nodes`` (a LayerNorm's shift,
    the row's first element), each mapped to a load of the staged row there."""
    target, out = _canonical(producer, {}, "_pt"), dict[Expr, Expr]()
    for node in {n for n in nodes if isinstance(n, Reduce) and _plain_sum(n)
                 and element not in free_index_symbols(n)}:
        copy = _canonical(node, {}, "_pt")
        moving = next(((p, q) for p, q in zip(walk(target), walk(copy)) if isinstance(p, Load)
                       and isinstance(q, Load) and element in p.offset.free_symbols), None)
        point = sympy.solve(moving[0].offset - moving[1].offset, element) if moving else []
        if len(point) == 1 and point[0].is_Integer and 0 <= point[0] < extent and \
                _canonical(specialise(producer, {element: point[0]}, ranges), {}, "_pt") == copy:
            out[node] = Load(DType.float32, stage.buffer.name, point[0])
    return out


def _plain_sum(node: Reduce) -> bool:
    """Whether ``node`` is a float32 sum of products of tensors read directly, unguarded (the
    scores Q Kᵀ): the producers ``_stage_row_producer`` stages, whose row it can vouch for."""
    inside = list(walk(node.body))
    return node.kind == "sum" and node.dtype is DType.float32 and \
        not any(isinstance(n, (Reduce, IndexCond)) for n in inside) and \
        all(n.guard is sympy.true and not n.data for n in inside if isinstance(n, Load))


def _replaced(root: Expr, uses: Mapping[Expr, Expr]) -> Expr:
    """``root`` with every copy of a key of ``uses`` replaced by its value."""
    return transform(root, lambda n, _recurse: uses.get(n))


def _stage_weights(kernel: LoopKernel, keys: frozenset, staged: list[Staged]) -> LoopKernel:
    """Inside each per-element one-axis reduction, stage the largest computed terms that only
    the row and its axis key (the softmax's ``exp(s - max) * (1 / sum)``): computed once per row
    point, not once per output column."""
    def visit(node: Expr, recurse: object) -> Expr | None:
        if not isinstance(node, Reduce) or len(node.axes) != 1 \
                or free_index_symbols(node) <= keys:
            return None
        (axis, extent), = node.axes

        def term(inner: Expr, _recurse: object) -> Expr | None:
            free = free_index_symbols(inner)
            if inner.dtype is not DType.float32 or axis not in free \
                    or not free <= keys | {axis} or isinstance(inner, (Load, Reduce)):
                return None
            row = sympy.Symbol(f"_row{len(staged)}", integer=True, nonnegative=True)
            value = specialise(inner, {axis: row}, {**kernel.ranges, row: extent})
            stage = Staged(Buffer(_scratch_name(kernel, len(staged)), (extent,), DType.float32),
                           row, value)
            staged.append(stage)
            return Load(inner.dtype, stage.buffer.name, axis)

        return Reduce(node.dtype, node.kind, transform(node.body, term), node.axes)

    stores = tuple(Store(st.buffer, transform(st.value, visit)) for st in kernel.stores)
    shared = _share_with_rows(_rehoist(replace(kernel, stores=stores), keys, staged), keys)
    return _normalise_after_sums(shared, keys)


def _normalise_after_sums(kernel: LoopKernel, keys: frozenset) -> LoopKernel:
    """A staged row of softmax weights, ``W[r] = E[r] / sum(E)`` with ``E`` a staged row
    ``exp(u - max(u))``, that only per-element sums ``sum_r W[r] X[r]`` read, folded into them:
    ``(sum_r E[r] X[r]) / sum(E)``, one multiply an output element instead of a pass over the
    row and a row of its own (attention's P V reads the exps, as the hand-written panel kernel
    of bench/attention_panel.py does). Rounding moves by an ulp or so; nothing else changes,
    since ``E <= 1`` and ``sum(E) >= 1``: the unnormalised sum overflows only where ``|X|``
    comes within the row's length of the float range, and a NaN or infinity in ``E`` or
    ``X`` reaches the output either way. Unbounded weights (no max subtracted) keep their
    row."""
    if not NORMALISE_AFTER_SUMS:
        return kernel
    for w in kernel.staged:
        found = _weights_of(kernel, w)
        stores = _folded_stores(kernel, w, *found) if found is not None else None
        if stores is not None:
            rest = [st for st in kernel.staged if st is not w]
            kernel, rows = _numbered(replace(kernel, stores=stores), rest)
            return _normalise_after_sums(_rehoist(kernel, keys, rows), keys)
    return kernel


def _folded_stores(kernel: LoopKernel, w: Staged, exps: Staged, scale: Expr
                   ) -> tuple[Store, ...] | None:
    """The stores with every ``sum_r W[r] * X[r]`` of the weights row ``w`` made
    ``sum_r E[r] * X[r] * scale``; None where anything else reads ``w`` (a staged row, or
    the stores outside such a sum)."""
    if any(isinstance(n, Load) and n.buffer == w.buffer.name
           for st in kernel.staged for n in walk(st.value)):
        return None
    folds: list[bool] = []  # one entry per read of w: folded or not

    def fold(node: Expr, recurse: object) -> Expr | None:
        if isinstance(node, Load) and node.buffer == w.buffer.name:
            folds.append(False)
            return node
        if not (isinstance(node, Reduce) and node.kind == "sum" and len(node.axes) == 1
                and isinstance(node.body, Call) and node.body.fn == "mul"):
            return None
        (axis, _), = node.axes
        weight = Load(DType.float32, w.buffer.name, axis)
        args = node.body.args
        if weight not in args or any(isinstance(n, Load) and n.buffer == w.buffer.name
                                     for a in args if a != weight for n in walk(a)):
            return None
        folds.append(True)
        body = Call(node.body.dtype, "mul", tuple(
            Load(DType.float32, exps.buffer.name, axis) if a == weight else a for a in args))
        return Call(node.dtype, "mul", (Reduce(node.dtype, "sum", body, node.axes), scale))

    stores = tuple(Store(st.buffer, transform(st.value, fold)) for st in kernel.stores)
    return stores if folds and all(folds) else None


def _weights_of(kernel: LoopKernel, w: Staged) -> tuple[Staged, Expr] | None:
    """For a staged row ``w`` of ``E[row] * (1 / sum(E))`` (or ``E[row] / sum(E)``) where
    ``E`` is a staged row ``exp(u - max(u))`` over the same points: ``E`` and the factor
    ``1 / sum(E)``, else None."""
    value = w.value
    if not isinstance(value, Call) or value.fn not in ("mul", "div") or len(value.args) != 2:
        return None
    rows = {st.buffer.name: st for st in kernel.staged}
    for k, arg in enumerate(value.args):
        if not (isinstance(arg, Load) and arg.buffer in rows and arg.offset == w.row) or \
                (value.fn == "div" and k != 0):
            continue
        exps, other = rows[arg.buffer], value.args[1 - k]
        total = other if value.fn == "div" else (
            other.args[1] if isinstance(other, Call) and other.fn == "div"
            and other.args[0] == Const(DType.float32, 1.0) else None)
        if not (isinstance(total, Reduce) and total.kind == "sum" and len(total.axes) == 1
                and total.body == Load(DType.float32, exps.buffer.name, total.axes[0][0])
                and total.axes[0][1] == exps.buffer.shape[0]
                and _bounded_by_one(exps, kernel.ranges)):
            return None
        scale = Call(DType.float32, "div", (Const(DType.float32, 1.0), total)) \
            if value.fn == "div" else other
        return exps, scale
    return None


def _bounded_by_one(st: Staged, ranges: Mapping[sympy.Symbol, int]) -> bool:
    """Whether the staged row is ``exp(u[row] - max_r u[r])``: at most 1 at every point."""
    e = st.value
    if not (isinstance(e, Call) and e.fn == "exp" and isinstance(e.args[0], Call)
            and e.args[0].fn == "sub"):
        return False
    u, top = e.args[0].args
    if not (isinstance(top, Reduce) and top.kind == "max" and len(top.axes) == 1):
        return False
    (axis, n), = top.axes
    return n == st.buffer.shape[0] and \
        specialise(top.body, {axis: st.row}, {**ranges, st.row: n}) == u


def _share_with_rows(kernel: LoopKernel, keys: frozenset) -> LoopKernel:
    """A costly term that a hoisted one-axis reduction and a staged row both compute (the
    attention's exp(s - max), summed by the softmax's sum and scaled by its reciprocal in the
    weights row) staged once, before that row: the sum and the row load it, so each exp is
    computed once instead of twice. Each such term, until none is left."""
    if not SHARE_WITH_ROWS:
        return kernel
    ranges = {**kernel.ranges, **dict(kernel.domain)}
    for r in kernel.hoisted:
        if len(r.axes) != 1:
            continue
        (axis, extent), = r.axes
        for k, st in enumerate(kernel.staged):
            if st.buffer.shape[0] != extent:
                continue
            in_row = set(walk(st.value))
            for u in reversed(list(walk(r.body))):  # children first: the largest term first
                if not _costly_term(u, axis, keys, kernel.hoisted):
                    continue
                at_row = specialise(u, {axis: st.row}, {**ranges, st.row: extent})
                if at_row in in_row:
                    staged_kernel, rows = _stage_shared(kernel, r, u, k, at_row)
                    return _share_with_rows(_rehoist(staged_kernel, keys, rows), keys)
    return kernel


def _stage_shared(kernel: LoopKernel, r: Reduce, term: Expr, k: int, at_row: Expr
                  ) -> tuple[LoopKernel, list[Staged]]:
    """``term`` of the hoisted ``r`` staged as a row of its own before staged row ``k``, where
    it is ``at_row``: ``r`` and row ``k`` read it (``_share_with_rows``)."""
    shared, summed = _term_row(kernel, len(kernel.staged), r, term)
    old = kernel.staged[k]

    def use(node: Expr, _recurse: object) -> Expr | None:
        if node == r:
            return summed
        return Load(term.dtype, shared.buffer.name, old.row) if node == at_row else None

    staged = [*kernel.staged[:k], shared,
              *(replace(st, value=transform(st.value, use)) for st in kernel.staged[k:])]
    stores = tuple(Store(st.buffer, transform(st.value, use)) for st in kernel.stores)
    return _numbered(replace(kernel, stores=stores), staged)


def _term_row(kernel: LoopKernel, n: int, r: Reduce, term: Expr) -> tuple[Staged, Reduce]:
    """``term`` of the hoisted one-axis reduction ``r`` as a staged row (``stage<n>`` over
    ``_row<n>``), and ``r`` loading it in its place."""
    (axis, extent), = r.axes
    row = sympy.Symbol(f"_row{n}", integer=True, nonnegative=True)
    ranges = {**kernel.ranges, **dict(kernel.domain), row: extent}
    stage = Staged(Buffer(_scratch_name(kernel, n), (extent,), DType.float32), row,
                   specialise(term, {axis: row}, ranges))
    body = _replaced(r.body, {term: Load(term.dtype, stage.buffer.name, axis)})
    return stage, Reduce(r.dtype, r.kind, body, r.axes)


def _numbered(kernel: LoopKernel, staged: list[Staged]) -> tuple[LoopKernel, list[Staged]]:
    """``kernel``'s stores and the rows of ``staged`` with the rows named ``stage<k>`` in the
    order they are computed."""
    names = {st.buffer.name: _scratch_name(kernel, n) for n, st in enumerate(staged)}

    def rename(node: Expr, _recurse: object) -> Expr | None:
        if isinstance(node, Load) and node.buffer in names:
            return replace(node, buffer=names[node.buffer])
        return None

    stores = tuple(Store(st.buffer, transform(st.value, rename)) for st in kernel.stores)
    return replace(kernel, stores=stores), [
        Staged(replace(st.buffer, name=names[st.buffer.name]), st.row,
               transform(st.value, rename)) for st in staged]


def _costly_term(u: Expr, axis: sympy.Symbol, keys: frozenset, hoisted: Sequence[Reduce]
                 ) -> bool:
    """Whether ``u``, inside a hoisted reduction over ``axis``, is a float32 term keyed by the
    group and ``axis`` alone with a costly primitive and no reduction of its own (those
    hoisted are computed before the row)."""
    free = free_index_symbols(u)
    if u.dtype is not DType.float32 or axis not in free or not free <= keys | {axis}:
        return False
    inside = _outside_hoisted(u, hoisted)
    return not any(isinstance(n, Reduce) and n not in hoisted for n in inside) and \
        any(isinstance(n, Call) and n.fn not in CHEAP for n in inside)


def _scratch_name(kernel: LoopKernel, k: int) -> str:
    """``stage<k>``, made unlike every buffer name of the kernel (a tensor may be so named)."""
    taken = {b.name for b in kernel.inputs + kernel.outputs}
    name = f"stage{k}"
    while name in taken:
        name += "_"
    return name


def _rehoist(kernel: LoopKernel, keys: frozenset, staged: list[Staged]) -> LoopKernel:
    """Hoist only the reductions keyed by ``keys`` (computed once per staged row); every
    other reduction runs per element."""
    kernel = replace(kernel, staged=tuple(staged))
    hoisted: list[Reduce] = []
    for root in kernel.roots():
        for node in walk(root):
            if isinstance(node, Reduce) and free_index_symbols(node) <= keys \
                    and node not in hoisted:
                hoisted.append(node)
    group = tuple(k for k, (s, _) in enumerate(kernel.domain) if s in keys)
    ranges = dict(kernel.ranges)
    for st in staged:  # the rows and the staged values' own bound symbols
        ranges[st.row] = st.buffer.shape[0]
        for node in walk(st.value):
            if isinstance(node, Reduce):
                ranges.update(node.axes)
            elif isinstance(node, (Load, IndexCond)):
                ranges.update((s, n) for s, n, _ in node.data)
    return replace(kernel, hoisted=tuple(hoisted), group=group, ranges=ranges)


def hoist_order(staged: Sequence[Staged], hoisted: Sequence[Reduce]) -> list[list[Reduce]]:
    """When a group body computes its hoisted reductions: before each staged row, those its
    value reads that no earlier row took (a softmax's max and sum before the weights row),
    then the rest; ``len(staged) + 1`` lists."""
    pending, order = list(hoisted), []
    for st in staged:
        used = set(walk(st.value))
        order.append([r for r in pending if r in used])
        pending = [r for r in pending if r not in used]
    return [*order, pending]


def unstage(kernel: LoopKernel) -> LoopKernel:
    """The same kernel with every staged load replaced by the producer it stands for
    (``ir.loop.inline_staged``), hoisted again: the form a backend runs when it cannot hold a
    row per group point."""
    if not kernel.staged:
        return kernel
    return hoist(replace(inline_staged(kernel), hoisted=(), group=()))


# primitives cheap enough to compute twice rather than stage: a few instructions each (a
# division too: a LayerNorm's (x - mean) / std is not worth a row of stores and loads)
CHEAP = frozenset({"add", "sub", "mul", "div", "neg", "max", "min", "abs", "lt", "le", "gt",
                   "ge", "eq", "ne", "and", "or", "xor", "not", "sign", "isnan", "isinf",
                   "floor", "ceil", "rint"})


def stage_shared_terms(kernel: LoopKernel) -> LoopKernel:
    """A term that a hoisted one-axis reduction and the stores both compute, over the row's
    axis and the element axis, with a costly primitive in it: the softmax's exp(x - max),
    summed by the hoisted sum and divided by it in the stores. Staged once per group point
    (computed after the reductions it reads), the sum and the stores load it, so each exp is
    computed once instead of twice."""
    return kernel if kernel.staged else _stage_shared_term(kernel)


def _stage_shared_term(kernel: LoopKernel) -> LoopKernel:
    """``stage_shared_terms`` after the rows ``kernel`` already stages (a staged score row
    that the softmax's reductions read: ``_stage_row_producer``)."""
    found = _shared_term(kernel)
    if found is None:
        return kernel
    reduction, term, at_element = found
    stage, summed = _term_row(kernel, len(kernel.staged), reduction, term)
    element = kernel.domain[kernel.element_axes[0]][0]
    at_point = Load(DType.float32, stage.buffer.name, element)

    def use(node: Expr, _recurse: object) -> Expr | None:
        if node == reduction:
            return summed
        return at_point if node == at_element else None

    stores = tuple(Store(st.buffer, transform(st.value, use)) for st in kernel.stores)
    keys = frozenset(kernel.domain[g][0] for g in kernel.group)
    return _rehoist(replace(kernel, stores=stores), keys, [*kernel.staged, stage])


def _outside_hoisted(root: Expr, hoisted: Sequence[Reduce]) -> list[Expr]:
    """The nodes of ``root``, hoisted reductions included but not what is inside them."""
    out, stack, seen = [], [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        out.append(node)
        if node not in hoisted:
            stack.extend(node.children())
    return out


def shared_terms_only(kernel: LoopKernel) -> bool:
    """Whether ``kernel`` stages rows and none computes a reduction of its own (only shared
    terms, ``stage_shared_terms``): unstaging it changes its speed, not what a schedule can
    run, so a backend whose schedule cannot hold a row (a GPU's work-group reduction) unstages
    it."""
    return bool(kernel.staged) and not any(
        isinstance(n, Reduce) and n not in kernel.hoisted
        for st in kernel.staged for n in walk(st.value))


def _shared_term(kernel: LoopKernel) -> tuple[Reduce, Expr, Expr] | None:
    """The first hoisted one-axis reduction over the element axis's extent whose body holds a
    float32 term with a costly primitive, keyed by the group and the reduction's axis (other
    hoisted reductions inside it allowed), that the stores compute at the element axis; with
    the largest such term, and that term at the element axis. None when there is none (or
    the kernel is not a row kernel)."""
    if not kernel.grouped or len(kernel.element_axes) != 1:
        return None
    element, extent = kernel.domain[kernel.element_axes[0]]
    keys = frozenset(kernel.domain[g][0] for g in kernel.group)
    ranges = {**kernel.ranges, **dict(kernel.domain)}
    in_stores = {n for st in kernel.stores for n in walk(st.value)}
    for r in kernel.hoisted:
        if len(r.axes) != 1 or r.axes[0][1] != extent or extent > STAGE_MAX:
            continue
        (axis, _), = r.axes
        for u in reversed(list(walk(r.body))):  # walk lists children first: largest first here
            if not _costly_term(u, axis, keys, kernel.hoisted):
                continue
            at_element = specialise(u, {axis: element}, ranges)
            if at_element in in_stores:
                return r, u, at_element
    return None
