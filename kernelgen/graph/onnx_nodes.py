"""One ONNX node as kernelgen operators, through the one operator table (``CONSTRUCTORS``).

ONNX passes some attributes as tensors (Reshape's shape, Slice's starts, Pad's pads, Resize's
scales, Clip's bounds, reduction axes, ...), and which ones changed with the opset. Here they
are read from known arrays into the keyword arguments the constructors take under ONNX's
attribute names (``_VALUE_INPUTS``), renamed or dropped attributes of older opsets are mapped
(``_RENAMED``, ``_IGNORED``), and the few operators whose meaning changed with the opset are
built from the table's constructors (Softmax before opset 13 flattens, Upsample and Resize-10
are nearest resizes). Errors name the node, its op type and what is missing.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from onnx import AttributeProto, NodeProto, helper, numpy_helper

from ..errors import UnsupportedOpError, ValueInputError
from ..ir.node import Value, constant
from ..ops.reduce import REDUCE_KINDS
from ..ops.registry import CONSTRUCTORS

Known = np.ndarray
Entry = Known | Value  # what a name stands for during import: a known array or a tensor


@dataclass
class Node:
    """An ONNX node as the importer reads it: attributes decoded, the opset of its domain."""

    name: str
    op_type: str
    opset: int
    inputs: list[str]   # '' for an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any]

    @classmethod
    def of(cls, proto: NodeProto, opset: int, index: int) -> Node:
        name = proto.name or (proto.output[0] if proto.output else f"#{index}")
        attrs = {a.name: _attribute(a, name, proto.op_type) for a in proto.attribute}
        return cls(name, proto.op_type, opset, list(proto.input), list(proto.output), attrs)

    def as_cast(self, dtype: Any) -> Node:
        """CastLike as the Cast it is: to the dtype of its second input, which is not read."""
        to = helper.np_dtype_to_tensor_dtype(np.dtype(str(dtype)))
        return replace(self, op_type="Cast", inputs=self.inputs[:1],
                       attrs={**self.attrs, "to": to})

    def unsupported(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(what, self.name, self.op_type)


def _attribute(attr: AttributeProto, node: str, op_type: str) -> Any:
    if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR,
                     AttributeProto.SPARSE_TENSORS, AttributeProto.TYPE_PROTO):
        raise UnsupportedOpError(f"attribute '{attr.name}' is a subgraph, sparse tensor or type "
                                 "(control flow and sparse tensors are not supported)", node,
                                 op_type)
    if attr.ref_attr_name:
        raise UnsupportedOpError(f"attribute '{attr.name}' refers to a function attribute",
                                 node, op_type)
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if attr.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(value)
    if attr.type == AttributeProto.STRINGS:
        return [v.decode() for v in value]
    return list(value) if isinstance(value, (list, tuple)) else value


def _ints(node: Node, value: Known) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _floats(node: Node, value: Known) -> list[float] | None:
    flat = np.asarray(value).reshape(-1)
    return [float(v) for v in flat] if flat.size else None  # empty: "not given" (Resize)


def _scalar(node: Node, value: Known) -> Any:
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise node.unsupported(f"expected a single value, got shape {np.shape(value)}")
    return flat[0].item()


# op type -> (the first opset passing them as inputs, ((input index, keyword, reader), ...))
Reader = Callable[[Node, Known], Any]
_AXES: tuple[tuple[int, str, Reader], ...] = ((1, "axes", _ints),)
_VALUE_INPUTS: dict[str, tuple[int, tuple[tuple[int, str, Reader], ...]]] = {
    "Reshape": (5, ((1, "shape", _ints),)),
    "Expand": (8, ((1, "shape", _ints),)),
    "Tile": (6, ((1, "repeats", _ints),)),
    "ConstantOfShape": (9, ((0, "shape", _ints),)),
    "Slice": (10, ((1, "starts", _ints), (2, "ends", _ints), (3, "axes", _ints),
                   (4, "steps", _ints))),
    "Pad": (11, ((1, "pads", _ints), (2, "constant_value", _scalar), (3, "axes", _ints))),
    "Clip": (11, ((1, "min", _scalar), (2, "max", _scalar))),
    "Split": (13, ((1, "split", _ints),)),
    "Squeeze": (13, _AXES), "Unsqueeze": (13, _AXES),
    **{k: (13 if k == "ReduceSum" else 18, _AXES) for k in REDUCE_KINDS},
    "Resize": (11, ((1, "roi", _floats), (2, "scales", _floats), (3, "sizes", _ints))),
    "Upsample": (9, ((1, "scales", _floats),)),
    "Dropout": (12, ((1, "ratio", _scalar), (2, "training_mode", _scalar))),
}
_RESIZE_10 = ((1, "scales", _floats),)
# inputs that may stay tensors where the constructor takes one (Clip's bounds)
_TENSOR_OK = {("Clip", "min"), ("Clip", "max")}

# attributes of older opsets under their current names
_RENAMED = {"Pad": {"value": "constant_value", "paddings": "pads"}}
# attributes the constructors do not take, and the values that make them irrelevant
_ANY = object()
_IGNORED: dict[str, dict[str, Any]] = {
    "BatchNormalization": {"spatial": 1, "is_test": _ANY, "consumed_inputs": _ANY},
    "Dropout": {"is_test": _ANY, "consumed_inputs": _ANY},
    "Gemm": {"broadcast": _ANY},
    "Resize": {"cubic_coeff_a": _ANY, "exclude_outside": 0, "extrapolation_value": _ANY,
               "antialias": 0, "keep_aspect_ratio_policy": "stretch"},
    "Cast": {"saturate": _ANY, "round_mode": _ANY},
    **{k: {"consumed_inputs": _ANY} for k in ("Add", "Sub", "Mul", "Div", "Relu", "Sum",
                                              "Max", "Min", "Mean", "Neg", "Abs", "Exp",
                                              "Log", "Sqrt", "Sigmoid", "Tanh", "Clip")},
}
# the outputs after the first that a node may have but nobody may read
EXTRA_OUTPUTS = {"MaxPool": "Indices", "Dropout": "mask", "BatchNormalization": "running stats"}


def keywords(node: Node, env: Callable[[str], Entry]) -> tuple[list[str], dict[str, Any]]:
    """(data input names, keyword arguments): the node's attributes under the constructors'
    names, with the inputs ONNX passes as tensors read into them, and the names of the inputs
    left to compute on ('' for an omitted optional one; trailing omitted ones dropped)."""
    attrs = dict(node.attrs)
    for old, new in _RENAMED.get(node.op_type, {}).items():
        if old in attrs:
            attrs[new] = attrs.pop(old)
    for key, harmless in _IGNORED.get(node.op_type, {}).items():
        if key in attrs:
            value = attrs.pop(key)
            if harmless is not _ANY and value != harmless:
                raise node.unsupported(f"attribute '{key}'={value!r} is not supported (only "
                                       f"{harmless!r})")
    if node.op_type == "Cast":
        attrs["to"] = helper.tensor_dtype_to_np_dtype(attrs["to"])
    since, spec = _VALUE_INPUTS.get(node.op_type, (0, ()))
    if node.op_type == "Resize" and node.opset < 11:
        since, spec = 10, _RESIZE_10
    taken = set()
    if node.opset >= since:
        for index, key, read in spec:
            taken.add(index)
            name = node.inputs[index] if index < len(node.inputs) else ""
            if name:
                attrs[key] = _value_input(node, index, key, name, env(name), read)
    data = [n for i, n in enumerate(node.inputs) if i not in taken]
    while data and not data[-1]:
        data.pop()
    return data, attrs


def _value_input(node: Node, index: int, key: str, name: str, value: Entry, read: Reader) -> Any:
    if not isinstance(value, Value):
        return read(node, value)
    if (node.op_type, key) in _TENSOR_OK:
        return value
    raise ValueInputError(f"input {index} ('{key}', tensor '{name}') must be known at import "
                          "(a constant, or computed from shapes); it depends on the graph's "
                          "inputs", node.name, node.op_type, tensor=name)


def build(node: Node, data: Sequence[Value | None], kwargs: dict[str, Any],
          ranks: Sequence[int | None]) -> list[Value]:
    """The node's outputs as kernelgen operators (one per ONNX output it computes). ``ranks``
    are the ONNX ranks of the data inputs: a 0-d constant arrives as a 1-element tensor."""
    if node.op_type == "Gather" and len(ranks) > 1 and ranks[1] == 0:
        return _gather_scalar(node, list(data), kwargs)
    special = _SPECIAL.get(node.op_type)
    if special is not None:
        return special(node, list(data), kwargs)
    ctor = CONSTRUCTORS.get(node.op_type)
    if ctor is None:
        raise node.unsupported("no kernelgen operator implements this op type (the operator "
                               "table is kernelgen.CONSTRUCTORS)")
    _check_keywords(node, ctor, kwargs)
    out = ctor(*data, **kwargs)
    return list(out) if isinstance(out, tuple) else [out]


def _check_keywords(node: Node, ctor: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    params = inspect.signature(ctor).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return  # the generated unary constructors check their attributes themselves
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        known = [p for p in params if params[p].kind is params[p].POSITIONAL_OR_KEYWORD]
        raise node.unsupported(f"attribute(s) {unknown} are not supported (the operator "
                               f"takes {known})")


def _concat(node: Node, data: list[Value | None], kw: dict[str, Any]) -> list[Value]:
    return [CONSTRUCTORS["Concat"]([v for v in data if v is not None], **kw)]


def _split(node: Node, data: list[Value | None], kw: dict[str, Any]) -> list[Value]:
    if kw.get("split") is None and kw.get("num_outputs") is None:
        kw["num_outputs"] = len(node.outputs)  # before opset 18: equal parts, one per output
    return list(CONSTRUCTORS["Split"](data[0], **kw))


def _softmax(node: Node, data: list[Value | None], kw: dict[str, Any]) -> list[Value]:
    """Softmax, LogSoftmax: before opset 13 the input is flattened to 2-D at ``axis``
    (default 1) and normalised along the whole second half."""
    x, ctor = data[0], CONSTRUCTORS[node.op_type]
    assert x is not None
    if node.opset >= 13:
        return [ctor(x, **kw)]
    axis = kw.get("axis", 1)
    axis = axis + x.rank if axis < 0 else axis
    if axis == x.rank - 1:
        return [ctor(x, axis=-1)]
    flat = CONSTRUCTORS["Flatten"](x, axis=axis)
    return [CONSTRUCTORS["Reshape"](ctor(flat, axis=1), shape=list(x.shape))]


def _pow(node: Node, data: list[Value | None], kw: dict[str, Any]) -> list[Value]:
    """ONNX Pow lets the exponent's type differ from the base's (float32 ** int64): the
    exponent is cast to the base's float type, which is what the result has."""
    x, y = data[0], data[1]
    assert x is not None and y is not None
    if y.dtype != x.dtype and x.dtype.is_float:
        y = CONSTRUCTORS["Cast"](y, to=x.dtype)
    return [CONSTRUCTORS["Pow"](x, y, **kw)]


