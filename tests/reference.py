"""Independent reference semantics: evaluate a kernelgen operator with ONNX's reference evaluator.

Each operator becomes a one-node ONNX model (attributes that ONNX passes as inputs, like
Reshape's shape or Slice's starts, become initializers), run by ``onnx.reference``. Nothing here
uses kernelgen's own index maps or bodies, so a kernel that matches this matches ONNX.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import kernelgen as kg

_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
          "float64": TensorProto.DOUBLE, "int32": TensorProto.INT32,
          "int64": TensorProto.INT64, "bool": TensorProto.BOOL}

# operator -> names of ONNX inputs that kernelgen takes as attributes, in ONNX input order
_ATTR_INPUTS: dict[str, tuple[str, ...]] = {
    "Reshape": ("shape",), "Expand": ("shape",), "Slice": ("starts", "ends", "axes", "steps"),
    "Pad": ("pads", "constant_value", "axes"), "Squeeze": ("axes",), "Unsqueeze": ("axes",),
    "Split": ("split",), "Resize": ("roi", "scales", "sizes"),
    **{k: ("axes",) for k in kg.ops.REDUCE_KINDS},
}
_FLOAT_INPUTS = {"constant_value", "scales", "roi"}
_DROP = {"Split": {"output"}, "Clip": {"min", "max"}}


def _tensor(name: str, value: Any, dtype: np.dtype | None = None) -> onnx.TensorProto:
    arr = np.asarray(value, dtype=dtype)
    return numpy_helper.from_array(arr, name)


def onnx_node_model(op: kg.Op, input_dtypes: Sequence[str]) -> tuple[onnx.ModelProto, list[str]]:
    """A one-node ONNX model computing ``op``; returns it and the names of its runtime inputs."""
    kind = "Split" if op.kind == "Split" else op.kind
    attrs = {k: v for k, v in op.attrs.items() if k not in _DROP.get(kind, set())}
    runtime = [f"in{k}" for k in range(len(op.inputs))]
    inits: list[onnx.TensorProto] = []
    node_inputs = list(runtime)
    if kind == "Clip":
        node_inputs = ["in0"]
        extra = iter(runtime[1:])
        for bound in ("min", "max"):
            v = op.attrs.get(bound)
            if v is None:
                node_inputs.append("")
            elif isinstance(v, kg.Value):
                node_inputs.append(next(extra))
            else:
                inits.append(_tensor(bound, v, op.inputs[0].dtype.numpy))
                node_inputs.append(bound)
    for name in _ATTR_INPUTS.get(kind, ()):
        value = attrs.pop(name, None)
        if value is None or (name == "axes" and kind.startswith("Reduce") and value == []):
            node_inputs.append("")
            continue
        dtype = op.inputs[0].dtype.numpy if name == "constant_value" else (
            np.float32 if name in _FLOAT_INPUTS else np.int64)
        inits.append(_tensor(name, value, dtype))
        node_inputs.append(name)
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    if kind == "BatchNormalization" and len(op.inputs) == 3:
        # constant parameters are read as x * s + t (ops.nn.batch_normalization): ONNX's
        # formula with mean 0, variance 1 and epsilon 0 computes the same
        channels, dtype = op.inputs[1].shape, op.inputs[0].dtype.numpy
        inits += [_tensor("mean", np.zeros(channels), dtype),
                  _tensor("var", np.ones(channels), dtype)]
        node_inputs += ["mean", "var"]
        attrs["epsilon"] = 0.0
    outputs = ["out"]
    if kind == "Split":
        attrs.pop("split", None)
        inits.append(_tensor("split", op.attrs["split"], np.int64))
        node_inputs = ["in0", "split"]
        outputs = [f"out{k}" for k in range(len(op.attrs["split"]))]
    if kind == "Cast":
        attrs["to"] = _TYPES[attrs["to"]]
    if kind.startswith("Reduce"):
        attrs.pop("axes", None)
    if kind in ("Sum", "Mean", "Max", "Min") and not attrs:
        pass
    node = helper.make_node(kind, node_inputs, outputs, **{k: v for k, v in attrs.items()
                                                          if v is not None})
    ins = [helper.make_tensor_value_info(n, _TYPES[d], None) for n, d in zip(runtime, input_dtypes)]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    graph = helper.make_graph([node], "one_op", ins, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model, runtime


def reference(op: kg.Op, *arrays: np.ndarray) -> np.ndarray:
    """``op`` evaluated by ``onnx.reference`` on ``arrays`` (its inputs, in order)."""
    model, names = onnx_node_model(op, [str(v.dtype) for v in op.inputs])
    results = _evaluator(model.SerializeToString())(None, dict(zip(names, arrays)))
    out = results[op.attrs["output"]] if op.kind == "Split" else results[0]
    return np.asarray(out)


@lru_cache(maxsize=512)
def _evaluator(serialized: bytes) -> Any:
    model = onnx.ModelProto()
    model.ParseFromString(serialized)
    return ReferenceEvaluator(model).run


def evaluate_chain(ops: Sequence[kg.Op], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate operators one after another with the reference; returns every value by name."""
    values = dict(feeds)
    for op in ops:
        values[op.name] = reference(op, *(values[v.name] for v in op.inputs))
    return values


def lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float
                  ) -> np.ndarray:
    """ONNX LRN as its definition states it, in float64: onnx 1.23's reference evaluator
    loops over the batch axis where it means the channels (``onnx/reference/ops/op_lrn.py``),
    so it is no arbiter for LRN (tests/graph/test_model_ops.py checks this one against
    onnxruntime)."""
    x64 = x.astype(np.float64)
    out = np.empty_like(x64)
    c = x.shape[1]
    for ch in range(c):
        lo = max(0, ch - (size - 1) // 2)
        hi = min(c - 1, ch + -(-(size - 1) // 2))
        square_sum = (x64[:, lo:hi + 1] ** 2).sum(axis=1)
        out[:, ch] = x64[:, ch] / (bias + alpha / size * square_sum) ** beta
    return out.astype(x.dtype)
