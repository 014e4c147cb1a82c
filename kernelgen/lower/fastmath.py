"""kernelgen's float32 math library, written once in the IR: float32 (and float16, which computes
in float32) calls of exp, expm1, log, log1p, tanh and erf expanded into trees of primitives
every backend prints as vector code (add, mul, div, select, compares, abs, and ``muladd``:
a multiply-add, one FMA where the target has a fast one) and three bit-level ones
(``exp2i``, ``logb``, ``significand``); float64 calls keep the library's. A ``pow`` whose
exponent is a constant is strength-reduced where the result is the same on every input
(``reduce_pow``).

Each expansion returns exactly what NumPy does for ±0, ±Inf, NaN, subnormal inputs and results,
and at the overflow and underflow thresholds (the special cases are ``Select``s around the
polynomial), and is within a few float32 ulps elsewhere, with or without fused multiply-adds
(docs/fastmath.md has the measured errors over every float32 input, ``bench/math_accuracy.py``):

- exp: k = rint(x / ln2), r = x - k ln2 in two parts (Cody-Waite), exp(r) = 1 + r + r^2 Q(r),
  and 2^k applied as two ``exp2i`` factors so that results down to the subnormals and up to the
  overflow threshold are rounded once;
- expm1: the same reduction, 2^k (1 + expm1(r)) - 1 arranged as 2 (s expm1(r) - (1/2 - s)),
  s = 2^(k-1), exact for k = 0 (|x| <= ln2/2) and free of an intermediate 2^128;
- log: x = 2^e m with m in [sqrt(1/2), sqrt2) (subnormals scaled by 2^23 first), then fdlibm's
  logf: s = f / (2 + f), f = m - 1, log(m) = f - (f^2/2 - s (f^2/2 + R(s^2)));
- log1p: log of u = 1 + x plus the rounding error of u, (x - (u - 1)) / u;
- tanh: sign(x) E / (E + 2) with E = expm1(2|x|): no cancellation at any |x|;
- erf: x + x P(x^2) for |x| < ``ERF_SMALL``, then 1 - exp(h(|x| - c) - x^2) with h a fit of
  log(erfc(x)) + x^2, and ±1 from ``ERF_ONE``, where erf rounds to ±1 in float32.

The polynomial coefficients and the ln2 split are produced by ``tools/fastmath_fit.py``
(weighted minimax fits in float64, coefficients rounded to float32 one at a time).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..dtypes import DType
from ..ir.expr import Call, Const, Expr, call, const, rebuild, select, walk
from ..ir.loop import LoopKernel, Store

# --- produced by tools/fastmath_fit.py ---
LOG2E = 1.4426950216293335
LN2_HI = 0.693115234375
LN2_LO = 3.194618329871446e-05
SQRT2 = 1.4142135381698608
ERF_SMALL, ERF_ONE, ERF_CENTRE = 0.875, 3.92, 2.375
EXPM1_Q = (  # lowest degree first
    0.4999999701976776, 0.1666654497385025, 0.04166746512055397, 0.008366423659026623,
    0.0013868323294445872
)
LOG_P = (  # lowest degree first
    0.6666666269302368, 0.40000972151756287, 0.2849881649017334, 0.24277755618095398
)
ERF_P = (  # lowest degree first
    0.12837915122509003, -0.3761250674724579, 0.112819604575634, -0.026772042736411095,
    0.005001375917345285, -0.0006033660029061139
)
ERF_Q = (  # lowest degree first
    -1.5118340253829956, -0.36724910140037537, 0.060380905866622925, -0.011906948871910572,
    0.0027053740341216326, -0.00022818776778876781, 0.00020097073866054416
)
# --- end ---

# the functions this module expands; 'pow' (constant exponents) is listed with them
FUNCTIONS = frozenset({"exp", "expm1", "log", "log1p", "tanh", "erf"})
EXPANDABLE = FUNCTIONS | {"pow"}
_FLOAT32_COMPUTE = (DType.float32, DType.float16)

EXP_OVERFLOW = 88.8  # exp(88.8) overflows; above, x is clamped here (k = 128: 2^64 * 2^64)
EXP_UNDERFLOW = -104.0  # exp(x) rounds to 0 from here down (k = -150)
EXP_ZERO = -176.0  # k = -254 = -127 - 127: exp's two 2^k factors are +0 (``exp``)
EXPM1_MINUS_ONE = -80.0  # expm1(x) rounds to -1 from -17.4; clamped here, 2^(k-1) stays normal
TANH_ONE = 9.1  # tanh(x) rounds to 1 from 9.01; clamped here (2|x| <= 18.2: no overflow)
FLT_MIN = 2.0**-126  # the smallest normal float32
ROUNDER = 1.5 * 2.0**23  # t + ROUNDER - ROUNDER rounds t to an integer (|t| < 2^22)
SUBNORMAL_SCALE = 23.0  # a subnormal times 2^23 is normal


def expand(kernel: LoopKernel, functions: frozenset[str]) -> LoopKernel:
    """``kernel`` with the calls of ``functions`` (a subset of ``EXPANDABLE``) expanded in its
    stores, hoisted reductions and staged rows, each expansion's root recorded in ``origins``
    (the printers name the call it computes); ``kernel`` itself when it has none."""
    if not any(_expands(n, functions) for root in kernel.roots() for n in walk(root)):
        return kernel
    origins = dict(kernel.origins)
    go = _expander(functions, origins)
    return replace(kernel, stores=tuple(Store(st.buffer, go(st.value)) for st in kernel.stores),
                   hoisted=tuple(go(r) for r in kernel.hoisted),  # type: ignore[misc]
                   staged=tuple(replace(st, value=go(st.value)) for st in kernel.staged),
                   origins=origins)


def _expands(node: Expr, functions: frozenset[str]) -> bool:
    if not isinstance(node, Call) or node.fn not in functions:
        return False
    if node.fn == "pow":
        return isinstance(node.args[1], Const)
    return node.dtype in _FLOAT32_COMPUTE


def expand_expr(root: Expr, functions: frozenset[str]) -> Expr:
    """``root`` with the calls of ``functions`` expanded."""
    return _expander(functions, {})(root)


def _expander(functions: frozenset[str], origins: dict[Expr, tuple[str, tuple[Expr, ...]]]
              ) -> Callable[[Expr], Expr]:
    """A rewriter whose memo, shared by every root it is given, is keyed by value: a hoisted
    reduction and its equal copy in a store (``merge_axes`` rewrites them apart) come out as one
    object, which the printers then find by identity (an expansion's NaN constant would make
    two equal copies compare unequal). Each expansion's root goes into ``origins``."""
    memo: dict[Expr, Expr] = {}

    def visit(node: Expr) -> Expr:
        hit = memo.get(node)
        if hit is not None:
            return hit
        kids = [visit(c) for c in node.children()]
        out = None
        if _expands(node, functions):  # float64 keeps the library's functions
            assert isinstance(node, Call)
            out = reduce_pow(*kids) if node.fn == "pow" else EXPANSIONS[node.fn](kids[0])
            if out is not None and not isinstance(out, Const) and out not in kids:
                origins[out] = (node.fn, tuple(kids))
        memo[node] = out if out is not None else rebuild(node, kids)
        return memo[node]

    return visit


