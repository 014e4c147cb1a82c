"""Operator constructors. Each returns an ``Op``: data that fusion, the emitters and the graph
compiler read."""
from .elementwise import (
                 BINARY,
                 UNARY,
                 binary,
                 cast_op,
                 clip,
                 dropout,
                 mod,
                 prelu,
                 unary,
                 variadic,
                 where,
)
from .nn import (
                 average_pool,
                 batch_normalization,
                 conv,
                 gemm,
                 global_pool,
                 instance_normalization,
                 layer_normalization,
                 lrn,
                 matmul,
                 max_pool,
)
from .reduce import REDUCE_KINDS, log_softmax, reduce_op, softmax
from .shape import (
                 concat,
                 depth_to_space,
                 expand,
                 flatten,
                 gather,
                 pad,
                 reshape,
                 resize,
                 slice_op,
                 space_to_depth,
                 split,
                 squeeze,
                 transpose,
                 unsqueeze,
)

__all__ = [
    "BINARY", "REDUCE_KINDS", "UNARY", "average_pool", "batch_normalization", "binary",
    "cast_op", "clip", "concat", "conv", "depth_to_space", "dropout", "expand", "flatten", "gather",
    "gemm", "global_pool", "instance_normalization", "layer_normalization", "log_softmax", "lrn",
    "matmul", "max_pool", "mod", "pad", "prelu", "reduce_op", "reshape", "resize", "slice_op",
    "softmax", "space_to_depth", "split", "squeeze", "transpose", "unary", "unsqueeze",
    "variadic", "where",
]
