"""Triton as a language: the primitives' spellings in ``triton.language`` core functions (the
rest are ``@triton.jit`` helpers in ``templates/helpers.py.tmpl``, built from core functions,
because libdevice externs do not run under ``TRITON_INTERPRET=1``), and the generated module."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ...dtypes import DType
from .. import templates
from ..base import Source

TL = {DType.float32: "tl.float32", DType.float16: "tl.float16", DType.float64: "tl.float64",
       DType.int32: "tl.int32", DType.int64: "tl.int64", DType.bool: "tl.int1"}
SIGNATURE = {DType.float32: "*fp32", DType.float16: "*fp16", DType.float64: "*fp64",
             DType.int32: "*i32", DType.int64: "*i64", DType.bool: "*i1"}
FLOAT = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "muladd": "({0} * {1} + {2})", "neg": "(-{0})", "abs": "tl.abs({0})", "max": "kg_max({0}, {1})",
    "min": "kg_min({0}, {1})",
    **{f: f"tl.{f}({{0}})" for f in ("exp", "log", "sqrt", "rsqrt", "cos", "erf")},
    **{f: f"kg_{f}({{0}})" for f in ("sin", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                                     "asinh", "acosh", "atanh", "expm1", "log1p", "rint",
                                     "sign", "isnan", "isinf", "floor", "ceil")},
    "pow": "kg_pow({0}, {1})", "fmod": "kg_fmod({0}, {1})",
    # the math library's bit-level primitives (lower/fastmath.py)
    "exp2i": "kg_exp2i({0})", "logb": "kg_logb({0})", "significand": "kg_significand({0})",
    "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})",
}
# float32 division and square root rounded once, as in C and NumPy (the math library's
# expansions divide too): on a GPU "/" is div.full (2 ulps), and tl.sqrt and tl.rsqrt are
# approximations that flush a subnormal to zero first (sqrt(-1e-45) was a number, not NaN)
ROUNDED = {"div": "tl.div_rn({0}, {1})", "sqrt": "tl.sqrt_rn({0})",
           "rsqrt": "tl.div_rn(1.0, tl.sqrt_rn({0}))"}
INT = {
    **{k: v for k, v in FLOAT.items() if k in ("add", "sub", "mul", "neg", "abs", "max", "min",
                                                 "lt", "le", "gt", "ge", "eq", "ne")},
    "div": "kg_idiv({0}, {1})", "mod": "kg_imod({0}, {1})", "sign": "kg_isign({0})",
    # tl.where, not & and |: the interpreter cannot mix a scalar and a vector boolean in them
    "and": "tl.where({0}, {1}, False)", "or": "tl.where({0}, True, {1})", "xor": "({0} != {1})",
    "not": "({0} == 0)",
}
# tl.max and tl.min drop NaN; kg_max and kg_min propagate it
FINISH = {"sum": "tl.sum({v}, axis=0)", "max": "tl.reduce({v}, 0, kg_max)",
          "min": "tl.reduce({v}, 0, kg_min)", "prod": "tl.reduce({v}, 0, kg_mul)"}


@dataclass(frozen=True)
class TritonSource(Source):
    """The generated module: its text, the kernel function's name, the pointer signature and
    block sizes (constexprs) it is launched with, the grid, and the float32 elements of the
    scratch buffer it takes after its outputs (0: none)."""

    function: str
    signature: dict[str, str]
    constexprs: dict[str, int]
    grid: tuple[int, ...]
    scratch: int = 0

    @property
    def module_name(self) -> str:
        return module_name(self.text)


def module_name(text: str) -> str:
    """A module's stable file name: Triton reads a kernel's source from its file."""
    return f"kg_{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def py_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)[:40]


def used_helpers(code: str) -> str:
    """The helper definitions ``code`` calls, with the helpers they call in turn."""
    helpers = _helper_blocks()
    wanted: list[str] = []
    pending = set(re.findall(r"\b(kg_\w+)\b", code))  # called, or passed (tl.reduce)
    while pending:
        name = pending.pop()
        if name in helpers and name not in wanted:
            wanted.append(name)
            pending |= set(re.findall(r"\b(kg_\w+)\b", helpers[name])) - set(wanted)
    return "\n\n".join(helpers[n] for n in sorted(wanted))


def _helper_blocks() -> dict[str, str]:
    text = templates.render("triton", "helpers.py")
    blocks = [b.strip() for b in text.split("\n\n\n") if b.strip()]
    return {re.search(r"def (kg_\w+)\(", b).group(1): b for b in blocks}  # type: ignore[union-attr]
