"""OpenCL C as a language: the primitives' spellings (built-ins are overloaded for scalars and
vectors alike, so one table serves both), the vector syntax of each width, and what a rendered
kernel carries besides its text (the NDRange of its launches)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from ...dtypes import DType
from ..base import Source
from ..c.vector import VectorSyntax

_MATH = ("exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos",
         "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "rint")
_COMPARE = {"lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}",
            "eq": "{0} == {1}", "ne": "{0} != {1}"}
_LOGIC = {"and": "{0} && {1}", "or": "{0} || {1}", "xor": "{0} != {1}", "not": "!{0}"}
FLOAT = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "abs": "fabs({0})", "max": "fmax({0}, {1})", "min": "fmin({0}, {1})",
    "pow": "pow({0}, {1})", "fmod": "fmod({0}, {1})", "sign": "sign({0})",
    "isnan": "isnan({0})", "isinf": "isinf({0})",
    **{f: f"{f}({{0}})" for f in _MATH}, **_COMPARE,
}
INT = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "abs": "({0} < 0 ? -{0} : {0})", "max": "max({0}, {1})",
    "min": "min({0}, {1})", "mod": "KG_FLOORMOD({0}, {1})", "sign": "(({0} > 0) - ({0} < 0))",
    **_COMPARE, **_LOGIC,
}
SCALAR_TYPES = {DType.float32: "float", DType.float64: "double", DType.int32: "int",
                DType.int64: "long", DType.bool: "bool", DType.float16: "float"}
BUFFER_TYPES = {DType.float32: "float", DType.float64: "double", DType.int32: "int",
                DType.int64: "long", DType.bool: "uchar", DType.float16: "half"}
# Vector masks are -1 or 0 a lane: bitwise logic keeps them so ('&&' and '!' of vectors fold
# to 1 per lane in PoCL's clang when the operands are constants, and select() reads the top bit)
_VECTOR_LOGIC = {"and": "{0} & {1}", "or": "{0} | {1}", "xor": "{0} ^ {1}", "not": "~{0}"}
VECTOR = VectorSyntax(
    width=8, vtype="float8", mtype="int8", load="vload8(0, {ptr} + {off})",
    store="vstore8({v}, 0, {ptr} + {off});", broadcast="((float8)({0}))",
    broadcast_mask="((int8)(-({0})))", select="select({2}, {1}, {0})",
    functions={**{k: v for k, v in FLOAT.items() if k != "sign"}, **_VECTOR_LOGIC},
    combine={"sum": "{a} + {b}", "prod": "{a} * {b}", "max": "fmax({a}, {b})",
             "min": "fmin({a}, {b})"},
    horizontal={"sum": "", "prod": "", "max": "", "min": ""},  # halving with .lo/.hi
)
BARRIER = "barrier(CLK_LOCAL_MEM_FENCE);"


@cache
def vector_syntax(width: int) -> VectorSyntax:
    """``floatN`` code with lane numbers, lane access and fma: the contraction templates' and
    the staged 'row' schedule's vectors."""
    return replace(VECTOR, width=width, vtype=f"float{width}", mtype=f"int{width}",
                   load=f"vload{width}(0, {{ptr}} + {{off}})",
                   store=f"vstore{width}({{v}}, 0, {{ptr}} + {{off}});",
                   broadcast=f"((float{width})({{0}}))",
                   broadcast_mask=f"((int{width})(-({{0}})))",
                   iota=f"((int{width})({', '.join(str(j) for j in range(width))}))",
                   fma="fma({0}, {1}, {2})", lane="{v}.s{j:x}",
                   compose=f"((float{width})({{0}}))")


@dataclass(frozen=True)
class Launch:
    """NDRange of the kernel. ``scratch`` > 0: a buffer of that many float32 elements the kernel
    takes after its outputs (panels of a packed operand). ``pack``, when set, is a packing
    kernel launched first (entry point ``<name>_pack`` in the same source; arguments: the
    inputs, then the scratch buffer); without it, the kernel packs its panels itself."""

    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    pack: Launch | None = None
    scratch: int = 0

    def metadata(self, name: str) -> dict[str, Any]:
        """What a host program needs to launch kernel ``name`` (JSON)."""
        out: dict[str, Any] = {
            "global_size": list(self.global_size),
            "local_size": list(self.local_size) if self.local_size else None}
        if self.scratch:
            out.update(args="the inputs, the outputs, then the scratch buffer",
                       scratch_bytes=4 * self.scratch)
        if self.pack is not None:  # launched first, filling the scratch buffer
            out["pack"] = {"kernel": f"{name}_pack",
                           "global_size": list(self.pack.global_size),
                           "local_size": list(self.pack.local_size or ()),
                           "args": "the inputs, then the scratch buffer"}
        return out


@dataclass(frozen=True)
class OpenCLSource(Source):
    """The kernel's OpenCL C, its entry point and its launches."""

    entry: str
    geometry: Launch