# --- small builders: the expansions read like the formulas -----------------------------------

def _k(value: float, like: Expr) -> Expr:
    return const(float(value), like.dtype)


def _add(a: Expr, b: Expr) -> Expr:
    return call("add", a, b)


def _sub(a: Expr, b: Expr) -> Expr:
    return call("sub", a, b)


def _mul(a: Expr, b: Expr) -> Expr:
    return call("mul", a, b)


def _div(a: Expr, b: Expr) -> Expr:
    return call("div", a, b)


def _muladd(a: Expr, b: Expr, c: Expr) -> Expr:
    """a b + c, one FMA where the target has a fast one (a CPU without it multiplies and
    adds: fma() would be a slow software routine there); the error bounds hold either way."""
    return call("muladd", a, b, c)


def _horner(coeffs: Sequence[float], x: Expr) -> Expr:
    """c0 + x (c1 + x (c2 + ...)), a multiply-add a step."""
    acc = _k(coeffs[-1], x)
    for c in reversed(coeffs[:-1]):
        acc = _muladd(acc, x, _k(c, x))
    return acc


def _clamp_above(x: Expr, hi: float) -> Expr:
    """min(x, hi) with NaN kept (a compare and a select, cheaper than NaN-propagating min)."""
    return select(call("gt", x, _k(hi, x)), _k(hi, x), x)


def _clamp_below(x: Expr, lo: float) -> Expr:
    return select(call("lt", x, _k(lo, x)), _k(lo, x), x)


def _zero_kept(x: Expr, value: Expr) -> Expr:
    """``value``, or x itself where x is ±0 (the formulas lose the sign of -0)."""
    return select(call("eq", x, _k(0.0, x)), x, value)


# --- exp and expm1 ---------------------------------------------------------------------------

