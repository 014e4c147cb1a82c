"""kernelgen: fused compute kernels for deep-learning operators, from DNNFusion mapping types.

    import kernelgen as kg
    x = kg.tensor("x", (1024, 1000))
    b = kg.tensor("b", (1000,))
    y = kg.softmax(kg.relu(kg.add(x, b)), axis=1)
    kernel = kg.fuse(y.inputs[0].inputs[0], y.inputs[0], y).emit("opencl")  # or "neon", "triton"
    print(kernel.source); out = kernel(x_np, b_np)
    print(kg.bench(kernel, x_np, b_np))   # median, p20, p80, GB/s, GFLOP/s
"""
from . import api
from .api import *  # noqa: F401,F403 - the generated snake_case constructors
from .api import CONSTRUCTORS, snake
from .dtypes import DType
from .errors import (ArgumentError, AttributeError_, AxisError, BroadcastError, DtypeError,
                     FusionError, KernelgenError, ShapeError, UnsupportedError)
from .fuse import FusedOp, fuse
from .graph import Constant, MathProperties, Op, Placeholder, Value, constant, tensor
from .interp import interpret
from .measure import Measurement, bench
from .program import Program
from .ops import (average_pool, batch_normalization, clip, concat, conv, depth_to_space, expand,
                  flatten, gather, gemm, global_pool, instance_normalization, layer_normalization,
                  log_softmax, matmul, max_pool, mod, pad, prelu, reshape, resize, softmax,
                  space_to_depth, split, squeeze, transpose, unsqueeze, where)
from .ops import cast_op as cast
from .ops import slice_op as slice

CONSTRUCTORS.update({
    "Cast": cast, "Clip": clip, "Concat": concat, "DepthToSpace": depth_to_space,
    "Expand": expand, "Flatten": flatten, "Gather": gather, "LogSoftmax": log_softmax,
    "Mod": mod, "Pad": pad, "PRelu": prelu, "Reshape": reshape, "Resize": resize, "Slice": slice,
    "Softmax": softmax, "SpaceToDepth": space_to_depth, "Split": split, "Squeeze": squeeze,
    "Transpose": transpose, "Unsqueeze": unsqueeze, "Where": where,
    "MatMul": matmul, "Gemm": gemm, "Conv": conv, "MaxPool": max_pool,
    "AveragePool": average_pool, "BatchNormalization": batch_normalization,
    "LayerNormalization": layer_normalization, "InstanceNormalization": instance_normalization,
    "GlobalAveragePool": lambda x: global_pool("GlobalAveragePool", x),
    "GlobalMaxPool": lambda x: global_pool("GlobalMaxPool", x),
})

__version__ = "0.1.0"

__all__ = [
    *api.__all__, "Constant", "constant", "ArgumentError", "AttributeError_", "AxisError",
    "BroadcastError",
    "CONSTRUCTORS", "DType", "DtypeError", "FusedOp", "FusionError", "KernelgenError",
    "MathProperties", "Measurement", "Op", "Placeholder", "Program", "ShapeError",
    "UnsupportedError",
    "Value", "average_pool", "batch_normalization", "bench", "cast", "clip", "concat", "conv",
    "depth_to_space", "expand", "flatten", "fuse", "gather", "gemm", "global_pool",
    "instance_normalization", "interpret", "layer_normalization", "log_softmax", "matmul",
    "max_pool", "mod", "pad", "prelu", "reshape", "resize", "slice", "snake", "softmax",
    "space_to_depth", "split", "squeeze", "tensor", "transpose", "unsqueeze", "where",
]
