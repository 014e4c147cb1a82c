"""Math-property rewriting (DNNFusion §4.2, Table 4) on a ``Graph``, to a fixpoint:

    result = simplify(graph)          # result.graph, result.applied (rule, operator, FLOPs)

Each round walks the operators in order and tries the rules (``RULES``, a table of
``name -> rule``) on each; a rule returns the value that replaces the operator and the
operators it matched. A rewrite is kept only if FLOPs do not grow: the operators it creates
must cost no more than the operator plus the matched ones that die with it (those read by
nothing else). Rounds repeat until none applies. Pure: the input graph is left alone, and the
new operators and constants are named after the operator they replace (``conv1/fold_bn``).

Rules: ``identity`` (Identity, Dropout at inference), ``noop_reshape`` (a reshape to the same
shape, an identity Transpose), ``reshape_chain`` and ``transpose_chain`` (two data movements
as one), ``neutral`` (x*1, x/1, x+0, x-0), ``double_negation``, ``idempotent`` (Relu(Relu)),
``constant_fold`` (an operator of constants, evaluated by the interpreter), ``fold_bn``
(BatchNormalization into the Conv or Gemm before it, ``rewrite.fold_batchnorm``), and two of
Table 4's families: associative (``associate_constants``: (x*c1)*c2 -> x*(c1*c2), likewise +)
and distributive (``distribute``: a*b + a*c -> a*(b+c)). After the fixpoint, the graph
passes (``PASSES``), which rewrite several operators at once, then the rules again:
``merge_projections`` (sibling MatMuls of one input as one, ``projections.py``).

# Note: NaN and Inf
Every rule gives the same NaN and Inf as the unrewritten graph for any input, or is not
applied; what may differ is rounding (as with any reassociation). Where that needs a fact about
a value, the rule asks for a constant and checks it:
- ``distribute``: with a = Inf, b = 0, c = 1, a*b + a*c is NaN but a*(b+c) is Inf, so ``a``
  must be a constant with finite values;
- ``associate_constants``: c1*c2 (c1+c2) must be finite, and a product must not underflow to
  zero where neither factor is zero (x = Inf would give NaN instead of Inf);
- ``fold_bn``: the scale gamma/sqrt(var+eps) must be finite and non-zero;
- ``neutral``: x+0 gives +0 for x = -0, which compares equal;
- Table 4's commutative rule ReduceProd(Exp(a)) -> Exp(ReduceSum(a)) is not applied at all:
  for a = [Inf, -1000] the left side is Exp(Inf)*Exp(-1000) = Inf*0 = NaN (the second factor
  underflows), the right side Exp(Inf) = Inf, and no check on a constant can rule that out
  for a tensor input.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import KernelgenError
from ..fusion import fuse
from ..ir.interp import interpret
from ..ir.node import Constant, Op, Value
from ..lower import lower
from ..ops.elementwise import binary
from ..ops.nn import batch_norm_affine
from ..ops.shape import reshape, transpose
from .model import Graph, fresh_name
from .projections import merge_projections
from .rewrite import RewriteError, fold_batchnorm

_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
_FOLD_MIN = 64  # a constant fold may grow its data up to this many elements, no more


@dataclass(frozen=True)
class Match:
    """A rule's result: the value replacing the operator, and the other operators it matched
    (removed with it when nothing else reads them)."""

    value: Value
    matched: tuple[Op, ...] = ()


@dataclass(frozen=True)
class Applied:
    """One kept rewrite: the rule, the operator it replaced, FLOPs before and after."""

    rule: str
    op: str
    flops_before: int
    flops_after: int


@dataclass(frozen=True)
class Simplified:
    """The rewritten graph, the rewrites in the order they were kept, and the rounds run."""

    graph: Graph
    applied: tuple[Applied, ...]
    rounds: int

    def counts(self) -> dict[str, int]:
        """Rewrites kept per rule."""
        out: dict[str, int] = {}
        for a in self.applied:
            out[a.rule] = out.get(a.rule, 0) + 1
        return out


@dataclass
class Context:
    """What rules may ask during one round: whether a value dies with its consumer."""

    graph: Graph
    origin: dict[int, Op] = field(default_factory=dict)  # rebuilt operator -> the graph's

    def exclusive(self, op: Op) -> bool:
        """``op`` is read by one operator only and is no graph output."""
        old = self.origin.get(id(op), op)
        return not self.graph.is_output(old) and len(self.graph.consumers(old)) == 1


Rule = Callable[[Op, Context], Match | None]


def _constant_value(v: Value) -> np.ndarray | None:
    return np.asarray(v.value) if isinstance(v, Constant) else None


def _passes_through(op: Op, x: Value) -> bool:
    return x.shape == op.shape and x.dtype == op.dtype


def identity(op: Op, ctx: Context) -> Match | None:
    """Identity(x), Dropout(x) at inference -> x."""
    return Match(op.inputs[0]) if op.kind in ("Identity", "Dropout") else None


def noop_reshape(op: Op, ctx: Context) -> Match | None:
    """A reshape to the input's own shape, or a Transpose by the identity -> its input."""
    x = op.inputs[0] if op.inputs else None
    if x is None or not _passes_through(op, x):
        return None
    if op.kind in _RESHAPES or (op.kind == "Transpose"
                                and list(op.attrs["perm"]) == list(range(op.rank))):
        return Match(x)
    return None


