"""DNNFusion's fusion plan (seed selection, then successor and predecessor propagation by the
mapping-type table), as a planner: ``plan_dnnfusion(graph) -> list[Block]``.

1. Seeds: the operators not yet in a block, One-to-One ones first, smallest output first
   (DNNFusion starts from the operators whose fusion costs least and removes most), then the
   rest in graph order.
2. Grow: from a seed, try each consumer of the block (successors), then each producer
   (predecessors), repeating until nothing joins. An operator joins when ``fuse`` accepts the
   enlarged block, which is the constraint check: every in-block edge is a table cell that is
   not red (no two reductions or contractions in one kernel), the block stays convex (no path
   leaves it and comes back), and its outputs share one shape (one kernel, one iteration space).
   A block also holds at most one Many-to-Many operator: two that are not an edge of the table
   (Inception's parallel convolutions joined by a Concat, ResNet's two branches joined by an
   Add) would be one kernel with neither convolution's template, each output element
   recomputing its branch; that ran Inception v1 100x slower than one kernel per block. Nor
   does a contraction join a block whose output is larger than its own (the Concat closing an
   Inception module): its template would tile the Concat's whole output, computing guarded
   zeros for the other branches' channels (141 of Inception v1's 234 ms). A Concat whose
   parts are contiguous is no block's member at all: it is assembled in place
   (``in_place_concats``), its inputs' kernels writing into it. And
   an operand chain fused into a contraction (its prologue) costs at most ``PROLOGUE_LIMIT``
   operations an element, counted once for every tile along the other operand's own axis,
   since the template recomputes it in each (``_recomputed``).
   A chain that a contraction's output alone feeds (directly or through elementwise
   operators nothing else reads) is that contraction's epilogue, never the next Many-to-Many
   operator's prologue (successor propagation would put it there first): computed once an
   element, not in every window or tile that reads it.
3. Yellow cells (fusion pays only where measured) are decided by ``decide``: the enlarged
   block is fused where its measurement (``kernelgen.measure_fusion``: the one kernel timed
   against the block cut at its yellow edges, stored in the Fast-Run database) found the one
   kernel clearly faster: its 80th percentile below the split's 20th (verdicts within the
   runs' spread flipped from run to run, and on the BERT layer one such plan ran 25% slower
   than leaving the cells unfused). ``compile_model(..., tuning='measure')`` measures what is
   missing, the default 'stored' reads what was measured before. Without a verdict the cell
   is not fused: the plan keeps the cheaper certain choice. A grown block that let yellow
   cells in is measured once more as a whole, since what joined later can change the
   balance; unless it still wins clearly, its split's pieces become the blocks.
4. AGO's intensive fusion (``intensive.py``), over the grown blocks: blocks that a red
   Many-to-Many -> Many-to-Many cell keeps apart (the attention pattern's scores, their
   Softmax and P V; a convolution and the pointwise convolution reading it) merge where one
   kernel computes each producer element once (a staged score row; a 1x1 conv's tiles that
   compute the convolution once, as the measured kernel reports) and its measurement, as a
   yellow cell's, found it clearly faster.

Each block's note names its operators and every neighbour that stopped growth; its ``stops``
hold every edge to a refused neighbour with the rule that stopped it (the fusion report's
material). Every unfused edge is recorded once, by the block grown first: the other end was
unassigned then, so it was a neighbour that the block refused.
"""
from __future__ import annotations

from math import prod

from ..errors import FusionError
from ..fusion import FusionVerdict, split_parts
from ..fusion.fuse import BETWEEN
from ..ir.expr import Call, walk
from ..ir.node import Op
from ..mapping_types import Colour, MappingType
from .blocks import CONTRACTIONS, IN_PLACE, Block, Stop, fusible, in_place_concats, order_blocks
from .intensive import Decide, fuse_intensive
from .model import Graph


def plan_dnnfusion(graph: Graph, decide: Decide | None = None) -> list[Block]:
    """DNNFusion's blocks for ``graph``, in an executable order: green edges, and yellow ones
    where ``decide`` found the fused kernel clearly faster."""
    order = graph.producer_index()
    concats = in_place_concats(graph)
    assigned = {id(op) for op in concats}
    blocks = [in_place_block(graph, op) for op in concats]
    for seed in _seeds(graph):
        if id(seed) in assigned:
            continue
        members, refused, measured = _grow(graph, seed, assigned, decide)
        members.sort(key=lambda op: order[id(op)])
        assigned.update(id(op) for op in members)
        note = _note(graph, members, refused)
        if measured:
            note += "; yellow cells fused, " + "; ".join(measured)
            lost = _checked_whole(graph, members, decide)
            if lost is not None:
                blocks += _split_blocks(graph, *lost, refused, note)
                continue
        blocks.append(Block(tuple(members), note, _stops(graph, members, refused)))
    return fuse_intensive(graph, order_blocks(graph, blocks), decide)


