"""ONNX models as kernelgen graphs (``import_onnx``).

    graph = import_onnx("resnet50.onnx", input_shapes={"data": (1, 3, 224, 224)})

The path: load; check the structure with messages that name the node (a name nothing defines,
a graph output nothing produces, a cycle, an initializer whose data or shape is wrong), then
ONNX's checker; fix the inputs' shapes (``input_shapes`` for symbolic dimensions); ONNX shape
inference, whose shapes every imported value is checked against; then each node in topological
order: nodes whose inputs are all known are computed now (``onnx_fold``; Constant, Shape and
ConstantOfShape included), the rest become operators through ``CONSTRUCTORS``
(``onnx_nodes``), Identity and Dropout pass their input through. Initializers that operators
read become ``kg.constant``s; graph inputs that have an initializer are constants too (IR
version 3 models list every weight as an input).
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, helper

from ..errors import (AttributeError_, KernelgenError, ModelError, UnsupportedError,
                      UnsupportedOpError)
from ..fusion import fuse
from ..ir.interp import interpret
from ..ir.node import Constant, Op, Placeholder, Value, constant, tensor
from ..lower import lower
from ..ops.registry import CONSTRUCTORS
from .model import Graph
from .onnx_check import check_structure, inference_model
from .onnx_fold import fold
from .onnx_nodes import EXTRA_OUTPUTS, Entry, Node, build, keywords

ModelLike = str | os.PathLike | bytes | ModelProto
InputShapes = Mapping[str, Sequence[int]]
_DOMAINS = ("", "ai.onnx")
OPSETS = (7, 28)  # the default-domain opsets accepted (tested: 9 and 11 to 28)


def load_model(model: ModelLike) -> ModelProto:
    """A ``ModelProto`` from a path, serialized bytes or a ``ModelProto``; a file that is not a
    model is a ``ModelError``."""
    if isinstance(model, ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            proto = ModelProto()
            proto.ParseFromString(bytes(model))
            return proto
        return onnx.load(os.fspath(model))
    except (OSError, onnx.onnx_cpp2py_export.checker.ValidationError) as exc:
        raise ModelError(f"cannot read the ONNX model {model!r:.80}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ModelError(f"{model!r:.80} is not an ONNX model ({type(exc).__name__}: "
                         f"{exc})") from exc


def import_onnx(model: ModelLike, input_shapes: InputShapes | None = None) -> Graph:
    """The kernelgen ``Graph`` of an ONNX model (a path, bytes or a ``ModelProto``).
    ``input_shapes`` fixes the graph inputs' shapes by name (required for symbolic dimensions).
    Raises ``ModelError`` for a malformed model and ``UnsupportedOpError`` for a node kernelgen
    cannot build, each naming the node, its op type and what is wrong or missing."""
    proto = load_model(model)
    opset = _opset(proto)
    arrays, nodes = check_structure(proto.graph)
    _check(proto, nodes)
    return _Importer(proto, nodes, opset, arrays, dict(input_shapes or {})).run()


def check_model(model: ModelLike) -> ModelProto:
    """The model as a ``ModelProto`` after the checks ``import_onnx`` makes before building
    anything (opset, structure, ONNX's checker); a ``ModelError`` names what is wrong."""
    proto = load_model(model)
    _opset(proto)
    _, nodes = check_structure(proto.graph)
    _check(proto, nodes)
    return proto


def _opset(proto: ModelProto) -> int:
    versions = {o.domain: o.version for o in proto.opset_import}
    version = versions.get("", versions.get("ai.onnx"))
    if version is None:
        raise ModelError("the model imports no opset of the default ONNX domain")
    if not OPSETS[0] <= version <= OPSETS[1]:
        raise ModelError(f"opset {version} of the default domain is not supported "
                         f"({OPSETS[0]} to {OPSETS[1]})")
    return version


def _check(proto: ModelProto, nodes: list[onnx.NodeProto]) -> None:
    """ONNX's checker, on the nodes in topological order."""
    if list(proto.graph.node) != nodes:
        proto = _with_nodes(proto, nodes)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"the model fails the ONNX checker: {exc}", *_culprit(str(exc))
                         ) from exc