def reshape_chain(op: Op, ctx: Context) -> Match | None:
    """A reshape of a reshape -> one reshape of the first one's input (or that input)."""
    inner = op.inputs[0] if op.kind in _RESHAPES else None
    if not isinstance(inner, Op) or inner.kind not in _RESHAPES:
        return None
    x = inner.inputs[0]
    value = x if x.shape == op.shape else reshape(x, list(op.shape))
    return Match(value, (inner,))


def transpose_chain(op: Op, ctx: Context) -> Match | None:
    """Transpose(Transpose(x, p), q) -> Transpose(x, p[q]) (or x when that is the identity)."""
    inner = op.inputs[0] if op.kind == "Transpose" else None
    if not isinstance(inner, Op) or inner.kind != "Transpose":
        return None
    p, q = inner.attrs["perm"], op.attrs["perm"]
    perm = [p[j] for j in q]
    x = inner.inputs[0]
    value = x if perm == list(range(len(perm))) else transpose(x, perm)
    return Match(value, (inner,))


_NEUTRAL = {"Mul": (1.0, (0, 1)), "Add": (0.0, (0, 1)), "Div": (1.0, (1,)), "Sub": (0.0, (1,))}


def neutral(op: Op, ctx: Context) -> Match | None:
    """x*1, 1*x, x/1, x+0, 0+x, x-0 -> x, where the constant is all ones (zeros) and does not
    broadcast x to a larger shape."""
    if op.kind not in _NEUTRAL:
        return None
    unit, sides = _NEUTRAL[op.kind]
    for side in sides:
        c, x = _constant_value(op.inputs[side]), op.inputs[1 - side]
        if c is not None and _passes_through(op, x) and bool(np.all(c == unit)):
            return Match(x)
    return None


def double_negation(op: Op, ctx: Context) -> Match | None:
    """Neg(Neg(x)) -> x."""
    inner = op.inputs[0] if op.kind == "Neg" else None
    if isinstance(inner, Op) and inner.kind == "Neg":
        return Match(inner.inputs[0], (inner,))
    return None


def idempotent(op: Op, ctx: Context) -> Match | None:
    """f(f(x)) -> f(x) for Relu, Abs, Ceil, Floor, Round."""
    if op.kind in ("Relu", "Abs", "Ceil", "Floor", "Round"):
        inner = op.inputs[0]
        if isinstance(inner, Op) and inner.kind == op.kind:
            return Match(inner)
    return None