def in_place_block(graph: Graph, concat: Op) -> Block:
    """The view block of an in-place Concat, every edge touching it recorded as unfused (the
    blocks grown later skip it as assigned, so they record none of them)."""
    rule = f"Concat '{concat.name}' {IN_PLACE}"
    edges = [(v.name, concat.name) for v in concat.inputs]
    edges += [(concat.name, c.name) for c in graph.consumers(concat)]
    return Block((concat,), "dnnfusion: Concat in place",
                 tuple(Stop(a, b, rule) for a, b in edges), view=True)


def _checked_whole(graph: Graph, members: list[Op], decide: Decide | None
                   ) -> tuple[list[list[Op]], FusionVerdict] | None:
    """The grown block measured once more as a whole: each yellow cell was measured when it
    joined, but what joined after may have changed the balance (a second transposed operand
    into the same contraction). None when the whole still wins clearly fused (or cannot be
    measured); else its split's pieces and the verdict."""
    block = fusible(graph, members)
    verdict = decide(block) if decide is not None else None
    if verdict is None or (verdict.fused and verdict.clear):
        return None
    return [list(part.ops) for part in split_parts(block)], verdict


def _split_blocks(graph: Graph, pieces: list[list[Op]], verdict: FusionVerdict,
                  refused: dict[int, str], note: str) -> list[Block]:
    """Blocks of the pieces of a grown block that did not win clearly as a whole, each cut edge
    recorded once (by the piece that reads it)."""
    owner = {id(op): k for k, piece in enumerate(pieces) for op in piece}
    blocks = []
    for k, piece in enumerate(pieces):
        cut = tuple(Stop(v.name, op.name, f"the grown block, measured as a whole, did not win "
                         f"clearly fused ({verdict}), so it runs cut at its yellow cells")
                    for op in piece for v in dict.fromkeys(op.inputs)
                    if owner.get(id(v), k) != k)
        blocks.append(Block(tuple(piece), f"{note}; measured as a whole, split into "
                            f"{len(pieces)} kernels", _stops(graph, piece, refused) + cut))
    return blocks


def _seeds(graph: Graph) -> list[Op]:
    oto = [op for op in graph.ops if op.mapping_type is MappingType.ONE_TO_ONE]
    oto.sort(key=lambda op: op.numel * op.dtype.itemsize)
    return oto + [op for op in graph.ops if op.mapping_type is not MappingType.ONE_TO_ONE]


def _grow(graph: Graph, seed: Op, assigned: set[int], decide: Decide | None
          ) -> tuple[list[Op], dict[int, str], list[str]]:
    """The block grown from ``seed``, per refused neighbour (by id) why it was refused, and
    the measurements that let yellow cells in."""
    members = [seed]
    refused: dict[int, str] = {}
    # a neighbour refused because an operator between it and the block was outside, by id:
    # the block's size then; it is tried again once the block has grown (a GELU's Mul
    # reads the bias Add and the Add after the Erf, which joins later)
    between: dict[int, int] = {}
    measured: list[str] = []
    changed = True
    while changed:
        changed = False
        for candidate in _neighbours(graph, members):
            if id(candidate) in assigned or (id(candidate) in refused and between.get(
                    id(candidate), len(members)) == len(members)):
                continue
            why = _refusal(graph, members, candidate, decide, measured, assigned)
            if why is None:
                members.append(candidate)
                refused.pop(id(candidate), None)
                changed = True
            else:
                refused[id(candidate)] = why
                if BETWEEN in why:
                    between[id(candidate)] = len(members)
                else:
                    between.pop(id(candidate), None)
    return members, refused, measured


def _neighbours(graph: Graph, members: list[Op]) -> list[Op]:
    """Consumers of the block first (successor propagation), then its producers."""
    inside = {id(op) for op in members}
    after = [c for op in members for c in graph.consumers(op) if id(c) not in inside]
    before = [v for op in members for v in op.inputs
              if isinstance(v, Op) and id(v) not in inside]
    return list({id(op): op for op in (*after, *before)}.values())