def _culprit(message: str) -> tuple[str | None, str | None]:
    """(node name, op type) where ONNX's checker or shape inference names them."""
    found = (re.search(r"Name: (\S*) OpType: (\S+)", message)
             or re.search(r"op_type:(\w+), node name: ([^)]*)\)", message))
    if found is None:
        return None, None
    if found.re.pattern.startswith("op_type"):
        return found.group(2), found.group(1)
    return found.group(1) or None, found.group(2)


def _with_nodes(proto: ModelProto, nodes: list[onnx.NodeProto]) -> ModelProto:
    copy = ModelProto()
    copy.CopyFrom(proto)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


class _Importer:
    def __init__(self, proto: ModelProto, nodes: list[onnx.NodeProto], opset: int,
                 arrays: dict[str, np.ndarray], input_shapes: dict[str, Sequence[int]]) -> None:
        self.proto, self.nodes, self.opset = proto, nodes, opset
        self.env: dict[str, Entry] = dict(arrays)  # initializers, then every node output
        self.constants: dict[str, Constant] = {}
        self.inputs = _inputs(proto.graph, arrays, input_shapes)
        self.env.update((v.name, v) for v in self.inputs)
        self.used = {n for node in nodes for n in node.input} | {o.name for o in
                                                                 proto.graph.output}
        self.taken = {n for node in nodes for n in (*node.input, *node.output)} | set(self.env)
        self.inferred = _inferred(proto, nodes, self.inputs)

    def run(self) -> Graph:
        for k, proto_node in enumerate(self.nodes):
            if proto_node.domain not in _DOMAINS:
                name = proto_node.name or proto_node.output[0]
                raise ModelError(f"domain '{proto_node.domain}' is not supported (only the "
                                 "default ONNX domain)", name, proto_node.op_type)
            node = Node.of(proto_node, self.opset, k)
            try:
                outs = self._node(node)
            except ModelError:
                raise
            except (AttributeError_, UnsupportedError) as exc:  # an attribute value kernelgen lacks
                raise UnsupportedOpError(str(exc), node.name, node.op_type) from exc
            except KernelgenError as exc:
                raise ModelError(str(exc), node.name, node.op_type) from exc
            self._bind(node, outs)
        outputs = {o.name: self._value(o.name) for o in self.proto.graph.output}
        return Graph.build(self.inputs, outputs, self.proto.graph.name or "model")

    def _node(self, node: Node) -> list[Entry]:
        if node.op_type == "CastLike":
            node = node.as_cast(self.env[node.inputs[1]].dtype)
        if node.op_type == "Constant":
            return [_constant_node(node)]
        if node.op_type in ("Shape", "Size"):
            return [_shape_of(node, self.env[node.inputs[0]])]
        names, kwargs = keywords(node, self.env.__getitem__)
        if node.op_type == "ConstantOfShape":
            kwargs.setdefault("value", np.zeros(1, np.float32))
        entries = [self.env[n] if n else None for n in names]
        if not any(isinstance(e, Value) for e in (*entries, *kwargs.values())):
            folded = self._fold(node, entries, kwargs)
            if folded is not None:
                return list(folded)
        if node.op_type in ("Identity", "Dropout"):
            CONSTRUCTORS[node.op_type](self._value(names[0]), **kwargs)  # checks attributes
            return [self.env[names[0]]]
        data = [self._value(n) if n else None for n in names]
        ranks = [np.ndim(e) if isinstance(e, np.ndarray) else None for e in entries]
        outs = build(node, data, kwargs, ranks)
        self._name_ops(node, outs)
        return list(outs)

    def _fold(self, node: Node, arrays: list[Any], kwargs: dict[str, Any]
              ) -> list[np.ndarray] | None:
        """The node's outputs computed now; None when it has no data input (nothing to fold)."""
        if not arrays and node.op_type != "ConstantOfShape":
            return None
        try:
            out = fold(node.op_type, arrays, kwargs)
            if out is None and node.op_type in CONSTRUCTORS:
                out = _interpret(node, arrays, kwargs)
        except KernelgenError:
            raise
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise ModelError(f"cannot compute it on its constant inputs: {exc}", node.name,
                             node.op_type) from exc
        return out

    def _value(self, name: str) -> Value:
        """The tensor ``name`` stands for: a known array becomes a constant, once."""
        entry = self.env[name]
        if isinstance(entry, Value):
            return entry
        if name not in self.constants:
            array = entry if entry.ndim else entry.reshape(1)
            self.constants[name] = constant(name, array)
        return self.constants[name]

    def _name_ops(self, node: Node, outs: list[Value]) -> None:
        """The node's operators take its output names; operators it built on the way (Softmax
        before opset 13 flattens first) and constants it computed take fresh names derived
        from the node's."""
        known = {id(v) for v in self.env.values() if isinstance(v, Value)}
        known |= {id(c) for c in self.constants.values()}
        renamed = {}  # an operator's own name -> its node output's
        for out, name in zip(outs, node.outputs):
            if isinstance(out, Op):
                renamed[out.name], out.name = name, name
        stack = [v for out in outs if isinstance(out, Op) for v in out.inputs]
        while stack:
            v = stack.pop()
            if id(v) in known or not isinstance(v, (Op, Constant)):
                continue
            known.add(id(v))
            if isinstance(v, Constant):  # computed from the node's constants (BN's s and t)
                owner, _, part = v.name.rpartition("_")
                v.name = self._fresh(f"{renamed.get(owner, node.name)}/{part or v.name}")
                continue
            v.name = self._fresh(f"{node.name}/{v.kind}")
            stack.extend(v.inputs)

    def _fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def _bind(self, node: Node, outs: list[Entry]) -> None:
        for k, name in enumerate(node.outputs):
            if not name:
                continue
            if k >= len(outs):
                if name in self.used:
                    what = EXTRA_OUTPUTS.get(node.op_type, "an output kernelgen does not "
                                                          "compute")
                    raise ModelError(f"output {k} ('{name}', {what}) is read, but only the "
                                     f"first {len(outs)} output(s) are computed", node.name,
                                     node.op_type)
                continue
            self.env[name] = outs[k]
            self._check_inferred(node, name, outs[k])

    def _check_inferred(self, node: Node, name: str, value: Entry) -> None:
        """ONNX shape inference and kernelgen agree on every value's shape and dtype."""
        inferred = self.inferred.get(name)
        if inferred is None:
            return
        shape, dtype = inferred
        got = tuple(value.shape)
        if shape is not None and got != shape and not (_numel(got) == _numel(shape) == 1):
            raise ModelError(f"output '{name}' has shape {got}, where ONNX shape inference "
                             f"gives {shape}", node.name, node.op_type)
        got_dtype = value.dtype.numpy if isinstance(value, Value) else value.dtype
        if dtype is not None and np.dtype(got_dtype) != dtype:
            raise ModelError(f"output '{name}' has dtype {np.dtype(got_dtype)}, where ONNX "
                             f"shape inference gives {dtype}", node.name, node.op_type)


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _constant_node(node: Node) -> np.ndarray:
    attrs = node.attrs
    for key, dtype in (("value", None), ("value_float", np.float32),
                       ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    raise node.unsupported(f"attribute(s) {sorted(attrs)}: only value, value_float(s) and "
                           "value_int(s) constants are supported")


def _shape_of(node: Node, entry: Entry) -> np.ndarray:
    shape = np.asarray(entry.shape, dtype=np.int64)
    if node.op_type == "Size":
        return np.asarray(shape.prod(), dtype=np.int64)
    start, end = node.attrs.get("start", 0), node.attrs.get("end")
    return shape[start:end]


def _interpret(node: Node, arrays: list[Any], kwargs: dict[str, Any]) -> list[np.ndarray]:
    """A node without a NumPy folder, on known inputs: its kernelgen operator run by the IR
    interpreter (0-d inputs as 1-element tensors, given back 0-d when all were)."""
    values = [constant(f"fold{k}", a if a.ndim else a.reshape(1)) if a is not None else None
              for k, a in enumerate(arrays)]
    outs = build(node, values, kwargs, [None if a is None else a.ndim for a in arrays])
    results = []
    for out in outs:
        if not isinstance(out, Op):
            results.append(np.asarray(out.value))  # type: ignore[attr-defined]
            continue
        block = fuse(*_chain(out), force=True)
        given = {v.name: v.value for v in values if v is not None}
        (result,) = interpret(lower(block), *(given[v.name] for v in block.inputs))
        scalar = all(a is None or a.ndim == 0 for a in arrays) and result.size == 1
        results.append(result.reshape(()) if scalar else result)
    return results


def _chain(out: Op) -> list[Op]:
    ops: list[Op] = []
    stack: list[Value] = [out]
    while stack:
        v = stack.pop()
        if isinstance(v, Op) and all(v is not o for o in ops):
            ops.append(v)
            stack.extend(v.inputs)
    return ops


def _inputs(graph: onnx.GraphProto, arrays: dict[str, np.ndarray],
            shapes: dict[str, Sequence[int]]) -> list[Placeholder]:
    """The graph inputs a caller feeds (those without an initializer), with concrete shapes."""
    declared = [i for i in graph.input if i.name not in arrays]
    unknown = sorted(set(shapes) - {i.name for i in declared})
    if unknown:
        raise ModelError(f"input_shapes names {unknown}, which are not inputs of the model "
                         f"(its inputs: {[i.name for i in declared]})")
    out = []
    for info in declared:
        ttype = info.type.tensor_type
        if not info.type.HasField("tensor_type"):
            raise ModelError(f"graph input '{info.name}' is not a tensor (sequences, maps and "
                             "optionals are not supported)")
        dtype = helper.tensor_dtype_to_np_dtype(ttype.elem_type) if ttype.elem_type else None
        if dtype is None:
            raise ModelError(f"graph input '{info.name}' declares no element type")
        shape = _input_shape(info, shapes.get(info.name))
        try:
            value = tensor(info.name, shape, str(dtype))
        except KernelgenError as exc:
            raise ModelError(f"graph input '{info.name}': {exc}") from exc
        assert isinstance(value, Placeholder)
        out.append(value)
    return out


def _input_shape(info: onnx.ValueInfoProto, given: Sequence[int] | None) -> tuple[int, ...]:
    ttype = info.type.tensor_type
    dims = list(ttype.shape.dim) if ttype.HasField("shape") else None
    if given is not None:
        given = tuple(int(d) for d in given)
        if dims is not None and (len(dims) != len(given) or any(
                d.HasField("dim_value") and d.dim_value != g for d, g in zip(dims, given))):
            declared = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                        for d in dims]
            raise ModelError(f"input_shapes gives '{info.name}' the shape {given}, which does "
                             f"not fit its declared shape {declared}")
        return given
    if dims is None:
        raise ModelError(f"graph input '{info.name}' has no shape; pass input_shapes="
                         f"{{'{info.name}': (...)}}")
    for axis, d in enumerate(dims):
        if not d.HasField("dim_value") or d.dim_value < 1:
            what = f"symbolic ('{d.dim_param}')" if d.dim_param else "unknown"
            raise ModelError(f"graph input '{info.name}' axis {axis} is {what}; pass "
                             f"input_shapes={{'{info.name}': (...)}}")
    return tuple(d.dim_value for d in dims)


def _inferred(proto: ModelProto, nodes: list[onnx.NodeProto], inputs: list[Placeholder]
              ) -> dict[str, tuple[tuple[int, ...] | None, np.dtype | None]]:
    """ONNX shape inference (strict, with data propagation) on the model with its inputs'
    shapes fixed: value name -> (shape, dtype), None where unknown. Large initializers are left
    out (as inputs of their shape), since inference only reads the small ones' values."""
    model = inference_model(proto, nodes, inputs)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                     data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"ONNX shape inference fails: {exc}", *_culprit(str(exc))) from exc
    out: dict[str, tuple[tuple[int, ...] | None, np.dtype | None]] = {}
    for info in (*inferred.graph.value_info, *inferred.graph.output):
        ttype = info.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(ttype.elem_type) if ttype.elem_type else None
        shape = None
        if ttype.HasField("shape") and all(d.HasField("dim_value") for d in ttype.shape.dim):
            shape = tuple(d.dim_value for d in ttype.shape.dim)
        out[info.name] = (shape, dtype)
    return out
