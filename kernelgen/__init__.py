"""kernelgen: fused compute kernels for deep-learning operators, from DNNFusion mapping types.

    import kernelgen as kg
    x = kg.tensor("x", (1024, 1000))
    b = kg.tensor("b", (1000,))
    a = kg.add(x, b)
    r = kg.relu(a)
    s = kg.softmax(r, axis=1)
    kernel = kg.fuse(a, r, s).emit("opencl")   # or "neon", "triton"
    print(kernel.source); out = kernel(x_np, b_np)
    print(kg.bench(kernel, x_np, b_np))        # median, p20, p80, GB/s, GFLOP/s

This module is the public face: it re-exports and defines nothing. The layers below it, from
the ground up, are listed in ``docs/architecture.md``.
"""
import importlib
from typing import TYPE_CHECKING, Any

from .api import FusedOp, fuse, tuning_policy
from .backends import Backend, Capabilities
from .compile import NO_TUNING, STORED, Stored, compile, compile_kernel, compile_loop
from .dtypes import DType
from .errors import (
                     ArgumentError,
                     AttributeError_,
                     AxisError,
                     BroadcastError,
                     DtypeError,
                     FusionError,
                     KernelgenError,
                     ModelError,
                     ShapeError,
                     UnsupportedError,
                     UnsupportedOpError,
                     ValueInputError,
)
from .exec import Executable, Kernel, Program
from .fusion import FusedBlock
from .ir.interp import interpret
from .ir.node import Constant, MathProperties, Op, Placeholder, Value, constant, tensor
from .measure import Measurement, bench
from .ops import (
                     average_pool,
                     batch_normalization,
                     clip,
                     concat,
                     conv,
                     depth_to_space,
                     dropout,
                     expand,
                     flatten,
                     gather,
                     gemm,
                     global_pool,
                     instance_normalization,
                     layer_normalization,
                     log_softmax,
                     lrn,
                     matmul,
                     max_pool,
                     mod,
                     pad,
                     prelu,
                     reshape,
                     resize,
                     softmax,
                     space_to_depth,
                     split,
                     squeeze,
                     transpose,
                     unsqueeze,
                     where,
)
from .ops import cast_op as cast
from .ops import slice_op as slice
from .ops.registry import *  # noqa: F401,F403 - the generated snake_case constructors
from .ops.registry import CONSTRUCTORS, GENERATED, snake
from .options import CacheWarning
from .tune import Measure
from .version import __version__

if TYPE_CHECKING:
    from .graph import ECG, Graph, Session, compile_model, import_onnx, load_model

# The model layer imports onnx (1.4 s of the 2.8 s an ``import kernelgen`` took): it loads when
# one of its names is first asked for, so that processes working at kernel level (the OpenCL
# build workers, a user's fused blocks) start without it.
_MODEL_LAYER = frozenset({"ECG", "Graph", "Session", "compile_model", "import_onnx",
                          "load_model"})


def __getattr__(name: str) -> Any:
    if name in _MODEL_LAYER or name == "graph":
        graph = importlib.import_module(".graph", __name__)  # ``from . import`` would recurse
        return graph if name == "graph" else getattr(graph, name)
    raise AttributeError(f"module 'kernelgen' has no attribute '{name}'")

__all__ = [
    *GENERATED, "ArgumentError", "AttributeError_", "AxisError", "Backend", "BroadcastError",
    "CONSTRUCTORS", "CacheWarning", "Capabilities", "Constant", "DType", "DtypeError", "ECG",
    "Executable", "FusedBlock", "FusedOp", "FusionError", "Graph", "Kernel", "KernelgenError",
    "MathProperties", "Measure", "Measurement", "ModelError", "NO_TUNING", "Op", "Placeholder",
    "Program", "STORED", "Session", "ShapeError", "Stored", "UnsupportedError",
    "UnsupportedOpError", "Value", "ValueInputError", "__version__", "average_pool",
    "batch_normalization", "bench",
    "cast", "clip", "compile", "compile_kernel", "compile_loop", "compile_model", "concat",
    "constant", "conv", "depth_to_space", "dropout", "expand", "flatten", "fuse", "gather", "gemm",
    "global_pool", "import_onnx", "instance_normalization", "interpret", "layer_normalization",
    "load_model", "log_softmax", "lrn", "matmul", "max_pool", "mod", "pad", "prelu", "reshape",
    "resize", "slice", "snake", "softmax", "space_to_depth", "split", "squeeze", "tensor",
    "transpose", "tuning_policy", "unsqueeze", "where",
]
