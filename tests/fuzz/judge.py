"""Run a drawn block on a backend and judge it against ONNX's reference.

How values are judged (special values make a plain rtol useless):

- ``want``: ONNX's reference evaluator (``tests/reference.evaluate_chain``) run operator by
  operator at the block's dtype. It decides the *special* values: where it gives NaN or +-Inf,
  the kernel must give the same (NaN == NaN, infinities with their sign). The sign of a zero is
  not judged.
- ``hi``: the same block rebuilt with float64 inputs (a shadow), run by the same reference. It
  decides the *finite* values, so the kernel is not blamed for the float32 reference's rounding.
- ``spread``: the shadow again on inputs perturbed by a relative ``u`` (about the kernel's
  rounding unit), ``TRIALS`` times; the largest change at each position. A backward-stable
  kernel computes the exact result of inputs perturbed by a few rounding units, so this is an
  empirical condition number: it is large exactly where a sum or a contraction cancels huge
  terms (1e30 - 1e30 + 1), where an exp or a softmax amplifies a rounding, near a floor or a
  compare. A finite value passes when ``|got - hi| <= rtol |hi| + atol + K spread``. Where a
  perturbation changes a value's class (finite to Inf or NaN), the position is ill-conditioned
  and is not judged at all.
- Where ``want`` is special but the shadow is finite (a float32 overflow in the reference's own
  formula, e.g. softplus(1e30) = log(exp(1e30) + 1) = inf, which kernelgen computes stably),
  a kernel value close to the shadow's also passes.
- Integer and bool outputs must be equal.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from generate import FLOAT, Block, build
from reference import evaluate_chain

import kernelgen as kg

# dtype -> (rtol, atol, u: the relative perturbation of the shadow's inputs)
TOL = {"float32": (1e-4, 1e-6, 2.0**-20), "float16": (4e-3, 1e-3, 2.0**-11),
       "float64": (1e-9, 1e-12, 2.0**-46)}
K, TRIALS = 8.0, 3


class Unjudgeable(Exception):
    """The reference cannot evaluate this block (the example is discarded, not failed)."""


@dataclass
class Case:
    """A block ready to run: operators, fused groups, input arrays and the references."""
    block: Block
    ops: list[kg.Op]
    groups: list[kg.FusedOp]
    feeds: dict[str, np.ndarray]
    sinks: list[int]  # node indices whose values are judged
    want: dict[int, np.ndarray] = field(default_factory=dict)
    hi: dict[int, np.ndarray] = field(default_factory=dict)
    spread: dict[int, np.ndarray] = field(default_factory=dict)

    def flops(self) -> int:
        return sum(g.lower().flops() for g in self.groups)


def partition(ops: list[kg.Op], force: bool) -> list[kg.FusedOp]:
    """Consecutive groups of ``ops`` (topological order, so each group is convex), each as large
    as the fusion table allows (``force``: red edges too); a value read by a later group is an
    output of its own."""
    def fused(members: list[kg.Op]) -> kg.FusedOp:
        inside = {id(o) for o in members}
        later = [o for o in ops if id(o) not in inside]
        outs = [o for o in members if any(o in c.inputs for c in later)]
        return kg.fuse(*members, outputs=outs, force=force)

    groups: list[kg.FusedOp] = []
    current: list[kg.Op] = []
    for op in ops:
        try:
            fused(current + [op])
            current.append(op)
        except kg.FusionError:
            groups.append(fused(current))
            current = [op]
    return groups + [fused(current)]


def prepare(block: Block) -> Case:
    """Build the block, fuse it and compute the references."""
    ops = build(block)
    consumed = {id(i) for o in ops for i in o.inputs}
    sinks = [k for k, o in enumerate(ops) if id(o) not in consumed]
    feeds = {i.name: i.array() for i in block.inputs}
    case = Case(block, ops, partition(ops, block.force), feeds, sinks)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            values = evaluate_chain(ops, feeds)
            case.want = {k: np.asarray(values[ops[k].name]) for k in sinks}
            if block.dtype in FLOAT:
                _shadow(case)
        except Exception as exc:  # noqa: BLE001 - the reference's own limits
            raise Unjudgeable(f"reference: {type(exc).__name__}: {exc}") from exc
    return case


def _shadow(case: Case) -> None:
    wide = build(case.block, wide=True)
    u = TOL[case.block.dtype][2]
    f64 = {n: a.astype(np.float64) if a.dtype.kind == "f" else a for n, a in case.feeds.items()}
    hi = evaluate_chain(wide, f64)
    case.hi = {k: hi[wide[k].name] for k in case.sinks}
    case.spread = {k: np.zeros(case.hi[k].shape) for k in case.sinks}
    rng = np.random.default_rng(0)
    for _ in range(TRIALS):
        shaken = {n: a * (1 + u * rng.uniform(-1, 1, a.shape)) if a.dtype.kind == "f" else a
                  for n, a in f64.items()}
        trial = evaluate_chain(wide, shaken)
        for k in case.sinks:
            h, t, s = case.hi[k], trial[wide[k].name], case.spread[k]
            same = (np.isnan(h) & np.isnan(t)) | (np.isinf(h) & (h == t))
            both = np.isfinite(h) & np.isfinite(t)
            case.spread[k] = np.where(both, np.maximum(s, np.abs(t - h)),
                                      np.where(same, s, np.inf))


def run(case: Case, backend: str) -> dict[int, np.ndarray]:
    """The sinks' values from running the groups one after another on ``backend``; arrays are
    passed by argument name (``metadata['args']``, or the loop's buffers for the interpreter)."""
    values: dict[str, np.ndarray] = dict(case.feeds)
    for group in case.groups:
        if backend == "interp":
            loop = group.lower()
            ins, outs = [b.name for b in loop.inputs], [b.name for b in loop.outputs]
            got: Any = kg.interpret(loop, *(values[n] for n in ins))
        else:
            kernel = group.emit(backend, tuning="none")
            args = kernel.metadata["args"]
            ins = [a["name"] for a in args if a["role"] == "input"]
            outs = [a["name"] for a in args if a["role"] == "output"]
            got = kernel(*(values[n] for n in ins))
        got = got if isinstance(got, tuple) else (got,)
        values.update(zip(outs, (np.asarray(g) for g in got)))
    return {k: values[case.ops[k].name] for k in case.sinks}


def mismatches(case: Case, k: int, got: np.ndarray) -> np.ndarray:
    """A boolean mask of the positions of sink ``k`` where ``got`` is wrong."""
    want = case.want[k]
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape}, expected {want.shape}")
    if want.dtype.kind != "f":
        return got != want
    rtol, atol, _ = TOL[case.block.dtype]
    g, w = got.astype(np.float64), want.astype(np.float64)
    hi, spread = case.hi[k], case.spread[k]
    with np.errstate(all="ignore"):
        close = np.isfinite(hi) & np.isfinite(spread) & np.isfinite(g) & (
            np.abs(g - hi) <= rtol * np.abs(hi) + atol + K * spread)
    same_special = (np.isnan(g) & np.isnan(w)) | (np.isinf(w) & (g == w))
    judged = np.isfinite(spread)  # a class change under perturbation: ill-conditioned
    special = ~np.isfinite(w)
    bad_special = special & judged & ~(same_special | close)
    bad_finite = ~special & judged & np.isfinite(hi) & ~close
    return bad_special | bad_finite


