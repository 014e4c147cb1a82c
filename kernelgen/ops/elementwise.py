"""Elementwise operators (One-to-One): every ONNX unary and binary op with a float meaning, plus
Where, Clip, Cast, the variadic Sum/Mean/Max/Min, and Dropout at inference (the identity).
Bodies are built from ``PRIMITIVES`` only, so every backend that implements the primitives runs
every operator."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..dtypes import FLOATS, NUMERIC, DType, as_dtype
from ..errors import AttributeError_, DtypeError
from ..ir.expr import Expr, call, cast, const, select
from ..ir.node import MathProperties, Op, Value
from .common import broadcast_read, broadcast_shape, check_value, make_op, require_dtype, same_dtype

E = Expr


def _c(x: E, v: float) -> E:
    return const(v, x.dtype)


def _primitive(fn: str) -> Callable[[E], E]:
    return lambda x: call(fn, x)


def _sigmoid(x: E) -> E:
    """1 / (1 + exp(-x)) from t = exp(-|x|) <= 1: 1 / (1 + t) for x >= 0, t / (1 + t) below,
    so that no exp overflows where the result is a small (even subnormal) positive number."""
    t = call("exp", call("neg", call("abs", x)))
    r = call("div", _c(x, 1), call("add", _c(x, 1), t))
    return select(call("ge", x, _c(x, 0)), r, call("mul", t, r))


MISH_IDENTITY = 20.0  # mish(x) = x in float32 from about 9 up; t^2 overflows from 44


def _softplus(x: E) -> E:  # log(1 + exp(x)) without overflow
    tail = call("log1p", call("exp", call("neg", call("abs", x))))
    return call("add", call("max", x, _c(x, 0)), tail)


def _mish(x: E) -> E:
    """x tanh(softplus(x)) with one exp and one division: tanh(log(1 + t)) = n / (n + 2) for
    t = exp(x), n = t (t + 2); x itself from ``MISH_IDENTITY`` up, where n / (n + 2) rounds to
    1 in float32 (and before t^2 overflows)."""
    t = call("exp", x)
    n = call("mul", t, call("add", t, _c(x, 2)))
    body = call("mul", x, call("div", n, call("add", n, _c(x, 2))))
    return select(call("gt", x, _c(x, MISH_IDENTITY)), x, body)


def _gelu(x: E, approximate: str = "none") -> E:
    if approximate == "tanh":
        inner = call("mul", _c(x, math.sqrt(2 / math.pi)),
                     call("add", x, call("mul", _c(x, 0.044715), call("mul", x, call("mul", x, x))))
                     )
        # 0.5 (1 + tanh(u)) = sigmoid(2u): no cancellation where tanh(u) nears -1
        return call("mul", x, _sigmoid(call("mul", _c(x, 2), inner)))
    if approximate != "none":
        raise AttributeError_("Gelu", "approximate", "'none' or 'tanh'", approximate)
    return call("mul", call("mul", _c(x, 0.5), x),
                call("add", _c(x, 1), call("erf", call("mul", x, _c(x, 1 / math.sqrt(2))))))


def _hard_sigmoid(x: E, alpha: float = 0.2, beta: float = 0.5) -> E:
    lin = call("add", call("mul", _c(x, alpha), x), _c(x, beta))
    return call("max", _c(x, 0), call("min", _c(x, 1), lin))


def _selu(x: E, alpha: float = 1.67326319217681884765625, gamma: float = 1.05070102214813232421875
          ) -> E:
    neg = call("mul", _c(x, gamma), call("mul", _c(x, alpha), call("expm1", x)))
    return select(call("le", x, _c(x, 0)), neg, call("mul", _c(x, gamma), x))


def _shrink(x: E, bias: float = 0.0, lambd: float = 0.5) -> E:
    return select(call("lt", x, _c(x, -lambd)), call("add", x, _c(x, bias)),
                  select(call("gt", x, _c(x, lambd)), call("sub", x, _c(x, bias)), _c(x, 0)))


def _is_inf(x: E, detect_negative: int = 1, detect_positive: int = 1) -> E:
    inf = call("isinf", x)
    if detect_negative and detect_positive:
        return inf
    sign = call("gt", x, _c(x, 0)) if detect_positive else call("lt", x, _c(x, 0))
    return call("and", inf, sign) if (detect_negative or detect_positive) else \
        call("and", inf, call("not", inf))


# kind -> (body builder, accepted dtypes). Builders take the input expression and attributes.
UNARY: dict[str, tuple[Callable[..., E], frozenset[DType]]] = {
    "Abs": (lambda x: call("abs", x), NUMERIC),
    "Neg": (lambda x: call("neg", x), NUMERIC),
    "Sign": (lambda x: call("sign", x), NUMERIC),
    "Identity": (lambda x: x, NUMERIC | {DType.bool}),
    "Reciprocal": (lambda x: call("div", _c(x, 1), x), FLOATS),
    **{k: (_primitive(f), FLOATS) for k, f in [
        ("Exp", "exp"), ("Log", "log"), ("Sqrt", "sqrt"), ("Sin", "sin"), ("Cos", "cos"),
        ("Tan", "tan"), ("Asin", "asin"), ("Acos", "acos"), ("Atan", "atan"), ("Sinh", "sinh"),
        ("Cosh", "cosh"), ("Asinh", "asinh"), ("Acosh", "acosh"), ("Atanh", "atanh"),
        ("Tanh", "tanh"), ("Erf", "erf"), ("Floor", "floor"), ("Ceil", "ceil"), ("Round", "rint"),
    ]},
    "Sigmoid": (_sigmoid, FLOATS),
    "HardSigmoid": (_hard_sigmoid, FLOATS),
    "HardSwish": (lambda x: call("mul", x, _hard_sigmoid(x, 1 / 6, 0.5)), FLOATS),
    "Relu": (lambda x: call("max", x, _c(x, 0)), NUMERIC),
    "LeakyRelu": (lambda x, alpha=0.01: select(call("lt", x, _c(x, 0)),
                                               call("mul", _c(x, alpha), x), x), FLOATS),
    "Elu": (lambda x, alpha=1.0: select(call("lt", x, _c(x, 0)),
                                        call("mul", _c(x, alpha), call("expm1", x)), x), FLOATS),
    "Selu": (_selu, FLOATS),
    "Celu": (lambda x, alpha=1.0: call("add", call("max", x, _c(x, 0)), call(
        "min", _c(x, 0), call("mul", _c(x, alpha), call("expm1", call("div", x, _c(x, alpha)))))),
        FLOATS),
    "ThresholdedRelu": (lambda x, alpha=1.0: select(call("gt", x, _c(x, alpha)), x, _c(x, 0)),
                        FLOATS),
    "Softplus": (_softplus, FLOATS),
    "Softsign": (lambda x: call("div", x, call("add", _c(x, 1), call("abs", x))), FLOATS),
    "Mish": (_mish, FLOATS),
    "Gelu": (_gelu, FLOATS),
    "Shrink": (_shrink, FLOATS),
    "IsNaN": (lambda x: call("isnan", x), FLOATS),
    "IsInf": (_is_inf, FLOATS),
    "Not": (lambda x: call("not", x), frozenset({DType.bool})),
}

_ARITH = MathProperties()
_COMM_ASSOC = MathProperties(associative=True, commutative=True)

# kind -> (primitive, accepted dtypes, properties)
BINARY: dict[str, tuple[str, frozenset[DType], MathProperties]] = {
    "Add": ("add", NUMERIC, _COMM_ASSOC),
    "Sub": ("sub", NUMERIC, _ARITH),
    "Mul": ("mul", NUMERIC, MathProperties(True, True, ("Add", "Sub"))),
    "Div": ("div", NUMERIC, MathProperties(distributes_over=())),
    "Pow": ("pow", FLOATS, _ARITH),
    "Max": ("max", NUMERIC, _COMM_ASSOC),
    "Min": ("min", NUMERIC, _COMM_ASSOC),
    "Equal": ("eq", NUMERIC | {DType.bool}, MathProperties(commutative=True)),
    "Less": ("lt", NUMERIC, _ARITH),
    "LessOrEqual": ("le", NUMERIC, _ARITH),
    "Greater": ("gt", NUMERIC, _ARITH),
    "GreaterOrEqual": ("ge", NUMERIC, _ARITH),
    "And": ("and", frozenset({DType.bool}), _COMM_ASSOC),
    "Or": ("or", frozenset({DType.bool}), _COMM_ASSOC),
    "Xor": ("xor", frozenset({DType.bool}), _COMM_ASSOC),
}


def unary(kind: str, x: Value, **attrs: Any) -> Op:
    """Build the ONNX unary elementwise operator ``kind`` (attributes as ONNX names them)."""
    builder, dtypes = UNARY[kind]
    x = check_value(kind, x, "X")
    require_dtype(kind, x, dtypes, " or ".join(sorted(map(str, dtypes))))
    try:
        body = builder(broadcast_read(0, x, x.shape), **attrs)
    except TypeError as exc:  # an attribute the operator does not have
        raise AttributeError_(kind, ", ".join(attrs), "one of the ONNX attributes of " + kind,
                              attrs) from exc
    return make_op(kind, [x], x.shape, body.dtype, body, attrs)


def binary(kind: str, a: Value, b: Value) -> Op:
    """Build the ONNX binary elementwise operator ``kind`` with multidirectional broadcasting."""
    prim, dtypes, props = BINARY[kind]
    a, b = check_value(kind, a, "A"), check_value(kind, b, "B")
    dtype = same_dtype(kind, [a, b])
    require_dtype(kind, a, dtypes, " or ".join(sorted(map(str, dtypes))))
    shape = broadcast_shape(kind, [a, b])
    body = call(prim, broadcast_read(0, a, shape), broadcast_read(1, b, shape))
    return make_op(kind, [a, b], shape, body.dtype if body.dtype is DType.bool else dtype, body,
                   properties=props)


def mod(a: Value, b: Value, fmod: int = 0) -> Op:
    """ONNX Mod: the remainder with the divisor's sign (Python's %, ``fmod=0``), or with the
    dividend's (C's fmod, ``fmod=1``), on integers and floats."""
    dtype = same_dtype("Mod", [a, b])
    require_dtype("Mod", a, NUMERIC, "a numeric dtype")
    shape = broadcast_shape("Mod", [a, b])
    x, y = broadcast_read(0, a, shape), broadcast_read(1, b, shape)
    body: Expr
    if dtype.is_float:
        body = call("fmod", x, y)
        if not fmod:  # a nonzero remainder whose sign differs from the divisor's moves by y
            moves = call("and", call("ne", body, _c(body, 0)),
                         call("xor", call("lt", body, _c(body, 0)), call("lt", y, _c(y, 0))))
            body = select(moves, call("add", body, y), body)
    else:
        body = call("mod", x, y) if not fmod else \
            call("sub", x, call("mul", call("div", x, y), y))  # integer div truncates
    return make_op("Mod", [a, b], shape, dtype, body, {"fmod": fmod})


def prelu(x: Value, slope: Value) -> Op:
    """ONNX PRelu: ``x if x >= 0 else slope * x``, slope broadcast to x."""
    require_dtype("PRelu", x, FLOATS, "a float dtype")
    same_dtype("PRelu", [x, slope])
    shape = broadcast_shape("PRelu", [x, slope])
    xe, se = broadcast_read(0, x, shape), broadcast_read(1, slope, shape)
    body = select(call("lt", xe, _c(xe, 0)), call("mul", se, xe), xe)
    return make_op("PRelu", [x, slope], shape, x.dtype, body)


def variadic(kind: str, *values: Value) -> Op:
    """ONNX Sum, Mean, Max, Min over any number of broadcast inputs."""
    prim = {"Sum": "add", "Mean": "add", "Max": "max", "Min": "min"}[kind]
    if not values:
        raise DtypeError(kind, None, "at least one input", "none")
    dtype = same_dtype(kind, values)
    require_dtype(kind, values[0], NUMERIC, "a numeric dtype")
    shape = broadcast_shape(kind, values)
    reads = [broadcast_read(k, v, shape) for k, v in enumerate(values)]
    body: Expr = reads[0]
    for r in reads[1:]:
        body = call(prim, body, r)
    if kind == "Mean":
        body = call("div", body, const(len(values), dtype))
    return make_op(kind, values, shape, dtype, body, properties=_COMM_ASSOC)


def where(condition: Value, x: Value, y: Value) -> Op:
    """ONNX Where: ``x`` where ``condition`` else ``y``, all three broadcast."""
    require_dtype("Where", condition, frozenset({DType.bool}), "bool")
    dtype = same_dtype("Where", [x, y])
    shape = broadcast_shape("Where", [condition, x, y])
    body = select(broadcast_read(0, condition, shape), broadcast_read(1, x, shape),
                  broadcast_read(2, y, shape))
    return make_op("Where", [condition, x, y], shape, dtype, body)


def clip(x: Value, min: float | Value | None = None, max: float | Value | None = None) -> Op:
    """ONNX Clip; bounds are numbers or tensors broadcast to ``x``."""
    require_dtype("Clip", x, NUMERIC, "a numeric dtype")
    inputs: list[Value] = [x]
    body: Expr = broadcast_read(0, x, x.shape)
    for fn, bound in (("max", min), ("min", max)):
        if bound is None:
            continue
        if isinstance(bound, Value):
            same_dtype("Clip", [x, bound])
            if broadcast_shape("Clip", [x, bound]) != x.shape:
                raise DtypeError("Clip", bound.name, f"a bound that broadcasts to {x.shape}",
                                 str(bound.shape))
            inputs.append(bound)
            body = call(fn, body, broadcast_read(len(inputs) - 1, bound, x.shape))
        else:
            body = call(fn, body, const(bound, x.dtype))
    return make_op("Clip", inputs, x.shape, x.dtype, body, {"min": min, "max": max})


def cast_op(x: Value, to: DType | str) -> Op:
    """ONNX Cast between float32/float16/float64/int32/int64/bool."""
    to = as_dtype(to, "Cast (attribute 'to')", getattr(x, "name", None))
    body = cast(broadcast_read(0, x, x.shape), to)
    return make_op("Cast", [x], x.shape, to, body, {"to": str(to)})


def dropout(x: Value, ratio: float = 0.5, training_mode: int = 0, seed: int | None = None) -> Op:
    """ONNX Dropout at inference: the identity (the optional mask output is not produced).
    ``training_mode`` must be 0; ``ratio`` and ``seed`` only matter in training."""
    del seed  # training only
    if training_mode:
        raise AttributeError_("Dropout", "training_mode", "0 (inference)", training_mode)
    if not isinstance(ratio, (int, float)) or not 0 <= float(ratio) < 1:
        raise AttributeError_("Dropout", "ratio", "a number in [0, 1)", ratio)
    op = unary("Identity", x)
    op.kind, op.attrs = "Dropout", {"ratio": float(ratio)}
    return op
