"""AGO's intensive fusion over a DNNFusion plan: two blocks that a red Many-to-Many ->
Many-to-Many cell keeps apart, merged into one kernel where

1. the merged kernel computes each producer element once (AGO's no-redundancy constraint),
   in one of two ways:
   - *staged*: its loop IR stages the producer's row once per group point
     (``lower/staging.py``: the scores Q K that a Softmax's max, sum and outputs read; the
     weights that P V sums);
   - *in the tiles*: a 1x1 convolution's contraction template computes the producer (a
     convolution, its epilogue applied) inside its operand; the measured kernel's
     ``producer_redundancy`` (how many tiles compute each producer element, carried by the
     verdict) must be 1: one tile spans every output channel, or each column tile computes
     its producer once into a panel that its row tiles sweep;
2. the Fast-Run database holds a measurement of the merged kernel against its split (the
   blocks apart; ``measure_fusion``, taken when the plan is made under ``tuning='measure'``
   or ``'measure-fusion'``) in which it won clearly, as a yellow cell must.

The staged pairs are the attention pattern's, a block around a MatMul or a Softmax feeding a
block around a Softmax or a MatMul (two MatMuls excepted: a contraction template, not a staged
row, would compute that producer, and only inside its tiles), and a transformer's projection
into its LayerNormalization: a block around a MatMul or Gemm (its bias and residual Add in
its epilogue) feeding a block around a LayerNormalization over the projection's rows. A
staged pair is tried after the longest chain it starts (the scores, their Softmax and P V
where nothing outside reads the weights), and chains until none merges. The pairs in the
tiles are AGO's Conv -> 1x1 Conv: a block around a convolution feeding a block whose first
heavy operator is a pointwise convolution (1x1 kernel, stride 1, no padding, one group),
tried as a pair. An edge left apart keeps its rule in the report, followed by why its pair
did not merge.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..errors import FusionError
from ..fusion import FusedBlock, FusionVerdict
from ..ir.expr import Expr, Reduce, walk
from ..ir.loop import LoopKernel
from ..ir.node import Op
from ..lower import lower
from ..lower.contraction import contraction, operand_has_reduction
from ..lower.staging import shared_terms_only
from ..mapping_types import MappingType
from .blocks import Block, fusible, order_blocks
from .model import Graph

# A block's measured verdict, or None where nothing was measured (the planners' ``decide``).
Decide = Callable[[FusedBlock], FusionVerdict | None]

# the heavy operators of the blocks a staged pair joins: producer kinds, consumer kinds (a
# LayerNormalization over a projection's rows: its mean, its variance and its outputs read the
# staged row). Two contractions are never a staged pair: a contraction template, not a staged
# row, would compute that producer, and only inside its tiles.
CONTRACTIONS = frozenset({"MatMul", "Gemm"})
ROW_PRODUCERS = frozenset({*CONTRACTIONS, "Softmax", "LogSoftmax"})
ROW_CONSUMERS = frozenset({"Softmax", "LogSoftmax", "LayerNormalization", "MatMul"})
INTENSIVE = "AGO's intensive fusion"


def fuse_intensive(graph: Graph, blocks: list[Block], decide: Decide | None) -> list[Block]:
    """``blocks`` with every intensive chain (module docstring) merged where ``decide`` found
    the merged kernel clearly faster; without ``decide`` (no backend to measure on), as they
    are."""
    if decide is None:
        return blocks
    why_not: dict[tuple[tuple[str, ...], ...], str] = {}
    merged = True
    while merged:
        merged = False
        for chain, staged in _chains(blocks):
            key = tuple(b.names for b in chain)
            if key in why_not:
                continue
            block, why = _merge(graph, chain, staged, decide)
            if block is None:
                why_not[key] = why
                continue
            blocks = order_blocks(graph, [b for b in blocks if all(b is not c for c in chain)]
                                  + [block])
            merged = True
            break
    return [_annotated(b, why_not) for b in blocks]


def _heavy(block: Block, last: bool) -> Op | None:
    """The block's last Many-to-Many operator (what it hands on) or its first (what takes the
    other block's values)."""
    heavy = [op for op in block.ops if op.mapping_type is MappingType.MANY_TO_MANY]
    return heavy[-1 if last else 0] if heavy and not block.view else None


def _pairs(blocks: list[Block]) -> list[tuple[int, int, bool]]:
    """(producer, consumer, staged) block indices for every block edge from a row producer to
    a row consumer (staged) and from a convolution to a pointwise one (in the tiles), in plan
    order."""
    owner = {id(op): b for b, block in enumerate(blocks) for op in block.ops}
    pairs: list[tuple[int, int, bool]] = []
    for c, consumer in enumerate(blocks):
        head = _heavy(consumer, last=False)
        if head is None:
            continue
        sources = dict.fromkeys(owner[id(v)] for op in consumer.ops for v in op.inputs
                                if id(v) in owner and owner[id(v)] != c)
        for p in sources:
            tail = _heavy(blocks[p], last=True)
            if tail is None:
                continue
            if tail.kind in ROW_PRODUCERS and head.kind in ROW_CONSUMERS and \
                    not (tail.kind in CONTRACTIONS and head.kind in CONTRACTIONS):
                pairs.append((p, c, True))
            elif tail.kind == "Conv" and _pointwise(head) and \
                    owner.get(id(head.inputs[0])) == p:  # the data, not a residual
                pairs.append((p, c, False))
    return pairs


