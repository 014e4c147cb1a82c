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
  empirical condition number (two more trials, mirrored, perturb every rounded intermediate
  instead and move subnormal ones a step, as a kernel rounds them: a row that stays constant
  under any input perturbation cancels exactly in the shadow but not in float32): it is large
  exactly where a sum or a contraction cancels huge terms (1e30 - 1e30 + 1), where an exp or a
  softmax amplifies a rounding, near a floor or a compare. A finite value passes when
  ``|got - hi| <= rtol |hi| + atol + K spread``, or the same with ONNX's ``want`` for ``hi``
  (a kernel that rounds as the definition does at the block's dtype: Gelu's 1 + erf(x) cancels
  in float32's far tail, and the reciprocal of a Gelu there was 36 % off the shadow in the
  kernels and in ONNX's reference alike). Where a perturbation changes a value's class (finite
  to Inf or NaN), the position is ill-conditioned and is not judged at all. One more trial
  makes a ReduceProd NaN where its value at the block's dtype depends on the order of the
  factors (tiny ones underflow to 0 together, huge ones overflow to Inf: 0 * Inf), so those
  positions are not judged either. Nor are the positions of a Conv, MatMul or Gemm where a
  product of two finite factors overflows the block's dtype: -1e30 * 1e30 rounds to -Inf in
  float32, so beside an Inf term the sum is NaN, while a fused multiply-add that never rounds
  the product keeps the Inf. Nor are sin, cos and tan of arguments that one rounding at the
  compute precision moves by over 0.01 rad, nor Floor, Ceil, Round and Sign of values within
  the judge's tolerance of a step (an integer, a half-integer, 0): there a rounding upstream
  becomes a whole unit.
- Where ``want`` is special but the shadow is finite (a float32 overflow in the reference's own
  formula, e.g. softplus(1e30) = log(exp(1e30) + 1) = inf, which kernelgen computes stably),
  a kernel value close to the shadow's also passes; where both are special, the shadow's
  special value passes too (a float16 overflow of the reference's intermediate: NaN for Inf).
- Where the reference overflows *inside* an operator at the block's dtype and the result is
  still finite (a float32 LayerNorm of a row holding 1e30: the variance is Inf, every output
  its bias), the shadow is no longer what arithmetic at that dtype can give; ONNX computes
  these in the input's dtype (LayerNormalization's default ``stash_type``), and so do the
  kernels, whose values pass by being close to the ONNX reference. Such sinks, the ones
  downstream of an operator that raised an overflow in the reference, are marked
  (``Case.range_limited``) for the next rule.
- In those sinks the reference's NaN may also be inf - inf where one infinity is its own
  overflow (a float16 partial sum, a float64 product beyond 1.8e308); a kernel that rounds later
  (float32 intermediates, a fused multiply-add) keeps the other infinity, which passes.
- Integer and bool outputs must be equal.
- Where ONNX's reference evaluator is itself wrong, ``evaluate_chain`` below replaces it for
  that operator by a direct NumPy formula (``_FIXED``; each entry says why).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from generate import FLOAT, Block, build
from reference import reference

import kernelgen as kg

# dtype -> (rtol, atol, u: the relative perturbation of the shadow's inputs)
TOL = {"float32": (1e-4, 1e-6, 2.0**-20), "float16": (4e-3, 1e-3, 2.0**-11),
       "float64": (1e-9, 1e-12, 2.0**-46)}
K, TRIALS = 8.0, 3
# operators whose outputs are input values moved, chosen or sign-flipped, never rounded: the
# jitter trials leave them exact (a jittered Expand of 1e30 would make copies differ by 1e24)
EXACT = frozenset({"Expand", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
                   "Concat", "Slice", "Gather", "Pad", "DepthToSpace", "SpaceToDepth", "Where",
                   "Relu", "Neg", "Abs", "Max", "Min", "Clip", "MaxPool", "ReduceMax",
                   "ReduceMin", "Floor", "Ceil", "Round", "Sign"})


def _conv_direct(op: kg.Op, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
                 largest: bool = False) -> np.ndarray:
    """ONNX Conv tap by tap over the zero-padded input. ONNX's reference (onnx 1.23) dilates
    the kernel by writing zeros between its taps, so a NaN or Inf input under such a hole
    (a position the dilated window skips) gives 0 * NaN = NaN where Conv never reads it.
    With ``largest``, each output's largest product instead of their sum."""
    nd, m, out = x.ndim - 2, op.shape[1], op.shape[2:]
    pads, strides, dil = op.attrs["pads"], op.attrs["strides"], op.attrs["dilations"]
    group = op.attrs["group"]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[a], pads[a + nd]) for a in range(nd)])
    cg, mg = w.shape[1], m // group
    y = np.zeros(op.shape, x.dtype)
    for tap in np.ndindex(*w.shape[2:]):
        view = xp[(slice(None), slice(None), *(slice(k * d, k * d + s * (o - 1) + 1, s)
                                               for k, d, s, o in zip(tap, dil, strides, out)))]
        for g in range(group):
            xs = view[:, None, g * cg:(g + 1) * cg]  # (n, 1, cg, *out)
            ws = w[(slice(g * mg, (g + 1) * mg), slice(None), *tap)]  # (mg, cg)
            # a plain product and sum (no BLAS, which may skip zero factors: 0 * Inf must be NaN)
            terms = xs * ws.reshape(1, mg, cg, *[1] * nd)
            if largest:
                y[:, g * mg:(g + 1) * mg] = np.maximum(y[:, g * mg:(g + 1) * mg],
                                                       terms.max(axis=2))
            else:
                y[:, g * mg:(g + 1) * mg] += terms.sum(axis=2)
    return y if b is None else y + b.reshape(1, m, *[1] * nd)