def constant_fold(op: Op, ctx: Context) -> Match | None:
    """An operator whose inputs are all constants -> a constant of its value (computed by the
    IR interpreter, the reference semantics), unless that grows the data more than a little."""
    values = [_constant_value(v) for v in op.inputs]
    if not op.inputs or op.rank == 0 or any(v is None for v in values):
        return None
    if op.numel > max(sum(v.size for v in values if v is not None), _FOLD_MIN):
        return None
    block = fuse(op)
    by_name = dict(zip((v.name for v in op.inputs), values))
    (value,) = interpret(lower(block), *(by_name[v.name] for v in block.inputs))
    return Match(Constant(op.name, op.shape, op.dtype, np.ascontiguousarray(value)))


def fold_bn(op: Op, ctx: Context) -> Match | None:
    """BatchNormalization(Conv or Gemm) -> the Conv or Gemm with folded weights, where the
    producer feeds the BatchNormalization only and every weight is a constant."""
    producer = op.inputs[0] if op.kind == "BatchNormalization" else None
    if not isinstance(producer, Op) or producer.kind not in ("Conv", "Gemm") or \
            not ctx.exclusive(producer):
        return None
    affine = batch_norm_affine(op)
    if affine is None:
        return None
    scale = affine[0]
    if not np.all(np.isfinite(scale)) or np.any(scale == 0):
        return None  # the folded weights would turn Inf into NaN or lose it
    try:
        return Match(fold_batchnorm(op), (producer,))
    except RewriteError:
        return None


def associate_constants(op: Op, ctx: Context) -> Match | None:
    """(x*c1)*c2 -> x*(c1*c2), and (x+c1)+c2 -> x+(c1+c2), in any operand order, where the
    combined constant is finite and (for *) zero only where a factor is."""
    if op.kind not in ("Mul", "Add"):
        return None
    for side in (0, 1):
        inner, c2 = op.inputs[1 - side], _constant_value(op.inputs[side])
        if c2 is None or not isinstance(inner, Op) or inner.kind != op.kind:
            continue
        for inner_side in (0, 1):
            c1, x = _constant_value(inner.inputs[inner_side]), inner.inputs[1 - inner_side]
            if c1 is None or isinstance(x, Constant):
                continue
            with np.errstate(all="ignore"):
                c = c1 * c2 if op.kind == "Mul" else c1 + c2
            c = c.astype(op.dtype.numpy)
            if not np.all(np.isfinite(c)):
                continue
            if op.kind == "Mul" and np.any((c == 0) & (np.broadcast_to(c1, c.shape) != 0)
                                           & (np.broadcast_to(c2, c.shape) != 0)):
                continue
            folded = Constant(f"{op.name}_c", tuple(c.shape), op.dtype, np.ascontiguousarray(c))
            return Match(binary(op.kind, x, folded), (inner,))
    return None


def distribute(op: Op, ctx: Context) -> Match | None:
    """a*b + a*c -> a*(b+c) (3 passes -> 2), where ``a`` is one constant with finite values."""
    if op.kind != "Add":
        return None
    left, right = op.inputs
    if not (isinstance(left, Op) and isinstance(right, Op) and left.kind == right.kind == "Mul"):
        return None
    for a in left.inputs:
        if not any(a is v for v in right.inputs):
            continue
        value = _constant_value(a)
        if value is None or not np.all(np.isfinite(value)):
            return None  # a = Inf: a*0 + a*1 is NaN, a*(0+1) is Inf
        b = left.inputs[1] if left.inputs[0] is a else left.inputs[0]
        c = right.inputs[1] if right.inputs[0] is a else right.inputs[0]
        new = binary("Mul", a, binary("Add", b, c))
        return Match(new, (left, right)) if new.shape == op.shape else None
    return None


RULES: dict[str, Rule] = {
    "identity": identity, "noop_reshape": noop_reshape, "reshape_chain": reshape_chain,
    "transpose_chain": transpose_chain, "neutral": neutral, "double_negation": double_negation,
    "idempotent": idempotent, "constant_fold": constant_fold, "fold_bn": fold_bn,
    "associate_constants": associate_constants, "distribute": distribute,
}


class SimplifyError(KernelgenError, ValueError):
    """A rule broke its contract (a replacement of another shape or dtype); names both."""