def _pointwise(op: Op) -> bool:
    """A 1x1 convolution that is a plain contraction over channels: stride 1, no padding, one
    group (its output pixel p reads the input's pixel p only)."""
    a = op.attrs
    return op.kind == "Conv" and all(k == 1 for k in a["kernel_shape"]) and \
        all(st == 1 for st in a["strides"]) and not any(a["pads"]) and a["group"] == 1


def _chains(blocks: list[Block]) -> list[tuple[list[Block], bool]]:
    """Each pair of ``_pairs`` (its blocks, and whether staged); a staged one preceded by its
    longest extension through the consumer's own staged pairs (the scores, their Softmax and
    P V): tried first, so the whole chain merges where its one kernel wins even when a part
    of it alone would not."""
    pairs = _pairs(blocks)
    onward: dict[int, list[int]] = {}
    for p, c, staged in pairs:
        if staged:
            onward.setdefault(p, []).append(c)
    chains: list[tuple[list[Block], bool]] = []
    for p, c, staged in pairs:
        path = [p, c]
        while staged and len(onward.get(path[-1], [])) == 1 and onward[path[-1]][0] not in path:
            path.append(onward[path[-1]][0])
        chains += [([blocks[k] for k in path[:n]], staged) for n in range(len(path), 1, -1)]
    return chains


def _merge(graph: Graph, chain: list[Block], staged: bool, decide: Decide
           ) -> tuple[Block | None, str]:
    """The blocks of ``chain`` merged into one, or None and why not."""
    order = graph.producer_index()
    ops = sorted((op for b in chain for op in b.ops), key=lambda op: order[id(op)])
    try:
        fused = fusible(graph, ops, force=True)
    except FusionError as exc:
        return None, f"{INTENSIVE} cannot make one kernel of them: {exc}"
    kernel = lower(fused)
    if staged and not _staged_once(kernel):
        return None, (f"{INTENSIVE} does not apply: one kernel would not stage the "
                      "producer's rows, so it would compute them again for every element"
                      f"{_merged_first(chain)}")
    if not staged and not _in_the_tiles(kernel):
        return None, (f"{INTENSIVE} does not apply: one kernel would not be a contraction "
                      f"computing the convolution inside its operand{_merged_first(chain)}")
    if len(fused.outputs) != 1:
        return None, (f"{INTENSIVE} is measured against the blocks apart, which cannot be "
                      f"timed as one program with {len(fused.outputs)} outputs")
    verdict = decide(fused)
    if verdict is None:
        return None, (f"{INTENSIVE} pays only where measured, and nothing was measured "
                      "(compile with tuning='measure' to measure it)")
    if verdict.redundancy > 1.0:
        return None, (f"{INTENSIVE} does not apply: the one kernel's tiles compute each "
                      f"element of the convolution {verdict.redundancy:g} times (its output "
                      f"channels span several tiles), {verdict}")
    if not (verdict.fused and verdict.clear):
        return None, f"{INTENSIVE} measured: {verdict}"
    inside = {op.name for op in ops}
    stops = tuple(s for b in chain for s in b.stops
                  if not (s.producer in inside and s.consumer in inside))
    note = " | ".join(b.note for b in chain) + f"; {INTENSIVE}, measured: {verdict}"
    return Block(tuple(ops), note, stops), ""


def _merged_first(chain: list[Block]) -> str:
    """Where a block of ``chain`` is itself an intensive pair merged before (its consumer's
    own pair, say), a clause naming it: the reason this pair cannot join it."""
    first = [b for b in chain if INTENSIVE in b.note]
    return "".join(f" (its block {' + '.join(b.names)} merged first, a pair of its own)"
                   for b in first)


def _staged_once(kernel: LoopKernel) -> bool:
    """Whether ``kernel`` stages its producer's rows (a row holding a reduction of tensors
    read directly, computed once per group point) and is no contraction template's."""
    if not kernel.staged or shared_terms_only(kernel) or contraction(kernel) is not None:
        return False
    return not any(_sums_a_reduction(st.value, kernel.hoisted) for st in kernel.staged)


def _in_the_tiles(kernel: LoopKernel) -> bool:
    """Whether ``kernel`` is a contraction with the producer's reduction in one operand, a
    reduction of tensors read directly (a producer of its own inside it would be computed again
    for every element of the one the tiles compute; how often the tiles compute theirs is the
    backend's, measured with the verdict)."""
    c = contraction(kernel)
    if c is None or operand_has_reduction(c.left) == operand_has_reduction(c.right):
        return False
    return not _sums_a_reduction(c.left if operand_has_reduction(c.left) else c.right)


def _sums_a_reduction(expr: Expr, hoisted: Sequence[Reduce] = ()) -> bool:
    """Whether a reduction in ``expr`` sums another one (not among ``hoisted``): a producer of
    its own, computed again for every element of the producer around it."""
    return any(isinstance(inner, Reduce) and inner not in hoisted
               for node in walk(expr) if isinstance(node, Reduce) for inner in walk(node.body))


def _annotated(block: Block, why_not: dict[tuple[tuple[str, ...], ...], str]) -> Block:
    """``block`` with each stop between it and the other block of a pair that did not merge
    followed by why (the pair's own reason; a longer chain's is in no stop)."""
    reasons = {key: why for key, why in why_not.items()
               if len(key) == 2 and block.names in key}
    if not reasons:
        return block
    stops = []
    for stop in block.stops:
        why = next((w for (p, c), w in reasons.items()
                    if stop.producer in p and stop.consumer in c), None)
        stops.append(replace(stop, rule=f"{stop.rule}; {why}") if why else stop)
    return replace(block, stops=tuple(stops))


__all__ = ["INTENSIVE", "Decide", "fuse_intensive"]
