"""NEON C as a language: the primitives' spellings (libm per dtype, intrinsics for float32x4_t),
the vector helpers kernels include when they use them, and the rendered function.

The same source compiles on AArch64 (``arm_neon.h``) and on x86 through SIMDe. Parameters are
positional (``in0``, ``out0``; the comment above the function names them), and the function
name carries a hash of the code, so identical kernels have identical source however their
tensors are named, and many kernels can share one translation unit (SIMDe's headers cost about a
second per unit to parse)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...dtypes import DType
from ...lower.fastmath import FUNCTIONS as EXPANDED
from ...version import __version__
from .. import templates
from ..base import Source
from ..c.emitter import BY_NUMBER
from ..c.vector import VectorSyntax

_UNARY_F = ("exp", "expm1", "log", "log1p", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan",
            "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "rint")
_COMPARE = {"lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}",
            "eq": "{0} == {1}", "ne": "{0} != {1}"}


def _per_dtype(name: str) -> dict[DType, str]:
    return {DType.float32: name + "f", DType.float64: name}


FLOAT: dict[str, Any] = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "muladd": "{0} * {1} + {2}",  # rounded twice: the build turns contraction off (runtime.py)
    "neg": "-{0}",
    **{f: {dt: f"{n}({{0}})" for dt, n in _per_dtype(f).items()} for f in _UNARY_F},
    "abs": {dt: f"{n}({{0}})" for dt, n in _per_dtype("fabs").items()},
    # NaN propagates, as in NumPy's maximum and ONNX Max, Relu, Clip (fmax would drop it):
    # float32 by the vector unit's FMAX/FMIN on one lane (kg_maxf, kg_minf: no branch), a Max
    # or Min by a number (c/emitter.py's BY_NUMBER) the number first
    "max": {DType.float32: "kg_maxf({0}, {1})",
            DType.float64: "((({0} > {1}) | isnan({0})) ? {0} : {1})"},
    "min": {DType.float32: "kg_minf({0}, {1})",
            DType.float64: "((({0} < {1}) | isnan({0})) ? {0} : {1})"},
    "max_number": {DType.float32: "kg_maxf({1}, {0})", DType.float64: BY_NUMBER["max_number"]},
    "min_number": {DType.float32: "kg_minf({1}, {0})", DType.float64: BY_NUMBER["min_number"]},
    "max_zero": {DType.float32: "(kg_maxf({1}, {0}) + {1})",
                 DType.float64: BY_NUMBER["max_zero"]},
    "min_zero": {DType.float32: "(kg_minf({1}, {0}) + {1})",
                 DType.float64: BY_NUMBER["min_zero"]},
    "pow": {dt: f"{n}({{0}}, {{1}})" for dt, n in _per_dtype("pow").items()},
    "fmod": {dt: f"{n}({{0}}, {{1}})" for dt, n in _per_dtype("fmod").items()},
    "rsqrt": {DType.float32: "1.0f / sqrtf({0})", DType.float64: "1.0 / sqrt({0})"},
    "sign": "({0} > 0 ? 1 : ({0} < 0 ? -1 : ({0} != {0} ? {0} : 0)))",  # +0 for -0, NaN kept
    "isnan": "isnan({0})", "isinf": "isinf({0})", **_COMPARE,
    # the math library's bit-level primitives (lower/fastmath.py): float32 only
    **{f: {DType.float32: f"kg_{f}f({{0}})"} for f in ("exp2i", "logb", "significand")},
}
INT = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "abs": "({0} < 0 ? -{0} : {0})", "max": "({0} > {1} ? {0} : {1})",
    "min": "({0} < {1} ? {0} : {1})", "mod": "KG_FLOORMOD({0}, {1})",
    "sign": "(({0} > 0) - ({0} < 0))", **_COMPARE,
    "and": "{0} && {1}", "or": "{0} || {1}", "xor": "{0} != {1}", "not": "!{0}",
}
# Functions NEON has no instruction for run lane by lane through libm (kg_v_<fn>), except the
# math library's (exp, log, tanh, erf, ...), which are expanded into primitives before printing
# (lower/fastmath.py): their float32 calls never reach a vector.
_LANEWISE = [f for f in _UNARY_F if f not in EXPANDED | {"sqrt", "floor", "ceil", "rint"}]
VECTOR = VectorSyntax(
    width=4, vtype="float32x4_t", mtype="uint32x4_t", load="vld1q_f32({ptr} + {off})",
    load_stride2="vld2q_f32({ptr} + {off}).val[0]",
    store="vst1q_f32({ptr} + {off}, {v});", broadcast="vdupq_n_f32({0})",
    broadcast_mask="vdupq_n_u32(({0}) ? 0xFFFFFFFFu : 0u)", select="vbslq_f32({0}, {1}, {2})",
    functions={
        "add": "vaddq_f32({0}, {1})", "sub": "vsubq_f32({0}, {1})", "mul": "vmulq_f32({0}, {1})",
        "div": "vdivq_f32({0}, {1})", "neg": "vnegq_f32({0})", "abs": "vabsq_f32({0})",
        "muladd": "vfmaq_f32({2}, {0}, {1})",
        # vmaxq (FMAX), not vmaxnmq (FMAXNM): NaN propagates, on AArch64 and in SIMDe alike
        "max": "vmaxq_f32({0}, {1})", "min": "vminq_f32({0}, {1})",
        "sqrt": "vsqrtq_f32({0})", "rsqrt": "vdivq_f32(vdupq_n_f32(1.0f), vsqrtq_f32({0}))",
        "floor": "vrndmq_f32({0})", "ceil": "vrndpq_f32({0})",
        "rint": "vrndnq_f32({0})", "pow": "kg_v_powf({0}, {1})", "fmod": "kg_v_fmodf({0}, {1})",
        "sign": "kg_v_signf({0})",
        **{f: f"kg_v_{f}f({{0}})" for f in _LANEWISE},
        **{f: f"kg_{f}q_f32({{0}})" for f in ("exp2i", "logb", "significand")},
        "lt": "vcltq_f32({0}, {1})", "le": "vcleq_f32({0}, {1})", "gt": "vcgtq_f32({0}, {1})",
        "ge": "vcgeq_f32({0}, {1})", "eq": "vceqq_f32({0}, {1})",
        "ne": "vmvnq_u32(vceqq_f32({0}, {1}))", "isnan": "vmvnq_u32(vceqq_f32({0}, {0}))",
        "isinf": "vceqq_f32(vabsq_f32({0}), vdupq_n_f32(INFINITY))",
        "and": "vandq_u32({0}, {1})", "or": "vorrq_u32({0}, {1})",
        "xor": "veorq_u32({0}, {1})", "not": "vmvnq_u32({0})",
    },
    fma="vfmaq_f32({2}, {0}, {1})",
    pair_sum="vpaddq_f32({0}, {1})", half_sum="vpadd_f32(vget_low_f32({0}), vget_high_f32({0}))",
    half_type="float32x2_t", join="vcombine_f32({0}, {1})",
    transpose="kg_vtranspose4_f32({0})", transposed_type="float32x4x4_t",
    lane_ints="kg_vlanes_s32({first}, {step})", select_mask="vbslq_u32({0}, {1}, {2})",
    sign_masks={">=": "vcgeq_s32({0}, vdupq_n_s32(0))", ">": "vcgtq_s32({0}, vdupq_n_s32(0))",
                "<=": "vcleq_s32({0}, vdupq_n_s32(0))", "<": "vcltq_s32({0}, vdupq_n_s32(0))"},
    mask_and="vandq_u32({0}, {1})", mask_load="vld1q_u32((const uint32_t*){ptr} + {off})",
    combine={"sum": "vaddq_f32({a}, {b})", "prod": "vmulq_f32({a}, {b})",
             "max": "vmaxq_f32({a}, {b})", "min": "vminq_f32({a}, {b})"},
    horizontal={"sum": "vaddvq_f32({v})", "max": "kg_vmaxvq_f32({v})",
                "min": "kg_vminvq_f32({v})", "prod": "kg_vmulvq_f32({v})"},
)
SCALAR_TYPES = {DType.float32: "float", DType.float64: "double", DType.int32: "int32_t",
                DType.int64: "int64_t", DType.bool: "bool", DType.float16: "float"}
BUFFER_TYPES = {DType.float32: "float", DType.float64: "double", DType.int32: "int32_t",
                DType.int64: "int64_t", DType.bool: "uint8_t", DType.float16: "_Float16"}


@dataclass(frozen=True)
class NeonSource(Source):
    """A kernel's C: the shared header, the helpers it uses, and its function."""

    function_name: str
    helpers: dict[str, str]
    function: str

    @classmethod
    def of(cls, function_name: str, helpers: dict[str, str], function: str) -> NeonSource:
        text = "\n".join([header(), *helpers.values(), function])
        return cls(text, None, {"function": function_name, "threads": "openmp"},
                   function_name, helpers, function)

    @property
    def code(self) -> str:
        """The text without the comment lines that name tensors: what the cache keys on, so
        the same kernel built from differently named tensors hits the same library."""
        return "\n".join(line for line in self.text.splitlines()
                         if not line.lstrip().startswith("//"))


