"""``fuse``: turn a block of operators into one fused operator by composing index maps.

Every operator inside the block is inlined into its consumers: a consumer's ``Read`` of a producer
becomes the producer's body with the producer's output symbols replaced by the consumer's read
expressions (``mapping_types.compose`` at the level of whole bodies). Reorganize and Shuffle
operators therefore leave nothing behind but index arithmetic. Reads of values from outside the
block stay ``Read`` leaves, now numbered by the fused operator's own inputs.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import sympy

from ..dtypes import DType
from ..errors import FusionError
from ..ir.expr import DataBindings, Expr, IndexCond, Read, Reduce, const, select, transform, walk
from ..ir.node import _DIRECTNESS, Constant, Op, Value, _reads_with_axes
from ..mapping_types import (Colour, FusionRule, IndexMap, MappingType, compose,
                             fresh_reduce_symbol, fusion_rule, out_symbols, reshape_rule,
                             run_rule, simplify_index)
from ..mapping_types.classify import reads_runs_along_reduction
from ..mapping_types.index_map import simplify_guard

# the words of the refusal of a block that an operator outside it would cut in two (the DNNFusion
# planner tries such a neighbour again once its block has grown)
BETWEEN = "is outside the block but lies between fused operators"


_MAX_NAME = 64


@dataclass(frozen=True)
class EdgeRule:
    """The table's verdict on one producer -> consumer edge inside the block."""

    producer: str
    consumer: str
    rule: FusionRule

    def __str__(self) -> str:
        r = self.rule
        fused = r.fused.value if r.fused else "not fusible"
        why = "" if r.colour is Colour.GREEN else f" ({r.reason})"
        return (f"{self.producer} -> {self.consumer}: {r.first} -> {r.second} = {fused} "
                f"[{r.colour}]{why}")


@dataclass(frozen=True)
class FusedOutput:
    name: str
    shape: tuple[int, ...]
    dtype: DType
    body: Expr  # over Read leaves whose slots index FusedBlock.inputs