# a graph pass: the graph rewritten, and per rewrite the operators it joined and their FLOPs
# (unchanged by it)
GraphPass = Callable[[Graph], tuple[Graph, list[tuple[str, int]]]]
PASSES: dict[str, GraphPass] = {"merge_projections": merge_projections}


def simplify(graph: Graph, rules: Mapping[str, Rule] | None = None,
             max_rounds: int = 32, passes: Mapping[str, GraphPass] | None = None
             ) -> Simplified:
    """``graph`` rewritten by ``rules`` (default ``RULES``) until none applies, each rewrite
    kept only if FLOPs do not grow; then by ``passes`` (default: ``PASSES`` with the default
    rules, none with rules given), and by the rules again where a pass changed the graph."""
    table = dict(RULES if rules is None else rules)
    graph_passes = dict((PASSES if rules is None else {}) if passes is None else passes)
    applied: list[Applied] = []
    rounds = 0

    def fixpoint(graph: Graph) -> Graph:  # rounds of the rules until none applies
        nonlocal rounds
        while rounds < max_rounds:
            rounds += 1
            graph, kept = _round(graph, table)
            applied.extend(kept)
            if not kept:
                break
        return graph
    graph = fixpoint(graph)
    changed = False
    for name, graph_pass in graph_passes.items():
        graph, done = graph_pass(graph)
        applied.extend(Applied(name, joined, flops, flops) for joined, flops in done)
        changed = changed or bool(done)
    if changed:
        graph = fixpoint(graph)
    return Simplified(graph, tuple(applied), rounds)


def _round(graph: Graph, rules: dict[str, Rule]) -> tuple[Graph, list[Applied]]:
    ctx = Context(graph)
    swap: dict[int, Value] = {}
    known = {id(v) for v in (*graph.ops, *graph.inputs, *graph.constants)}
    flops: dict[int, int] = {}
    names = {v.name for v in (*graph.ops, *graph.inputs, *graph.constants)}
    kept: list[Applied] = []
    for op in graph.ops:
        inputs = tuple(swap.get(id(v), v) for v in op.inputs)
        current = op if inputs == op.inputs else replace(op, inputs=inputs)
        ctx.origin[id(current)] = op
        known.add(id(current))
        swap[id(op)] = current
        for name, rule in rules.items():
            match = rule(current, ctx)
            if match is None:
                continue
            new = match.value
            if new.shape != op.shape or new.dtype != op.dtype:
                raise SimplifyError(f"rule '{name}' replaced '{op.name}' ({op.kind}, "
                                    f"{op.dtype}{list(op.shape)}) by '{new.name}' "
                                    f"({new.dtype}{list(new.shape)})")
            created = _created(new, known)
            before = _flops(current, flops) + sum(_flops(m, flops) for m in match.matched
                                                  if ctx.exclusive(m))
            after = sum(_flops(o, flops) for o in created if isinstance(o, Op))
            if after > before:
                continue
            for k, v in enumerate(created):
                v.name = fresh_name(f"{op.name}/{name}" + (f"{k}" if k else ""), names)
                known.add(id(v))
            swap[id(op)] = new
            kept.append(Applied(name, op.name, before, after))
            break
    outputs = {key: swap.get(id(v), v) for key, v in graph.outputs.items()}
    if not kept:
        return graph, kept
    return Graph.build(graph.inputs, outputs, graph.name), kept


def _created(value: Value, known: set[int]) -> list[Value]:
    """The operators and constants a rule built (reachable from ``value``, not yet known)."""
    found: dict[int, Value] = {}
    stack = [value]
    while stack:
        v = stack.pop()
        if id(v) in known or id(v) in found:
            continue
        found[id(v)] = v
        if isinstance(v, Op):
            stack.extend(v.inputs)
    return list(found.values())


def _flops(op: Op, cache: dict[int, int]) -> int:
    if id(op) not in cache:
        cache[id(op)] = lower(fuse(op)).flops()
    return cache[id(op)]