def header() -> str:
    """The common top of every NEON translation unit."""
    return templates.render("neon", "header.c", version=__version__)


def c_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)[:40]


def helpers() -> dict[str, str]:
    """Vector helpers by name, defined only in kernels that use them."""
    out = {"kg_vmulvq_f32": templates.render("neon", "vmulv.c")}
    # each with its scalar (kg_exp2if) and vector (kg_exp2iq_f32) form: the name is in both
    out.update({f"kg_{f}": templates.render("neon", f"{f}.c")
                for f in ("exp2i", "logb", "significand")})
    for f in _LANEWISE:
        out[f"kg_v_{f}f"] = templates.render("neon", "lanewise.c", name=f"kg_v_{f}f", fn=f"{f}f")
    out["kg_v_signf"] = templates.render("neon", "vsign.c")
    for f in ("max", "min"):
        out[f"kg_v{f}vq_f32"] = templates.render("neon", "vextremum.c", name=f"kg_v{f}vq_f32",
                                                 native=f"v{f}vq_f32", pairwise=f"v{f}q_f32")
    out["kg_vlanes_s32"] = templates.render("neon", "vlanes.c")
    for f, kind in (("max", "Max"), ("min", "Min")):
        out[f"kg_{f}f"] = templates.render("neon", "scalar_extremum.c", name=f"kg_{f}f",
                                           kind=kind, native=f"v{f}q_f32")
    out["kg_vtranspose4_f32"] = templates.render("neon", "vtranspose4.c")
    for f in ("pow", "fmod"):
        out[f"kg_v_{f}f"] = templates.render("neon", "lanewise2.c", name=f"kg_v_{f}f",
                                             fn=f"{f}f")
    return out