def _log_softmax(op: kg.Op, x: np.ndarray) -> np.ndarray:
    """x - max - log(sum(exp(x - max))). ONNX's reference computes log(Softmax(x)), which
    underflows to -inf once x - max is below about -745 (float64; -104 in float32): in a row
    (0, -1e30) the answer is -1e30, not -inf."""
    if x.size == 0:
        return x.copy()
    shifted = x - x.max(axis=op.attrs["axis"], keepdims=True)
    total = np.exp(shifted).sum(axis=op.attrs["axis"], keepdims=True)
    return (shifted - np.log(total)).astype(x.dtype)


def _prelu(op: kg.Op, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """ONNX's definition, ``x if x >= 0 else slope * x``. Its reference computes
    ``x if x > 0 else slope * x``, so at x = 0 an infinite or NaN slope gives 0 * Inf = NaN."""
    return np.where(x < 0, x * slope, x).astype(x.dtype)


def _erf(op: kg.Op, x: np.ndarray) -> np.ndarray:
    """erf in the input's dtype. ONNX's reference computes it with ``otypes=["f"]``: float32
    results, also for float64 inputs."""
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()


def _gelu(op: kg.Op, x: np.ndarray) -> np.ndarray:
    """ONNX's Gelu in the input's dtype. ONNX's reference expands the function body, whose Erf
    computes in float32 (``_erf``), so float64 results are off by about 1e-7 relative; the
    perturbed shadows usually hide that in their spread, but not where the float32 erf of every
    perturbed input rounds alike (a case of the long fuzz run)."""
    with np.errstate(invalid="ignore", over="ignore"):
        if op.attrs.get("approximate", "none") == "tanh":
            inner = np.sqrt(2 / np.pi) * (x + 0.044715 * x * x * x)
            return (0.5 * x * (1 + np.tanh(inner))).astype(x.dtype)
        return (0.5 * x * (1 + _erf(op, x * x.dtype.type(1 / math.sqrt(2))))).astype(x.dtype)


def _hard_swish(op: kg.Op, x: np.ndarray) -> np.ndarray:
    """x * max(0, min(1, x / 6 + 1/2)) in the input's dtype. ONNX's reference expands the
    function body, HardSigmoid with the float32 attribute alpha = 1/6, so float64 results are off
    by about 1e-8 relative."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (x * np.clip(x * x.dtype.type(1 / 6) + x.dtype.type(0.5), 0, 1)).astype(x.dtype)


def _reduce_log_sum_exp(op: kg.Op, x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) in float64, shifted by the finite part of the max: a row holding +Inf
    is +Inf, an all -Inf row -Inf (ONNX's reference gives NaN there: -inf - -inf)."""
    axes = tuple(op.attrs.get("axes") or range(x.ndim))
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        top = x64.max(axis=axes, keepdims=True)
        shift = np.where(np.isinf(top), 0.0, top)
        out = shift + np.log(np.exp(x64 - shift).sum(axis=axes, keepdims=True))
    if not op.attrs.get("keepdims", 1):
        out = out.squeeze(axis=axes)
    return out.astype(x.dtype)


def _pool_direct(op: kg.Op, x: np.ndarray) -> np.ndarray:
    """ONNX MaxPool / AveragePool window by window. The output size is ONNX's formula, where
    with ``ceil_mode`` a last window that would start in the end padding is dropped (as
    onnxruntime and PyTorch do); ONNX's reference evaluator gives one window fewer there
    (length 9, kernel 2, pads (1, 1), stride 1: 9 windows, onnxruntime 10). A window holding a
    NaN is NaN (as ReduceMax and NumPy; docs/calling.md); the reference pads with NaN and
    pools with nanmax/nanmean, so it skips NaN inputs too."""
    nd = x.ndim - 2
    k, s, d = op.attrs["kernel_shape"], op.attrs["strides"], op.attrs["dilations"]
    begin, end = op.attrs["pads"][:nd], op.attrs["pads"][nd:]
    ceil, sizes = op.attrs["ceil_mode"], x.shape[2:]
    out = []
    for a in range(nd):
        span = sizes[a] + begin[a] + end[a] - d[a] * (k[a] - 1) - 1
        n_out = (-(-span // s[a]) if ceil else span // s[a]) + 1
        if ceil and (n_out - 1) * s[a] >= sizes[a] + begin[a]:
            n_out -= 1
        out.append(n_out)
    y = np.empty(x.shape[:2] + tuple(out), x.dtype)
    for pos in np.ndindex(*out):
        taps = [[p * s[a] - begin[a] + t * d[a] for t in range(k[a])] for a, p in enumerate(pos)]
        inside = [[i for i in t if 0 <= i < sizes[a]] for a, t in enumerate(taps)]
        window = x[(slice(None), slice(None), *np.ix_(*inside))].reshape(*x.shape[:2], -1)
        where = (slice(None), slice(None), *pos)
        if op.kind == "MaxPool":
            y[where] = window.max(axis=-1) if window.shape[-1] else -np.inf
        else:
            padded = [[i for i in t if -begin[a] <= i < sizes[a] + end[a]]
                      for a, t in enumerate(taps)]
            count = math.prod(map(len, padded if op.attrs["count_include_pad"] else inside))
            y[where] = window.astype(np.float64).sum(axis=-1) / count
    return y


def _matmul_direct(op: kg.Op, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX MatMul as a plain product and sum where an operand holds NaN or Inf. ONNX's
    reference calls ``np.matmul``, whose BLAS kernels may skip a zero factor: a row holding
    Inf times a column holding -0.0 gave 0.0 where IEEE arithmetic (and kernelgen) gives NaN."""
    if np.isfinite(a).all() and np.isfinite(b).all():
        return reference(op, a, b)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    y = (a2[..., :, :, None] * b2[..., None, :, :]).sum(axis=-2)
    if a.ndim == 1:
        y = y[..., 0, :]
    if b.ndim == 1:
        y = y[..., 0]
    return y.astype(np.result_type(a, b))


# operator kind -> (applies to this operator?, the formula used instead of ONNX's reference)
_FIXED: dict[str, tuple[Any, Any]] = {
    "Conv": (lambda op: any(d != 1 for d in op.attrs["dilations"]), _conv_direct),
    "LogSoftmax": (lambda op: True, _log_softmax),
    "PRelu": (lambda op: True, _prelu),
    "Erf": (lambda op: True, _erf),
    "Gelu": (lambda op: True, _gelu),
    "HardSwish": (lambda op: True, _hard_swish),
    "ReduceLogSumExp": (lambda op: True, _reduce_log_sum_exp),
    "MaxPool": (lambda op: True, _pool_direct),
    "MatMul": (lambda op: True, _matmul_direct),
    "AveragePool": (lambda op: True, _pool_direct),
}


def _argument_too_large(x: np.ndarray, dtype: str) -> np.ndarray:
    """Where sin, cos or tan of ``x`` has no meaningful value at the precision a kernel computes
    in (float32 for float16 and float32 blocks): one rounding of the argument moves it by more
    than 0.01 rad (|x| above 1.7e5 in float32; sin(1.05e14) was 0.84 in float32 and -0.94
    exactly, and three perturbed shadows happened to stay close)."""
    unit = 2.0 ** -53 if dtype == "float64" else 2.0 ** -24
    with np.errstate(invalid="ignore"):
        return np.abs(x.astype(np.float64)) * unit > 1e-2


def _near_a_step(op: kg.Op, x: np.ndarray, dtype: str) -> np.ndarray:
    """Where Floor, Ceil, Round or Sign of ``x`` may land on either side of a step at
    ``dtype``: ``x`` is within the judge's own tolerance (``TOL``) of an integer (Floor,
    Ceil), of a half-integer (Round) or of 0 (Sign). A rounding upstream turns into a whole
    unit there: a ReduceProd of small factors underflows to 0 in float32, where the float64
    shadow keeps 1e-48, and ceil makes 0 of one and 1 of the other."""
    rtol, atol, _ = TOL[dtype]
    a = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        if op.kind == "Sign":
            gap = np.abs(a)
        elif op.kind == "Round":
            gap = np.abs(a - np.floor(a) - 0.5)
        else:
            gap = np.abs(a - np.round(a))
        return gap <= rtol * np.abs(a) + atol


def _largest_product(op: kg.Op, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The largest magnitude of a product of two finite factors summed into each output of a
    Conv, MatMul or Gemm (alpha included), in float64."""
    def finite(a: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(a), np.abs(a.astype(np.float64)), 0.0)

    x, w = finite(x), finite(w)
    if op.kind == "Conv":
        return _conv_direct(op, x, w, largest=True)
    if op.kind == "Gemm":
        x = x.T if op.attrs.get("transA") else x
        w = w.T if op.attrs.get("transB") else w
        return abs(op.attrs.get("alpha", 1.0)) * (x[:, :, None] * w[None, :, :]).max(axis=1)
    a2 = x[None, :] if x.ndim == 1 else x
    b2 = w[:, None] if w.ndim == 1 else w
    y = (a2[..., :, :, None] * b2[..., None, :, :]).max(axis=-2)
    if x.ndim == 1:
        y = y[..., 0, :]
    return y[..., 0] if w.ndim == 1 else y


def _order_dependent_prod(op: kg.Op, x: np.ndarray, dtype: str) -> np.ndarray:
    """Where a ReduceProd at ``dtype`` may give NaN, +-Inf or 0 depending on the order of its
    multiplications: the row's small factors can underflow to 0 together and its large ones
    overflow to Inf together (0 * Inf = NaN), and no factor is exactly 0 (then every order
    agrees). Tiny and huge values in one row (1e-40, 1e-40, Inf) make this."""
    axes = tuple(op.attrs.get("axes") or range(x.ndim))
    keep = bool(op.attrs.get("keepdims", 1))
    a = np.abs(x.astype(np.float64))
    info = np.finfo(dtype)
    with np.errstate(all="ignore"):
        small = np.where(a < 1, a, 1.0).prod(axis=axes, keepdims=keep)
        large = np.where(a > 1, a, 1.0).prod(axis=axes, keepdims=keep)
    zero = (a == 0).any(axis=axes, keepdims=keep)
    return (small < float(info.smallest_subnormal) / 2) & (large > float(info.max)) & ~zero


def evaluate_chain(ops: list[kg.Op], feeds: dict[str, np.ndarray],
                   overflowed: set[str] | None = None, order_nan: str | None = None,
                   jitter: tuple[float, int, str] | None = None) -> dict[str, np.ndarray]:
    """``reference.evaluate_chain`` with the ``_FIXED`` operators computed directly; the names
    of the operators whose evaluation overflowed, and of those reading them, go in
    ``overflowed``. ``order_nan`` (a dtype): a ReduceProd is NaN where its value at that dtype
    depends on the order of the multiplications. ``jitter`` (u, seed, the block's dtype):
    every float operator's output but the ``EXACT`` ones times 1 + u r, r uniform in [-1, 1]
    drawn from ``seed`` (a negative u mirrors the same draws), and a subnormal one moved a step
    of the dtype's smallest subnormal up or down with r: a kernel rounds its intermediates,
    relatively and, below the normal range, in steps of that size."""
    values = dict(feeds)
    rng = np.random.default_rng(jitter[1]) if jitter else None
    for op in ops:
        args = [values[v.name] for v in op.inputs]
        fixed = _FIXED.get(op.kind)
        fn = fixed[1] if fixed and fixed[0](op) else lambda op, *a: reference(op, *a)
        if overflowed is None:
            values[op.name] = fn(op, *args)
            out = np.asarray(values[op.name])
            if jitter and rng is not None and out.dtype.kind == "f" and op.kind not in EXACT:
                u, _, dtype = jitter
                r = u * rng.uniform(-1, 1, out.shape)
                info = np.finfo(dtype)
                subnormal = (out != 0) & (np.abs(out) < info.tiny)
                values[op.name] = out * (1 + r) + np.where(
                    subnormal, np.sign(r) * float(info.smallest_subnormal), 0.0)
            if order_nan and op.kind == "ReduceProd":
                values[op.name] = np.where(_order_dependent_prod(op, args[0], order_nan),
                                           np.nan, values[op.name])
            if order_nan and op.kind in ("Sin", "Cos", "Tan"):
                values[op.name] = np.where(_argument_too_large(args[0], order_nan), np.nan,
                                           values[op.name])
            if order_nan and op.kind in ("Floor", "Ceil", "Round", "Sign"):
                values[op.name] = np.where(_near_a_step(op, args[0], order_nan), np.nan,
                                           values[op.name])
            if order_nan and op.kind in ("Conv", "MatMul", "Gemm"):
                largest = _largest_product(op, *args[:2])
                values[op.name] = np.where(largest > float(np.finfo(order_nan).max), np.nan,
                                           values[op.name])
            continue
        try:
            with np.errstate(over="raise"):
                values[op.name] = fn(op, *args)
            if any(v.name in overflowed for v in op.inputs):
                overflowed.add(op.name)
        except FloatingPointError:
            overflowed.add(op.name)
            with np.errstate(over="ignore"):
                values[op.name] = fn(op, *args)
    return values


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
    range_limited: set[int] = field(default_factory=set)  # sinks after a reference overflow

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
            overflowed: set[str] = set()
            values = evaluate_chain(ops, feeds, overflowed)
            case.want = {k: np.asarray(values[ops[k].name]) for k in sinks}
            case.range_limited = {k for k in sinks if ops[k].name in overflowed}
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
    trials = [evaluate_chain(wide, {n: a * (1 + u * rng.uniform(-1, 1, a.shape))
                                    if a.dtype.kind == "f" else a for n, a in f64.items()})
              for _ in range(TRIALS)]
    # a product whose value at the block's dtype depends on the order of its factors: the
    # positions it reaches change class in this trial, so they are not judged
    trials.append(evaluate_chain(wide, f64, order_nan=case.block.dtype))
    # intermediates rounded, in mirrored pairs: a LayerNorm of a row that is constant whatever
    # the inputs (a softmax over copies) has x - mean = 0 in the shadow and +-an ulp in a
    # kernel, and a power of it is a number or NaN by that sign: one of the pair is NaN
    trials += [evaluate_chain(wide, f64, jitter=(sign * u, 1, case.block.dtype))
               for sign in (1, -1)]
    for trial in trials:
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
        # or to ONNX's reference: the kernel rounds as the definition does at the block's
        # dtype (float32's 1 + erf(x) in Gelu's far tail, erf(4) == 1 before a huge power)
        close |= np.isfinite(w) & np.isfinite(spread) & np.isfinite(g) & (
            np.abs(g - w) <= rtol * np.abs(w) + atol + K * spread)
    same_special = (np.isnan(g) & np.isnan(w)) | (np.isinf(w) & (g == w))
    judged = np.isfinite(spread)  # a class change under perturbation: ill-conditioned
    special = ~np.isfinite(w)
    # the reference's own overflow at the block's dtype may turn the exact result's Inf into
    # NaN (float16 partial sums of +Inf and -Inf where float64 has one finite): a kernel that
    # keeps float32 intermediates and gives the shadow's special value is right
    like_shadow = (np.isnan(g) & np.isnan(hi)) | (np.isinf(hi) & (g == hi)) if case.hi \
        else np.zeros(g.shape, bool)
    # a finite exact result beyond the dtype's range rounds to Inf of its sign: right, even
    # where the reference's own intermediate overflow made NaN of it (float16 inf - inf)
    if case.hi:
        top = float(np.finfo(case.block.dtype).max) * (1 - rtol)
        with np.errstate(invalid="ignore"):
            like_shadow |= np.isfinite(hi) & (np.abs(hi) > top) & np.isinf(g) & \
                (np.sign(g) == np.sign(hi))
    # downstream of an overflow in the reference, its NaN may be inf - inf where one infinity
    # is that overflow; a kernel that rounds later (float32 intermediates of a float16 block,
    # a fused multiply-add whose product is not rounded) keeps the other infinity
    kept_inf = np.isnan(w) & np.isinf(g) if k in case.range_limited \
        else np.zeros(g.shape, bool)
    bad_special = special & judged & ~(same_special | close | like_shadow | kept_inf)
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