def _layer_norm(node: Node, data: list[Value | None], kw: dict[str, Any]) -> list[Value]:
    """LayerNormalization's Y, and where the node names them, its Mean and InvStdDev outputs
    (shape kept, normalised axes of size 1) in the stash type: separate reductions, which a
    plan fuses with Y's kernel or not as it does any other reduction."""
    y = CONSTRUCTORS["LayerNormalization"](*data, **kw)
    if len([o for o in node.outputs if o]) < 2:
        return [y]
    x = data[0]
    assert x is not None
    stash = helper.tensor_dtype_to_np_dtype(kw.get("stash_type", 1))
    if str(x.dtype) != str(stash):
        x = CONSTRUCTORS["Cast"](x, to=stash)
    axes = list(range(y.attrs["axis"], x.rank))
    mean = CONSTRUCTORS["ReduceMean"](x, axes=axes, keepdims=1)
    centred = CONSTRUCTORS["Sub"](x, mean)
    variance = CONSTRUCTORS["ReduceMean"](CONSTRUCTORS["Mul"](centred, centred), axes=axes,
                                          keepdims=1)
    epsilon = constant(f"{node.name}/epsilon", np.array([kw.get("epsilon", 1e-5)], stash))
    shifted = CONSTRUCTORS["Add"](variance, epsilon)
    return [y, mean, CONSTRUCTORS["Reciprocal"](CONSTRUCTORS["Sqrt"](shifted))]