# Per-element cost of an operand chain fused into a contraction (its prologue), which the
# contraction's template recomputes for every tile along the other operand's own axis (a 1x1
# conv's input for every tile of its output channels): arithmetic counts 1, a transcendental
# function ``TRANSCENDENTAL``, times those tiles (``PROLOGUE_TILE`` elements each, about a
# register tile's rows). A GELU chain (Div, Erf, Add, Mul, Mul: 20) fused into BERT's second
# feed-forward MatMul made the layer 4x slower than TVM's plan; DenseNet-121's pre-activation
# BatchNormalization and ReLU (3) fused into its 1x1 convs (128 output channels: 16 tiles)
# made them take 70.1 against 41.2 ms, and the model 117 against TVM's 89 ms on the Zen 1 VM,
# where its 61 such chains as kernels of their own took 3.7 ms; its ReLU alone (16 tiles:
# 16) fused so still took 54.0 against 41.2 ms. ShuffleNet's ReLUs before two 1x1 convs
# (1 operation, 9 and 17 tiles) now run apart: its plan took 7.22 ms against 7.09 with them
# fused (30 rounds, the same VM: within the noise). Index maps (Reshape, Transpose) cost
# nothing and always fuse.
TRANSCENDENTAL = 16
PROLOGUE_LIMIT = 8
PROLOGUE_TILE = 8
_CHEAP = {"add", "sub", "mul", "div", "neg", "abs", "max", "min", "sign", "lt", "le", "gt",
          "ge", "eq", "ne", "and", "or", "xor", "not", "floor", "ceil", "rint", "isnan", "isinf"}


def _cost(op: Op) -> int:
    calls = [n.fn for n in walk(op.body) if isinstance(n, Call)]
    return sum(1 if fn in _CHEAP else TRANSCENDENTAL for fn in calls)