def describe(case: Case, k: int, got: np.ndarray, bad: np.ndarray, limit: int = 4) -> str:
    where = np.argwhere(bad)
    lines = [f"v{k}: {len(where)} of {bad.size} values wrong"]
    for pos in where[:limit]:
        p = tuple(int(i) for i in pos)
        extra = f", float64 shadow {case.hi[k][p]!r} (spread {case.spread[k][p]:.3g})" \
            if case.hi else ""
        lines.append(f"  at {p}: got {got[p]!r}, ONNX reference {case.want[k][p]!r}{extra}")
    return "\n".join(lines)


@dataclass
class Problem:
    """What went wrong: ``kind`` ('crash:<exception>', 'shape', 'wrong:nan', 'wrong:inf',
    'wrong:finite') and the operator kind it is seen at (for grouping), and the details."""
    kind: str
    at: str
    text: str

    def signature(self, backend: str) -> str:
        return f"{backend}|{self.kind}|{self.at}"


def _wrong_kind(want: np.ndarray, bad: np.ndarray) -> str:
    w = want[bad]
    if w.dtype.kind == "f" and np.isnan(w).any():
        return "wrong:nan"
    return "wrong:inf" if w.dtype.kind == "f" and np.isinf(w).any() else "wrong:finite"


def check(case: Case, backend: str) -> Problem | None:
    """None when ``backend`` matches the references, else what went wrong."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = run(case, backend)
    except Exception as exc:  # noqa: BLE001 - any crash is a finding
        return Problem(f"crash:{type(exc).__name__}", "block", f"{type(exc).__name__}: {exc}")
    for k, got in results.items():
        at = case.block.nodes[k].fn
        try:
            bad = mismatches(case, k, got)
        except AssertionError as exc:
            return Problem("shape", at, f"v{k}: {exc}")
        if bad.any():
            return Problem(_wrong_kind(case.want[k], bad), at, describe(case, k, got, bad))
    return None