def _gather_scalar(node: Node, data: list[Value | None], kw: dict[str, Any]) -> list[Value]:
    """A scalar index drops the gathered axis: gather at a 1-element index, then squeeze."""
    x, indices = data[0], data[1]
    assert x is not None and indices is not None
    op = CONSTRUCTORS["Gather"](x, indices, **kw)
    return [CONSTRUCTORS["Squeeze"](op, axes=[kw.get("axis", 0) % x.rank])]


def _upsample(node: Node, data: list[Value | None], kw: dict[str, Any]) -> list[Value]:
    """Upsample (opsets 7-9) and Resize-10: nearest resize of asymmetric coordinates, rounding
    down (onnxruntime's rule for these opsets when upsampling)."""
    mode = kw.pop("mode", "nearest")
    scales = kw.pop("scales", None)
    if mode != "nearest":
        raise node.unsupported(f"mode '{mode}' (only 'nearest')")
    if kw:
        raise node.unsupported(f"attribute(s) {sorted(kw)} are not supported")
    if scales is None or any(s < 1 for s in scales):
        raise node.unsupported(f"scales {scales}: only upsampling (every scale >= 1) at this "
                               "opset")
    return [CONSTRUCTORS["Resize"](data[0], scales=scales,
                                   coordinate_transformation_mode="asymmetric",
                                   nearest_mode="floor")]


def _resize(node: Node, data: list[Value | None], kw: dict[str, Any]) -> list[Value]:
    if node.opset < 11:
        return _upsample(node, data, kw)
    kw.pop("roi", None)  # only read by tf_crop_and_resize, which the constructor refuses
    if kw.get("axes") is not None:
        raise node.unsupported("attribute 'axes' is not supported (scales or sizes for every "
                               "axis)")
    kw.pop("axes", None)
    _check_keywords(node, CONSTRUCTORS["Resize"], kw)
    return [CONSTRUCTORS["Resize"](data[0], **kw)]


_SPECIAL: dict[str, Callable[[Node, list[Value | None], dict[str, Any]], list[Value]]] = {
    "Concat": _concat, "Split": _split, "Softmax": _softmax, "LogSoftmax": _softmax,
    "Upsample": _upsample, "Resize": _resize, "Pow": _pow,
    "LayerNormalization": _layer_norm,
}