def _round_product(t: Expr, c: float) -> Expr:
    """t c rounded to an integer (ties to even) for |t c| < 2^22: adding 1.5 * 2^23 leaves no
    fraction bits. A multiply-add and a subtraction, where a library's rint may be a long
    software routine (PoCL's was: exp ran at a third of the speed it runs at with this)."""
    return _sub(_muladd(t, _k(c, t), _k(ROUNDER, t)), _k(ROUNDER, t))


def _reduce_ln2(x: Expr) -> tuple[Expr, Expr]:
    """(k, r): x = k ln2 + r, k = rint(x / ln2) integral, |r| <= ln2/2. k * LN2_HI is exact
    (LN2_HI has 12 significant bits), so r loses only LN2_LO's rounding."""
    k = _round_product(x, LOG2E)
    r = _muladd(k, _k(-LN2_LO, x), _muladd(k, _k(-LN2_HI, x), x))
    return k, r


def _expm1_poly(r: Expr) -> Expr:
    """expm1(r) = r + r^2 Q(r) for |r| <= ln2/2."""
    return _muladd(_mul(r, r), _horner(EXPM1_Q, r), r)


def exp(x: Expr) -> Expr:
    """exp(x): (1 + expm1(r)) 2^k1 2^k2, k1 + k2 = k: each factor a normal float for k in
    [-150, 128], and the one rounding into the subnormals or to Inf comes last. x is clamped
    below at ``EXP_ZERO``, where both factors are exp2i(-127) = +0: exp(x) rounds to 0 from
    -104 down, and a product rounding there from below the normals costs a microcode assist a
    vector on Intel's CPUs, which a padding mask of -1e4 put in every row of a softmax (1536 rows
    of 128 with 7 masked ran 1.6x slower than unmasked; docs/benchmarks.md, "exp of a padding
    mask")."""
    xc = _clamp_below(_clamp_above(x, EXP_OVERFLOW), EXP_ZERO)
    k, r = _reduce_ln2(xc)
    y = _add(_k(1.0, x), _expm1_poly(r))
    k1 = _round_product(k, 0.5)  # k1, k - k1 in [-127, 64]
    return _mul(_mul(y, call("exp2i", k1)), call("exp2i", _sub(k, k1)))


def _exp_normal(x: Expr) -> Expr:
    """exp(x) for x whose exp is a normal float (erf's middle range): one 2^k factor."""
    k, r = _reduce_ln2(x)
    return _mul(_add(_k(1.0, x), _expm1_poly(r)), call("exp2i", k))


def _expm1_core(x: Expr) -> Expr:
    """expm1(x) for x in [-86, 88.8] (no ±0 sign): 2^k expm1(r) + 2^k - 1 as
    2 (s expm1(r) - (1/2 - s)) with s = 2^(k-1), which stays below 2^128 and is exactly
    expm1(r) for k = 0."""
    k, r = _reduce_ln2(x)
    s = call("exp2i", _sub(k, _k(1.0, x)))
    inner = _muladd(s, _expm1_poly(r), _sub(s, _k(0.5, x)))
    return _mul(_k(2.0, x), inner)


def expm1(x: Expr) -> Expr:
    xc = _clamp_below(_clamp_above(x, EXP_OVERFLOW), EXPM1_MINUS_ONE)
    return _zero_kept(x, _expm1_core(xc))


# --- log and log1p ---------------------------------------------------------------------------

def _log_reduce(u: Expr) -> tuple[Expr, Expr]:
    """(e, f): u = 2^e (1 + f) for a positive normal u, 1 + f in [sqrt(1/2), sqrt2) (f exact)."""
    m: Expr = call("significand", u)
    e: Expr = call("logb", u)
    big = call("gt", m, _k(SQRT2, u))
    m = select(big, _mul(m, _k(0.5, u)), m)
    e = select(big, _add(e, _k(1.0, u)), e)
    return e, _sub(m, _k(1.0, u))


def _log_core(e: Expr, f: Expr, low: Expr | None = None) -> Expr:
    """e ln2 + log1p(f) (fdlibm's logf), plus a small ``low`` term (log1p's correction)."""
    s = _div(f, _add(_k(2.0, f), f))
    z = _mul(s, s)
    hfsq = _mul(_mul(_k(0.5, f), f), f)
    tail = _mul(s, _muladd(z, _horner(LOG_P, z), hfsq))
    lo = _mul(e, _k(LN2_LO, f)) if low is None else _muladd(e, _k(LN2_LO, f), low)
    return _sub(_mul(e, _k(LN2_HI, f)), _sub(_sub(hfsq, _add(tail, lo)), f))