class FusedBlock:
    """A block of operators fused into one: its external inputs, its outputs (each with a body
    over those inputs), the fusion rules it was built under, and its composed index maps. Pure
    data: ``kernelgen.lower`` turns it into the loop IR, ``kernelgen.compile`` into kernels, and
    ``kernelgen.FusedOp`` (what ``kernelgen.fuse`` returns) adds ``emit`` on top."""

    def __init__(self, ops: Sequence[Op], inputs: Sequence[Value], outputs: Sequence[FusedOutput],
                 edges: Sequence[EdgeRule], mapping_type: MappingType,
                 ranges: dict[sympy.Symbol, int]) -> None:
        self.ops = tuple(ops)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.edges = tuple(edges)
        self.mapping_type = mapping_type
        self.ranges = ranges  # extents of every reduction and data symbol in the bodies

    @property
    def name(self) -> str:
        """``fused_`` and the operators' kinds; a long block's name is cut short (PoCL aborts
        the process on a kernel name that overflows its cache path)."""
        name = "fused_" + "_".join(op.kind.lower() for op in self.ops)
        if len(name) <= _MAX_NAME:
            return name
        return f"{name[:_MAX_NAME - 12].rsplit('_', 1)[0]}_and_{len(self.ops)}_ops"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.outputs[0].shape

    @property
    def needs_measurement(self) -> bool:
        """True when a yellow edge was fused: the tuner should confirm it pays off."""
        return any(e.rule.colour is Colour.YELLOW for e in self.edges)

    @property
    def forced(self) -> tuple[EdgeRule, ...]:
        return tuple(e for e in self.edges if e.rule.colour is Colour.RED)

    @cached_property
    def index_maps(self) -> dict[tuple[str, str], IndexMap]:
        """(output name, input name) -> the composed map of that input's widest read."""
        maps: dict[tuple[str, str], IndexMap] = {}
        for out in self.outputs:
            for read, axes in _reads_with_axes(out.body):
                src = self.inputs[read.slot]
                m = IndexMap(out.shape, src.shape, read.exprs, axes,
                             tuple((s, n) for s, n, _ in read.data), read.guard)
                key = (out.name, src.name)
                if key not in maps or len(m.reduce) > len(maps[key].reduce):
                    maps[key] = m
        return maps

    def report(self) -> str:
        """One line per fused edge, with its rule, then the fused type."""
        lines = [str(e) for e in self.edges]
        lines.append(f"fused type: {self.mapping_type}"
                     + (" (needs measurement)" if self.needs_measurement else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        outs = ", ".join(f"{o.name}{o.shape}" for o in self.outputs)
        return (f"{type(self).__name__}({self.name}: {len(self.ops)} ops -> {outs}, "
                f"{self.mapping_type})")


def fuse(*ops: Op, outputs: Iterable[Op] | None = None, force: bool = False,
         conservative_oto_into_heavy: bool = False) -> FusedBlock:
    """The operators ``ops`` fused into one block (``kernelgen.fuse`` documents the rules;
    it returns the same block as a ``FusedOp`` that emits itself). The block's inputs, which a
    kernel takes in order, are those of its outputs' expressions read left to right, each
    operator's arguments in order. Distinct tensors must have distinct names (kernel arguments
    are named after them)."""
    block = _check_block(ops)
    edges, block_type = _decide_edges(block, force, conservative_oto_into_heavy)
    consumed = {id(v) for op in block for v in op.inputs}
    wanted = list(outputs or ())
    for extra in wanted:
        if not any(extra is op for op in block):
            name = getattr(extra, "name", extra)
            raise FusionError(f"output '{name}' is not one of the fused operators")
    outs = [op for op in block if id(op) not in consumed or any(op is w for w in wanted)]
    shape = outs[0].shape
    for op in outs[1:]:
        if op.shape != shape:
            raise FusionError(
                f"outputs of one fused kernel must share a shape: '{outs[0].name}' is {shape}, "
                f"'{op.name}' is {op.shape}; fuse them separately")
    inliner = _Inliner(block, shape)
    try:
        bodies = [FusedOutput(op.name, op.shape, op.dtype, inliner.output_body(op))
                  for op in outs]
    except RecursionError:  # inlining recurses once per operator along a chain
        raise FusionError(f"the block's chains of operators are too deep to inline as one "
                          f"kernel ({len(block)} operators); fuse it in shorter pieces") from None
    inputs, bodies = _in_written_order(block, outs, inliner.inputs, bodies)
    _check_names(inputs, outs)
    return FusedBlock(block, inputs, bodies, edges, block_type, inliner.ranges)


def _check_block(ops: Sequence[Op]) -> list[Op]:
    if not ops:
        raise FusionError("fuse() needs at least one operator")
    for op in ops:
        if isinstance(op, (list, tuple)):
            raise FusionError(f"fuse() takes operators as separate arguments, got a "
                              f"{type(op).__name__}; unpack it: fuse(*ops)")
        if isinstance(op, Value) and not isinstance(op, Op):
            raise FusionError(f"fuse() takes operators; '{op.name}' is an input tensor "
                              f"({type(op).__name__}), not an operator")
        if not isinstance(op, Op):
            raise FusionError(f"fuse() takes operators (what kg.add, kg.conv, ... return), got "
                              f"{type(op).__name__} {op!r:.40}")
    unique: list[Op] = []
    for op in ops:
        if not any(op is u for u in unique):
            unique.append(op)
    members = {id(op) for op in unique}
    # Topological order within the block, and convexity: no path leaves the block and re-enters.
    order: list[Op] = []
    state: dict[int, int] = {}

    def visit(op: Op) -> None:
        if state.get(id(op)) == 2:
            return
        state[id(op)] = 1
        for v in op.inputs:
            if id(v) in members:
                visit(v)  # type: ignore[arg-type]
        state[id(op)] = 2
        order.append(op)

    for op in unique:
        visit(op)
    for op in order:
        for v in op.inputs:
            if id(v) not in members and isinstance(v, Op) and _reaches(v, members):
                raise FusionError(
                    f"'{v.name}' ({v.kind}) {BETWEEN} (it feeds '{op.name}' and depends on "
                    f"the block); include it or split the block")
    return order


def _in_written_order(block: list[Op], outs: list[Op], inputs: list[Value],
                      outputs: list[FusedOutput]) -> tuple[list[Value], list[FusedOutput]]:
    """The block's inputs in the order the user wrote them: the outputs' expressions read left
    to right, each operator's arguments in order, a fused producer's inputs where it stands
    (``matmul(a, relu(b)) + bias`` takes a, b, bias; ``gather(data, indices)`` takes data, then
    indices). The inliner meets them in another order (a Gather's indices before its data);
    the bodies' ``Read`` slots are renumbered to match."""
    members = {id(op) for op in block}
    rank: dict[int, int] = {}
    stack: list[Value] = list(reversed(outs))
    while stack:  # depth first, arguments in order (iterative: chains can be long)
        value = stack.pop()
        if id(value) not in members:
            rank.setdefault(id(value), len(rank))
        elif isinstance(value, Op) and id(value) not in rank:
            rank[id(value)] = -1  # a member, expanded once
            stack.extend(reversed(value.inputs))
    order = sorted(range(len(inputs)), key=lambda k: rank.get(id(inputs[k]), len(rank) + k))
    if order == list(range(len(inputs))):
        return inputs, outputs
    slot = {old: new for new, old in enumerate(order)}

    def renumber(node: Expr, recurse: Any) -> Expr | None:
        if isinstance(node, Read):
            data = tuple((s, n, recurse(v)) for s, n, v in node.data)
            return replace(node, slot=slot[node.slot], data=data)
        return None

    bodies = [replace(o, body=transform(o.body, renumber)) for o in outputs]
    return [inputs[k] for k in order], bodies


def _check_names(inputs: list[Value], outputs: list[Op]) -> None:
    """Kernel parameters and metadata name buffers by their tensors' names: two distinct tensors
    with one name would be one parameter (the interpreter read x - x as 0)."""
    seen: dict[str, Value] = {}
    for value in [*inputs, *outputs]:
        first = seen.setdefault(value.name, value)
        if first is value:
            continue
        if isinstance(first, Op):
            kind = value.kind if isinstance(value, Op) else type(value).__name__
            raise FusionError(f"two outputs of one fused block are both named '{value.name}' "
                              f"({first.kind}, {kind}); rename one")
        if isinstance(value, Op):
            raise FusionError(
                f"input tensor '{value.name}' has the name of the block's output '{value.name}' "
                f"({value.kind}); kernel arguments are named after their tensors, so rename the "
                f"input tensor")
        raise FusionError(
            f"two distinct input tensors of one fused block are both named '{value.name}'; "
            f"kernel arguments are named after their tensors, so rename one "
            f"(e.g. kg.tensor('{value.name}_1', ...))")


def _reaches(value: Value, members: set[int], seen: set[int] | None = None) -> bool:
    seen = set() if seen is None else seen
    if id(value) in seen or not isinstance(value, Op):
        return False
    seen.add(id(value))
    return any(id(v) in members or _reaches(v, members, seen) for v in value.inputs)


def _decide_edges(block: list[Op], force: bool, conservative: bool
                  ) -> tuple[list[EdgeRule], MappingType]:
    """Apply the fusion table along every edge, with each producer's accumulated block type."""
    acc: dict[int, MappingType] = {}
    free: dict[int, bool] = {}  # a Reorganize accumulated from free reshapes only
    edges: list[EdgeRule] = []
    members = {id(op) for op in block}
    for op in block:
        fused_types = []  # the table's fused type along each in-block edge into op
        for slot, v in enumerate(op.inputs):
            if id(v) not in members:
                continue
            first, second = acc[id(v)], op.input_mapping_types[slot]
            rule = reshape_rule(first, second, free_first=free[id(v)],
                                free_second=op.free_reshapes[slot]) or \
                run_rule(first, second, keeps_runs=op.kept_runs[slot],
                         reads_runs=_reads_runs(v, op, slot, members)) or \
                fusion_rule(first, second, conservative_oto_into_heavy=conservative)
            if rule.colour is Colour.RED and not force:
                kind = getattr(v, "kind", "")
                raise FusionError(f"refusing to fuse '{v.name}' ({kind}) into '{op.name}' "
                                  f"({op.kind}): {rule}. Pass force=True to fuse anyway.")
            edges.append(EdgeRule(v.name, op.name, rule))
            fused_types.append(rule.fused or MappingType.MANY_TO_MANY)
        acc[id(op)] = max(fused_types, key=_DIRECTNESS.index) if fused_types else op.mapping_type
        # no input read through a remap that moves elements: a Reorganize that does not fold
        # to the flat offset, or a Shuffle (a transpose), whatever free reshapes surround it
        free[id(op)] = acc[id(op)] is MappingType.REORGANIZE and all(
            folds or t not in (MappingType.REORGANIZE, MappingType.SHUFFLE)
            for folds, t in zip(op.free_reshapes, op.input_mapping_types)) and all(
            free[id(v)] or acc[id(v)] is MappingType.ONE_TO_ONE
            for v in op.inputs if id(v) in members)
    block_type = max((acc[id(op)] for op in block), key=_DIRECTNESS.index)
    return edges, block_type


# what a chain of remaps before a contraction may hold (``_reads_runs``)
_REMAPS = (MappingType.ONE_TO_ONE, MappingType.REORGANIZE, MappingType.SHUFFLE)


def _reads_runs(producer: Value, consumer: Op, slot: int, members: set[int]) -> bool:
    """Whether ``consumer`` reduces along contiguous runs of the source of ``producer``: a
    chain of single-input remaps (a Slice, Reshape or Transpose, at least one that moves
    elements) inside the block, down to a value outside it, whose maps composed with the
    consumer's read pass ``classify.reads_runs_along_reduction``: attention's scores over
    ``transpose(k)``, or over ``transpose(slice(qkv))`` of a merged projection."""
    if consumer.input_mapping_types[slot] is not MappingType.MANY_TO_MANY:
        return False
    read, moves, v = consumer.index_maps[slot], False, producer
    while isinstance(v, Op) and len(v.inputs) == 1 and v.mapping_type in _REMAPS:
        read = compose(v.index_maps[0], read)
        moves = moves or v.mapping_type is not MappingType.ONE_TO_ONE
        v = v.inputs[0]
        if id(v) not in members:
            return moves and reads_runs_along_reduction(read)
    return False


def _used(bindings: DataBindings, cond: sympy.Basic) -> DataBindings:
    """The ``bindings`` of the data symbols ``cond`` tests."""
    return tuple(b for b in bindings if b[0] in cond.free_symbols)


class _Inliner:
    """Inlines block members into each other; collects the block's external inputs."""

    def __init__(self, block: list[Op], shape: tuple[int, ...]) -> None:
        self.members = {id(op) for op in block}
        self.inputs: list[Value] = []
        self.ranges: dict[sympy.Symbol, int] = dict(zip(out_symbols(len(shape)), shape))
        self._memo: dict[Any, Expr] = {}

    def output_body(self, op: Op) -> Expr:
        return self.inline(op, out_symbols(op.rank), sympy.true, ())

    def _slot(self, value: Value) -> int:
        for k, v in enumerate(self.inputs):
            if v is value:
                return k
        self.inputs.append(value)
        return len(self.inputs) - 1

    def inline(self, op: Op, index: tuple[sympy.Expr, ...], guard: sympy.Basic,
               bindings: DataBindings) -> Expr:
        """``op``'s value at ``index`` (expressions in the block's output and reduction symbols),
        read only where ``guard`` holds, with ``bindings`` for data symbols in ``index``."""
        key = (id(op), index, guard, tuple((s, n) for s, n, _ in bindings))
        if key in self._memo:
            return self._memo[key]
        assert op.body is not None
        sub: dict[sympy.Basic, sympy.Basic] = dict(zip(out_symbols(op.rank), index))
        for node in walk(op.body):  # reductions and data symbols bind fresh names per inlining
            for s, n in (node.axes if isinstance(node, Reduce) else ()):
                sub[s] = fresh_reduce_symbol(str(s).rstrip("0123456789"))
                self.ranges[sub[s]] = n
            for s, n, _ in (node.data if isinstance(node, Read) else ()):
                sub[s] = fresh_reduce_symbol(str(s).rstrip("0123456789"))
                self.ranges[sub[s]] = n

        def rewrite(node: Expr, recurse: Any) -> Expr | None:
            if isinstance(node, Reduce):
                axes = tuple((sub[s], n) for s, n in node.axes)
                return Reduce(node.dtype, node.kind, recurse(node.body), axes)
            if isinstance(node, IndexCond):
                cond = simplify_guard(node.cond.xreplace(sub), self.ranges)
                return IndexCond(node.dtype, cond, _used(bindings, cond))
            if isinstance(node, Read):
                return self._read(op, node, sub, guard, bindings, recurse)
            return None

        out = transform(op.body, rewrite)
        self._memo[key] = out
        return out

    def _read(self, op: Op, node: Read, sub: dict, guard: sympy.Basic, bindings: DataBindings,
              recurse: Any) -> Expr:
        exprs = tuple(simplify_index(e.xreplace(sub), self.ranges) for e in node.exprs)
        g = simplify_guard(sympy.And(guard, node.guard.xreplace(sub)), self.ranges)
        own = tuple((sub[s], n, recurse(v)) for s, n, v in node.data)
        used = set(g.free_symbols).union(*(e.free_symbols for e in exprs))
        data = own + tuple(b for b in bindings if b[0] in used and b not in own)
        src = op.inputs[node.slot]
        if id(src) in self.members:
            value = self.inline(src, exprs, g, data)  # type: ignore[arg-type]
        elif (number := _number(src, op)) is not None:
            value = const(number, node.dtype)
        else:
            return Read(node.dtype, self._slot(src), exprs, g, data)
        if g is sympy.true:
            return value
        # A guarded read is 0 where the guard fails (a convolution's padding): the producer's
        # value there is not what it would compute from zero-filled loads (sigmoid(0) != 0).
        return select(IndexCond(DType.bool, g, _used(data, g)), value, const(0, node.dtype))


def _number(value: Value, reader: Op) -> float | int | bool | None:
    """The number ``reader`` reads for ``value`` if it reads it as a literal, else None: a
    single-element constant (Clip's bounds, a scale, GELU's 0.5 and 1) read by an operator that
    reduces over none of its inputs. The kernel then takes no buffer for it, and the backends
    see the number: a Clip by constant bounds is then one compare and one select a side
    instead of three operations and a select (its NaN test is needed only where the bound
    could be NaN). A contraction's operands stay buffers, which its templates read."""
    if not isinstance(value, Constant) or value.numel != 1 or \
            reader.mapping_type is MappingType.MANY_TO_MANY:
        return None
    return np.asarray(value.value).reshape(-1)[0].item()

