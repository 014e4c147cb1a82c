"""OpenCL C as a language: the primitives' spellings (built-ins are overloaded for scalars and
vectors alike, so one table serves both), the vector syntax of each width, and what a rendered
kernel carries besides its text (the NDRange of its launches)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from ...dtypes import DType
from ..base import Source
from ..c.emitter import BY_NUMBER
from ..c.vector import VectorSyntax

_MATH = ("exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos",
         "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor", "ceil", "rint")
_COMPARE = {"lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}",
            "eq": "{0} == {1}", "ne": "{0} != {1}"}
# '&' and '|', not '&&' and '||': booleans are 0 or 1, so they agree, and they leave no branch.
# Pip's PoCL 3.0 mis-read the branches of a short-circuit '&&' in a loop that holds a barrier:
# one work-item's guard served the whole group (a fuzz finding, test_fuzz_findings2.py)
_LOGIC = {"and": "{0} & {1}", "or": "{0} | {1}", "xor": "{0} != {1}", "not": "!{0}"}
# Max and Min propagate NaN, as NumPy's maximum/minimum, ONNX Max/Min and ReduceMax do (fmax and
# fmin drop it: relu(NaN) would be 0). One compare more than fmax's test; '?:' takes a scalar's
# condition or a vector's lane masks alike, so scalars, vectors and the .lo/.hi halving share it.
# NaN and Inf are tested with compares, not isnan()/isinf(): pip's PoCL (LLVM 14, generic
# x86-64) calls those built-ins lane by lane, which made a max/min chain 10x slower than copy.
ISNAN = "({0} != {0})"
MAX_NAN = f"((({{0}} > {{1}}) | {ISNAN}) ? {{0}} : {{1}})"
MIN_NAN = f"((({{0}} < {{1}}) | {ISNAN}) ? {{0}} : {{1}})"
# one expression, which OpenCL C contracts into an FMA (FP_CONTRACT is on by default) where
# the device has a fast one and computes as a multiply and an add elsewhere; fma() would be a
# slow software routine on a CPU without FMA
MULADD = "{0} * {1} + {2}"
FLOAT: dict[str, str | dict[DType, str]] = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "muladd": MULADD,
    "neg": "-{0}", "max": MAX_NAN, "min": MIN_NAN,  # "abs": after _bits below
    **BY_NUMBER,  # by a number other than NaN (c/emitter.py)
    "pow": "pow({0}, {1})", "fmod": "fmod({0}, {1})",
    # sign() of OpenCL C gives 0 for NaN; NumPy and ONNX give NaN (the input itself), and +0
    # for -0 (1 / sign(-0) is +Inf: a long-run fuzz finding)
    "sign": "({0} > 0 ? 1 : ({0} < 0 ? -1 : ({0} != {0} ? {0} : 0)))",
    "isnan": ISNAN, "isinf": "(({0} == INFINITY) | ({0} == -INFINITY))",
    **{f: f"{f}({{0}})" for f in _MATH}, **_COMPARE,
}


def _bits(n: str) -> dict[str, str]:
    """Bit-level spellings on a float (``n`` '') or a floatN: |x| with the sign bit cleared
    (pip's PoCL calls fabs() lane by lane); the math library's primitives
    (``lower/fastmath.py``): 2^k from k + 1.5 * 2^23, whose low mantissa bits hold the integral
    k (no float-to-int conversion, so NaN has a defined result too), shifted into the exponent
    field with the bias; the exponent field unbiased; the significand under the exponent of 1."""
    return {"abs": f"as_float{n}(as_uint{n}({{0}}) & 0x7fffffffu)",
            "exp2i": f"as_float{n}((as_uint{n}({{0}} + 12582912.0f) + 127u) << 23)",
            "logb": f"convert_float{n}(((as_int{n}({{0}}) >> 23) & 0xff) - 127)",
            "significand": f"as_float{n}((as_uint{n}({{0}}) & 0x807fffffu) | 0x3f800000u)"}


# float32 only (a double's bits differ; it keeps fabs), float16 computing in float32 included
FLOAT.update({f: {DType.float32: fmt} for f, fmt in _bits("").items()})
FLOAT["abs"] = {DType.float32: _bits("")["abs"], DType.float64: "fabs({0})"}
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


# PoCL (3.0 and 3.1, SLEEF) computes floatN sin, cos and tan wrong in every lane when one lane
# needs its large-argument reduction (|x| of 1e5 and up, Inf): sin(-1.9e-3) gave -0.015 beside
# a lane of 7.8e27, cos(1e-20) 0.99993 (a long-run fuzz finding, in a fused prologue's float4).
# Its scalar calls are right, also where it vectorises them across work-items; Intel's runtime
# is right either way. On vectors these three are called lane by lane.
LANE_BY_LANE = ("sin", "cos", "tan")


def _vector_functions(width: int) -> dict[str, str]:
    """The primitives' spellings on floatN ('sign' has none: OpenCL's gives 0 for NaN)."""
    scalar = {k: v for k, v in FLOAT.items() if isinstance(v, str) and k != "sign"}
    lanes = {f: f"((float{width})(" + ", ".join(f"{f}(({{0}}).s{j:x})" for j in range(width))
             + "))" for f in LANE_BY_LANE}
    return {**scalar, **lanes, **_bits(str(width)), **_VECTOR_LOGIC}


def _with_dot_products(v: VectorSyntax) -> VectorSyntax:
    """``v`` with its reductions' vector sums as one expression each (``MULADD``), and the
    pair sums that fold a dot product's lanes (``VectorSyntax.pair_sum``). Two vectors are
    joined by ``shuffle2``, not by a vector literal of vectors: Oclgrind 21.10 crashes on the
    latter (clang widens each part with undefined lanes first; tests/oclgrind_worker.py)."""
    width = v.width
    lanes = [str(j) for j in range(2 * width)]

    def picks(chosen: list[str]) -> str:
        return f"(uint{len(chosen)})({', '.join(chosen)})" if len(chosen) > 1 else chosen[0]
    even, odd = picks(lanes[0::2]), picks(lanes[1::2])
    return replace(
        v, fma=MULADD,
        pair_sum=f"(shuffle2({{0}}, {{1}}, {even}) + shuffle2({{0}}, {{1}}, {odd}))",
        half_sum="({0}.even + {0}.odd)", half_type=f"float{width // 2}" if width > 2 else "float",
        # two scalars (a float2) have no undefined lanes to widen
        join=f"shuffle2({{0}}, {{1}}, {picks(lanes[:width])})" if width > 2 else
        f"((float{width})({{0}}, {{1}}))")


def _load_convert(width: int) -> dict[str, str]:
    """``width`` int32, int64 or boolean (uchar) lanes from ``{ptr} + {off}`` as floats: OpenCL
    converts any integer vector (``convert_floatN``); booleans are stored 0 or 1."""
    text = f"convert_float{width}(vload{width}(0, {{ptr}} + {{off}}))"
    return {"int32": text, "int64": text, "bool": text}


VECTOR = _with_dot_products(VectorSyntax(
    width=8, vtype="float8", mtype="int8", load="vload8(0, {ptr} + {off})",
    store="vstore8({v}, 0, {ptr} + {off});", broadcast="((float8)({0}))",
    broadcast_mask="((int8)(-({0})))", select="select({2}, {1}, {0})",
    functions=_vector_functions(8),
    combine={"sum": "{a} + {b}", "prod": "{a} * {b}",
             "max": MAX_NAN.format("{a}", "{b}"), "min": MIN_NAN.format("{a}", "{b}")},
    horizontal={"sum": "", "prod": "", "max": "", "min": ""},  # halving with .lo/.hi
    # lanes, for keys read as transposed tiles in a float8 'row' (pip's PoCL builds no float16)
    lane="{v}.s{j:x}", compose="((float8)({0}))", load_convert=_load_convert(8),
))
BARRIER = "barrier(CLK_LOCAL_MEM_FENCE);"
# OpenCL C's keywords, built-in functions and macros (OpenCL C 1.2 and 2.0, section 6): a kernel
# parameter named like one would hide it (tensors named 'fmax', 'exp' or 'get_global_id' broke
# the build), so the printer renames such tensors' parameters (c/emitter.py, c_idents)
RESERVED_NAMES = frozenset((
    # keywords and types beyond C's
    "kernel", "global", "local", "constant", "private", "generic", "read_only", "write_only",
    "read_write", "uniform", "pipe", "complex", "imaginary", "typedef", "enum", "half", "size_t",
    "ptrdiff_t", "intptr_t", "uintptr_t", "image1d_t", "image2d_t", "image3d_t",
    "image1d_array_t", "image1d_buffer_t", "image2d_array_t", "sampler_t", "event_t", "true",
    "false", "NULL", "NAN", "INFINITY", "MAXFLOAT", "HUGE_VAL", "HUGE_VALF",
    # math
    "acos", "acosh", "acospi", "asin", "asinh", "asinpi", "atan", "atan2", "atanh", "atanpi",
    "atan2pi", "cbrt", "ceil", "copysign", "cos", "cosh", "cospi", "erfc", "erf", "exp", "exp2",
    "exp10", "expm1", "fabs", "fdim", "floor", "fma", "fmax", "fmin", "fmod", "fract", "frexp",
    "hypot", "ilogb", "ldexp", "lgamma", "lgamma_r", "log", "log2", "log10", "log1p", "logb",
    "mad", "maxmag", "minmag", "modf", "nan", "nextafter", "pow", "pown", "powr", "remainder",
    "remquo", "rint", "rootn", "round", "rsqrt", "sin", "sincos", "sinh", "sinpi", "sqrt", "tan",
    "tanh", "tanpi", "tgamma", "trunc",
    # integer, common, geometric, relational
    "abs", "abs_diff", "add_sat", "hadd", "rhadd", "clamp", "clz", "ctz", "mad_hi", "mad_sat",
    "max", "min", "mul_hi", "rotate", "sub_sat", "upsample", "popcount", "mad24", "mul24",
    "degrees", "mix", "radians", "step", "smoothstep", "sign", "cross", "dot", "distance",
    "length", "normalize", "isequal", "isnotequal", "isgreater", "isgreaterequal", "isless",
    "islessequal", "islessgreater", "isfinite", "isinf", "isnan", "isnormal", "isordered",
    "isunordered", "signbit", "any", "all", "bitselect", "select", "shuffle", "shuffle2",
    # synchronisation, memory, output
    "barrier", "mem_fence", "read_mem_fence", "write_mem_fence", "wait_group_events", "prefetch",
    "printf", "vec_step", "ndrange_1D", "ndrange_2D", "ndrange_3D", "enqueue_kernel",
))
# families of built-ins (get_global_id, convert_float8_rte, vload_half, atomic_add, CLK_*,
# FLT_MAX, M_PI ...)
RESERVED_PREFIXES = (
    "get_", "convert_", "as_", "vload", "vstore", "atomic_", "atom_", "native_", "half_",
    "read_image", "write_image", "async_", "work_group_", "sub_group_", "CL_", "CLK_", "FLT_",
    "DBL_", "HALF_", "M_", "FP_", "CHAR_", "SCHAR_", "UCHAR_", "SHRT_", "USHRT_", "INT_", "UINT_",
    "LONG_", "ULONG_")


@cache
def vector_syntax(width: int, stride2: bool = False) -> VectorSyntax:
    """``floatN`` code with lane numbers, lane access and dot products: the contraction
    templates' and the staged 'row' schedule's vectors. ``stride2``: reads of every second
    float as vectors too (the 'window' schedule's strided windows, and the 'tiled' one's
    strided patches where ``columns.column_plan`` takes them)."""
    return _with_dot_products(replace(
        VECTOR, width=width, vtype=f"float{width}", mtype=f"int{width}",
        functions=_vector_functions(width), load=f"vload{width}(0, {{ptr}} + {{off}})",
        store=f"vstore{width}({{v}}, 0, {{ptr}} + {{off}});",
        broadcast=f"((float{width})({{0}}))", broadcast_mask=f"((int{width})(-({{0}})))",
        iota=f"((int{width})({', '.join(str(j) for j in range(width))}))",
        lane="{v}.s{j:x}", compose=f"((float{width})({{0}}))",
        load_stride2=_load_stride2(width) if stride2 else "",
        load_convert=_load_convert(width), stride2_past=1 if width <= 2 else 0))


def _load_stride2(width: int) -> str:
    """Every second float from ``{ptr} + {off}``: a stride-2 window's run (a strided depthwise
    conv, a max-pool). Up to 2 lanes the ``.even`` lanes of one double-width load (reading one
    float past the last lane's); wider, a helper that fills the halves from two loads of
    ``width`` reading no float past the last lane's (``stride2_helpers``)."""
    if width <= 2:
        return f"vload{2 * width}(0, {{ptr}} + {{off}}).even"
    return f"kg_vload_even{width}({{ptr}} + {{off}})"


def stride2_helpers(source: str) -> str:
    """The ``kg_vload_even<N>`` functions ``source`` calls, defined: two N-wide loads, the
    second one float back so that they end at the last lane's float, and a vector of the lanes
    at even offsets from ``p``, composed lane by lane. Reading no float past the last lane's,
    a read inside a window's guard (or an unpadded one) needs no run-time test: without the
    test and lane-by-lane fallback at each tap, the 3x3/2 max-pools of SqueezeNet, ResNet-50,
    ShuffleNet and Inception v1 ran 1.6-2.8x faster on PoCL (a double-width ``vload8``'s
    ``.even`` at 4 lanes included: 2.0-2.4x). pip's PoCL 3.0 (LLVM 14) on an AVX-512 Zen 4
    returns garbage in lanes 4-7 of ``vload16(...).even``; a vector literal of two loads'
    ``.even`` halves crashes Oclgrind 21.10's uninitialised-value check, and filling
    ``.lo``/``.hi`` ran 8% slower on PoCL 3.1."""
    defined = []
    for width in (4, 8, 16):
        if f"kg_vload_even{width}(" in source:
            lanes = [f"a.s{j:x}" for j in range(0, width, 2)] + \
                [f"b.s{j:x}" for j in range(1, width, 2)]
            defined.append(
                f"// every second float of the {2 * width - 1} from p\n"
                f"float{width} kg_vload_even{width}(const __global float* p)\n{{\n"
                f"    const float{width} a = vload{width}(0, p), "
                f"b = vload{width}(0, p + {width - 1});\n"
                f"    return (float{width})({', '.join(lanes)});\n}}\n\n")
    return "".join(defined)


@dataclass(frozen=True)
class Launch:
    """NDRange of the kernel. ``scratch`` > 0: a buffer of that many float32 elements the kernel
    takes after its outputs (panels of a packed operand). ``pack``, when set, is a packing
    kernel launched first (entry point ``<name>_pack`` in the same source; arguments: the
    inputs, then the scratch buffer); without it, the kernel packs its panels itself.
    ``pack_once``: the positions of the inputs the packing kernel reads, all constants (a
    model's weights); it then runs at the first launch and again only when a launch passes
    other buffers for them."""

    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    pack: Launch | None = None
    scratch: int = 0
    pack_once: tuple[int, ...] = ()

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
            if self.pack_once:  # constants: the panels stay valid from launch to launch
                out["pack"]["once"] = True
                out["pack"]["reads_inputs"] = list(self.pack_once)
        return out


@dataclass(frozen=True)
class OpenCLSource(Source):
    """The kernel's OpenCL C, its entry point and its launches."""

    entry: str
    geometry: Launch