def _log_specials(u: Expr, value: Expr) -> Expr:
    """``value`` for a positive finite u; +Inf, NaN, -Inf for 0 and NaN for negatives."""
    finite = select(call("lt", u, _k(float("inf"), u)), value, u)  # +Inf and NaN: u itself
    zero_or_less = select(call("eq", u, _k(0.0, u)), _k(float("-inf"), u), _k(float("nan"), u))
    return select(call("gt", u, _k(0.0, u)), finite, zero_or_less)


def log(x: Expr) -> Expr:
    tiny = call("lt", x, _k(FLT_MIN, x))  # subnormal (zero and negatives: the specials)
    xs = select(tiny, _mul(x, _k(2.0**SUBNORMAL_SCALE, x)), x)
    e, f = _log_reduce(xs)
    e = select(tiny, _sub(e, _k(SUBNORMAL_SCALE, x)), e)
    return _log_specials(x, _log_core(e, f))


def log1p(x: Expr) -> Expr:
    """log(u) + (x - (u - 1)) / u for u = 1 + x: u's rounding error restored (u is never
    subnormal: at least 2^-24 or exactly 0)."""
    u = _add(_k(1.0, x), x)
    e, f = _log_reduce(u)
    correction = _div(_sub(x, _sub(u, _k(1.0, x))), u)
    return _zero_kept(x, _log_specials(u, _log_core(e, f, correction)))


# --- tanh and erf ----------------------------------------------------------------------------

def _signed(x: Expr, magnitude: Expr) -> Expr:
    """``magnitude`` with the sign of x (x < 0: negated)."""
    return select(call("lt", x, _k(0.0, x)), call("neg", magnitude), magnitude)


def tanh(x: Expr) -> Expr:
    a = _clamp_above(call("abs", x), TANH_ONE)
    big = _expm1_core(_mul(_k(2.0, x), a))
    return _zero_kept(x, _signed(x, _div(big, _add(big, _k(2.0, x)))))


def erf(x: Expr) -> Expr:
    a = call("abs", x)
    t = _mul(x, x)
    small = _muladd(x, _horner(ERF_P, t), x)
    q = _sub(_horner(ERF_Q, _sub(a, _k(ERF_CENTRE, x))), t)
    middle = _sub(_k(1.0, x), _exp_normal(q))
    middle = select(call("gt", a, _k(ERF_ONE, x)), _k(1.0, x), middle)
    return select(call("lt", a, _k(ERF_SMALL, x)), small, _signed(x, middle))


EXPANSIONS: dict[str, Callable[[Expr], Expr]] = {
    "exp": exp, "expm1": expm1, "log": log, "log1p": log1p, "tanh": tanh, "erf": erf}


# --- pow with a constant exponent ------------------------------------------------------------

def reduce_pow(base: Expr, exponent: Expr) -> Expr | None:
    """pow(base, c) for a constant c as multiplies, a division or square roots, where the
    result equals pow's on every input (±0, ±Inf, NaN and negatives included) up to rounding;
    None where no such form is known (c = -2: 1/(x*x) overflows to 0 where pow gives a
    subnormal). sqrt(-0) is -0 and sqrt(-Inf) NaN where pow gives +0 and +Inf: ``abs`` and a
    select put those right."""
    if not isinstance(exponent, Const):
        return None
    c, x = float(exponent.value), base
    if c == 0:
        return _k(1.0, x)  # pow(NaN, 0) is 1 too
    if c == 1:
        return x
    if c == 2:
        return _mul(x, x)
    if c == 3:
        return _mul(_mul(x, x), x)
    if c == -1:
        return _div(_k(1.0, x), x)
    minus_inf = call("eq", x, _k(float("-inf"), x))
    root = call("abs", call("sqrt", x))
    if c == 0.5:
        return select(minus_inf, _k(float("inf"), x), root)
    if c == -0.5:
        return select(minus_inf, _k(0.0, x), _div(_k(1.0, x), root))
    # LRN's beta (0.75 in AlexNet and GoogLeNet): a library pow costs 15x the whole LRN kernel
    # on PoCL; square roots never overflow or underflow on the way (within 2 ulps, 3 for 0.75,
    # which rounds three times: 2.1 measured)
    if c == 0.25:
        return select(minus_inf, _k(float("inf"), x), call("sqrt", root))
    if c == 0.75:
        return select(minus_inf, _k(float("inf"), x), _mul(root, call("sqrt", root)))
    if c == 1.5:  # |x| so that pow(-0, 1.5) is +0; negatives stay NaN through the root
        return select(minus_inf, _k(float("inf"), x), _mul(call("abs", x), root))
    return None
