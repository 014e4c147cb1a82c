"""Small ONNX graphs built with ``onnx.helper`` for the importer and executor tests, and the
helpers that build and check them against onnxruntime.

Each case is (name, model, feeds): graphs written the way exporters write them (shapes computed
at run time, attributes passed as tensors, Constant nodes, several outputs), small enough that
the IR interpreter runs them in milliseconds.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(21)
F = TensorProto.FLOAT


def init(name: str, value: Any, dtype: Any = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def io(name: str, shape: Sequence[int | str], elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: Sequence[onnx.TensorProto] = (),
          opset: int = 17, name: str = "g") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def conv_relu_add() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv -> Relu, plus a residual Add and a second output read by nothing else."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["y"]),
             helper.make_node("Sigmoid", ["y"], ["z"])]
    inits = [init("w", randn(4, 4, 3, 3, scale=0.3)), init("b", randn(4, scale=0.1))]
    m = model(nodes, [io("x", (1, 4, 7, 5))], [io("y", (1, 4, 7, 5)), io("z", (1, 4, 7, 5))], inits)
    return m, {"x": randn(1, 4, 7, 5)}


def attention_shapes() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Reshape whose shape comes from Shape -> Gather -> Unsqueeze -> Concat, a Constant node,
    MatMul, Softmax on the last axis, Transpose."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Constant", [], ["i0"], value=init("i0v", 0, np.int64)),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
             helper.make_node("Concat", ["b1", "rest"], ["shape"], axis=0),
             helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["h"]),
             helper.make_node("Transpose", ["h"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Softmax", ["t"], ["y"], axis=-1)]
    inits = [init("ax0", [0], np.int64), init("rest", [5, 2, 3], np.int64),
             init("w", randn(6, 6, scale=0.5))]
    m = model(nodes, [io("x", (3, 5, 6))], [io("y", (3, 2, 5, 3))], inits)
    return m, {"x": randn(3, 5, 6)}


def feed_forward() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """relu(x W + b) with W an initializer of 1.1 MiB over 37 rows: a contraction whose
    constant operand OpenCL packs once (``Launch.pack_once``)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    inits = [init("w", randn(269, 1031, scale=0.06)), init("b", randn(1031))]
    m = model(nodes, [io("x", (37, 269))], [io("y", (37, 1031))], inits)
    return m, {"x": randn(37, 269)}


def value_inputs() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Attributes ONNX passes as tensors: Slice's starts/ends/axes/steps, Pad's pads, Clip's
    bounds, ReduceMean's axes (opset 18), Split's sizes into two outputs, Resize's scales."""
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["sl"]),
             helper.make_node("Pad", ["sl", "pads", "pv"], ["pd"], mode="constant"),
             helper.make_node("Clip", ["pd", "lo", "hi"], ["cl"]),
             helper.make_node("ReduceMean", ["cl", "rax"], ["rm"], keepdims=1),
             helper.make_node("Split", ["cl", "sizes"], ["s0", "s1"], axis=1),
             helper.make_node("Resize", ["s1", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Mul", ["s0", "rm"], ["y"])]
    inits = [init("st", [0, 1], np.int64), init("en", [100, -1], np.int64),
             init("ax", [1, 3], np.int64), init("sp", [1, 2], np.int64),
             init("pads", [0, 0, 1, 0, 0, 0, 0, 2], np.int64), init("pv", 0.5),
             init("lo", -0.7), init("hi", 0.9), init("rax", [2, 3], np.int64),
             init("sizes", [1, 3], np.int64), init("scales", [1, 1, 2, 2])]
    m = model(nodes, [io("x", (2, 4, 3, 9))], [io("y", (2, 4, 4, 6)), io("up", (2, 3, 8, 12))],
              inits, opset=18)
    return m, {"x": randn(2, 4, 3, 9)}


def old_opset() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Opset 11: Softmax flattens at axis 1; Gemm, Flatten, BatchNormalization, AveragePool."""
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "bb", "m", "v"], ["bn"],
                              epsilon=1e-3),
             helper.make_node("AveragePool", ["bn"], ["ap"], kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Flatten", ["ap"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "w", "c"], ["gm"], transB=1, alpha=0.5),
             helper.make_node("Softmax", ["ap"], ["sm"], axis=1)]
    inits = [init("g", rng.uniform(0.5, 1.5, 3)), init("bb", randn(3, scale=0.1)),
             init("m", randn(3, scale=0.1)), init("v", rng.uniform(0.5, 1.5, 3)),
             init("w", randn(5, 12, scale=0.3)), init("c", randn(5, scale=0.1))]
    m = model(nodes, [io("x", (2, 3, 4, 4))], [io("gm", (2, 5)), io("sm", (2, 3, 2, 2))], inits,
              opset=11)
    return m, {"x": randn(2, 3, 4, 4)}


CASES = {"conv_relu_add": conv_relu_add, "attention_shapes": attention_shapes,
         "value_inputs": value_inputs, "old_opset": old_opset}


def onnxruntime_run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs by name from onnxruntime (CPU, no graph optimisation, so that its
    own rewrites are no part of the reference)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(m.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))