def _recomputed(head: Op, prologue: list[Op]) -> int:
    """How many times ``head``'s template computes each element of the operand that
    ``prologue`` feeds: once for every tile along the axis only the other operand has (a
    conv's output channels for its input, its output pixels for its weights; a MatMul's
    output columns for its left operand, its rows for its right)."""
    fed = {id(op) for op in prologue}
    shape = head.shape
    if head.kind == "Conv":
        own = [shape[1] // int(head.attrs.get("group", 1)), prod(shape[2:])]
    else:
        own = [shape[-1], shape[-2] if len(shape) > 1 else 1]
    extent = max((own[k] for k, v in enumerate(head.inputs[:2]) if id(v) in fed), default=1)
    return -(-extent // PROLOGUE_TILE)


def _prologue(head: Op, block: list[Op]) -> list[Op]:
    """The operators of ``block`` that its contraction ``head`` reads through."""
    inside = {id(op): op for op in block}
    upstream: dict[int, Op] = {}
    todo = [v for v in head.inputs if id(v) in inside]
    while todo:
        op = inside[id(todo.pop())]
        if id(op) not in upstream:
            upstream[id(op)] = op
            todo += [v for v in op.inputs if id(v) in inside]
    return list(upstream.values())


def _refusal(graph: Graph, members: list[Op], candidate: Op, decide: Decide | None,
             measured: list[str], assigned: set[int]) -> str | None:
    """None when ``candidate`` may join the block, else the rule that stops it. A yellow
    block's measurement that lets it join goes to ``measured``."""
    try:
        block = fusible(graph, [*members, candidate])
    except FusionError as exc:
        return str(exc).removesuffix(" Pass force=True to fuse anyway.")
    heavy = [op for op in (*members, candidate) if op.mapping_type is MappingType.MANY_TO_MANY]
    if len(heavy) > 1:
        return (f"{heavy[0].name} ({heavy[0].kind}) and {heavy[1].name} ({heavy[1].kind}) are "
                "both Many-to-Many: in one kernel they share one iteration space, so neither "
                "keeps its template and each recomputes its part for every output element "
                "(siblings joined by a Concat or an Add are not an edge of the table)")
    if heavy and heavy[0].kind in CONTRACTIONS and prod(block.shape) > heavy[0].numel:
        head = heavy[0]
        return (f"{head.name} ({head.kind}) would run over the block's larger output "
                f"{'x'.join(map(str, block.shape))} (a Concat or Pad after it): its template "
                f"computes every element of that domain, most of them guarded zeros, "
                f"instead of its own {'x'.join(map(str, head.shape))}")
    prologue = _prologue(heavy[0], [*members, candidate]) if heavy else []
    # checked both when the chain joins the Many-to-Many operator's block and when that
    # operator joins the chain's (grown from an elementwise seed)
    if heavy and (candidate is heavy[0] or candidate in prologue):
        head = heavy[0]
        owner = _epilogue_owner(graph, prologue, assigned)
        if owner is not None:
            return (f"{'+'.join(op.kind for op in prologue)} goes to its producer "
                    f"{owner.name} ({owner.kind}) as its epilogue, computed once an element, "
                    f"not to {head.name} ({head.kind}) as its prologue, recomputed for every "
                    "window or tile that reads it")
        cost = sum(_cost(op) for op in prologue)
        tiles = _recomputed(head, prologue)
        if cost * tiles > PROLOGUE_LIMIT:
            return (f"{head.name} ({head.kind}) would recompute its fused operand chain "
                    f"({'+'.join(op.kind for op in prologue)}, {cost} operations an element) "
                    f"once for each of its {tiles} tile(s) along the other operand's axis: "
                    f"{cost * tiles} operations an element, more than {PROLOGUE_LIMIT}")
    yellow = [e for e in block.edges if e.rule.colour is Colour.YELLOW]
    if not yellow:
        return None
    verdict = decide(block) if decide is not None else None
    if verdict is None:
        return (f"yellow cell {yellow[0]}: fusion pays only where measured, and nothing "
                "was measured (compile with tuning='measure' to measure it), so it is left "
                "unfused")
    if not verdict.fused:
        return f"yellow cell {yellow[0]}: split ran faster ({verdict})"
    if not verdict.clear:
        return (f"yellow cell {yellow[0]}: fused won within the runs' spread ({verdict}), "
                "too close to pay for the fusion's risk, so it is left unfused")
    measured.append(f"{candidate.name} ({verdict})")
    return None


# Whether a contraction owns a chain it feeds through elementwise operators (a BN between a
# convolution and its ReLU), not only one it feeds directly; bench/epilogue_chains.py turns it
# off to compare the plans.
EPILOGUE_THROUGH_ELEMENTWISE = True


def _epilogue_owner(graph: Graph, chain: list[Op], assigned: set[int]) -> Op | None:
    """The unassigned contraction whose output only ``chain`` reads, directly or through
    elementwise operators not in a block yet that only the chain and each other read, or None.
    The chain is better its epilogue: Inception v1's ReLUs fused into the next convolution's
    Winograd transform or im2col pack, or a max-pool's windows, ran its DNNFusion plan at 34.2
    ms against 27.9 for TVM's plan, which fuses them into the convolution before; a GELU's
    tail (it reads the bias Add and the Erf between the MatMul and itself) fused into the
    next MatMul's operand left the Erf in a kernel of its own."""
    inside = {id(op) for op in chain}
    between: list[Op] = []  # the elementwise operators from the contraction to the chain
    found: list[Op] = []
    todo = [v for op in chain for v in op.inputs]
    while todo:
        v = todo.pop()
        if (not isinstance(v, Op) or id(v) in inside or id(v) in assigned
                or graph.is_output(v)):
            continue
        inside.add(id(v))
        if v.kind in CONTRACTIONS:
            found.append(v)
        elif v.mapping_type is MappingType.ONE_TO_ONE and EPILOGUE_THROUGH_ELEMENTWISE:
            between.append(v)
            todo += v.inputs
    for v in found:
        ops = [v, *between]
        if all(id(c) in inside for op in ops for c in graph.consumers(op)):
            return v
    return None


def _stops(graph: Graph, members: list[Op], refused: dict[int, str]) -> tuple[Stop, ...]:
    """Every edge between the block and a neighbour it refused, with the refusal."""
    inside = {id(op) for op in members}
    stops = []
    for op in members:
        stops += [Stop(v.name, op.name, refused[id(v)]) for v in dict.fromkeys(op.inputs)
                  if id(v) in refused]
        stops += [Stop(op.name, c.name, refused[id(c)]) for c in graph.consumers(op)
                  if id(c) in refused and id(c) not in inside]
    return tuple(stops)


def _note(graph: Graph, ops: list[Op], refused: dict[int, str]) -> str:
    kinds = "+".join(op.kind for op in ops)
    note = f"dnnfusion: {kinds}"
    if refused:
        by_id = {id(op): op for op in graph.ops}
        note += "; not fused: " + "; ".join(f"{by_id[k].name} ({by_id[k].kind}): {why}"
                                             for k, why in refused.items())
    return note
