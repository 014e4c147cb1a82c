"""The structure of an ONNX graph, checked before anything is built, with errors that name the
node and the tensor: initializers whose data does not fit their dims (or their declared input
shape), names nothing defines, names defined twice, graph outputs nothing produces, cycles. Also
the slim copy of a model that ONNX shape inference runs on."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from ..errors import ModelError
from ..ir.node import Placeholder

# initializers up to this many elements stay in the copy shape inference reads (their values
# may be shapes); larger ones become inputs of their shape
_SMALL = 4096


def _node_name(node: onnx.NodeProto, index: int) -> str:
    return node.name or (node.output[0] if node.output else f"#{index}")


def initializers(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Each initializer as an array; one whose data does not fit its dims, or whose dims differ
    from the graph input of the same name, is a ``ModelError``."""
    declared = {i.name: i for i in graph.input}
    out: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        if init.name in out:
            raise ModelError(f"initializer '{init.name}' is defined twice")
        try:
            array = numpy_helper.to_array(init)
        except Exception as exc:  # noqa: BLE001 - protobuf/NumPy errors on malformed data
            raise ModelError(f"initializer '{init.name}': its data does not fit its dims "
                             f"{list(init.dims)} ({type(exc).__name__}: {exc})") from exc
        info = declared.get(init.name)
        if info is not None and info.type.tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None
                    for d in info.type.tensor_type.shape.dim]
            if len(dims) != array.ndim or any(d is not None and d != n
                                               for d, n in zip(dims, array.shape)):
                raise ModelError(f"initializer '{init.name}' has shape {list(array.shape)}, "
                                 f"but the graph input of that name declares {dims}")
        out[init.name] = array
    return out


def check_structure(graph: onnx.GraphProto) -> tuple[dict[str, np.ndarray], list[onnx.NodeProto]]:
    """(initializer arrays, the nodes in topological order); raises ``ModelError`` for a name
    nothing defines, a name defined twice, a graph output nothing produces, or a cycle."""
    arrays = initializers(graph)
    defined: dict[str, str] = {i.name: "a graph input" for i in graph.input}
    defined.update((name, "an initializer") for name in arrays)
    for k, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in defined:
                raise ModelError(f"output '{out}' is already defined by {defined[out]}",
                                 _node_name(node, k), node.op_type)
            defined[out] = f"node '{_node_name(node, k)}'"
    for k, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in defined:
                raise ModelError(f"reads '{name}', which no graph input, initializer or node "
                                 "output defines", _node_name(node, k), node.op_type)
    for out in graph.output:
        if out.name not in defined:
            raise ModelError(f"graph output '{out.name}' is produced by no node and is no "
                             "input or initializer")
    return arrays, _sorted(graph)


def _sorted(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Kahn's algorithm; nodes left over lie on a cycle, which the error spells out."""
    nodes = list(graph.node)
    producer = {out: k for k, node in enumerate(nodes) for out in node.output if out}
    waiting = [len({producer[i] for i in node.input if i in producer}) for node in nodes]
    users: dict[int, list[int]] = {}
    for k, node in enumerate(nodes):
        for p in {producer[i] for i in node.input if i in producer}:
            users.setdefault(p, []).append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]
    order: list[int] = []
    while ready:
        k = ready.pop(0)
        order.append(k)
        for u in users.get(k, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if len(order) < len(nodes):
        raise _cycle(nodes, producer, set(range(len(nodes))) - set(order))
    return [nodes[k] for k in order]


def _cycle(nodes: list[onnx.NodeProto], producer: dict[str, int], left: set[int]) -> ModelError:
    k = min(left)
    path: list[int] = []
    while k not in path:
        path.append(k)
        k = next(producer[i] for i in nodes[k].input if i in producer and producer[i] in left)
    loop = path[path.index(k):] + [k]
    steps = " -> ".join(f"'{_node_name(nodes[j], j)}' ({nodes[j].op_type})" for j in loop)
    return ModelError(f"the nodes form a cycle: {steps} (each reads the one before)",
                      _node_name(nodes[k], k), nodes[k].op_type)


def inference_model(proto: ModelProto, nodes: Sequence[onnx.NodeProto],
                    inputs: Sequence[Placeholder]) -> ModelProto:
    """The model shape inference reads: the graph inputs at their concrete shapes, the nodes in
    topological order, small initializers as they are, large ones as inputs of their shape."""
    graph = proto.graph
    small = [i for i in graph.initializer if int(np.prod(i.dims, dtype=np.int64)) <= _SMALL]
    large = [helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
             for i in graph.initializer if int(np.prod(i.dims, dtype=np.int64)) > _SMALL]
    fed = [helper.make_tensor_value_info(v.name, helper.np_dtype_to_tensor_dtype(v.dtype.numpy),
                                         list(v.shape)) for v in inputs]
    kept = {i.name for i in small}
    listed = [i for i in graph.input if i.name in kept]
    copy = helper.make_graph(list(nodes), graph.name or "model", [*fed, *listed, *large],
                             list(graph.output), small)
    model = helper.make_model(copy, opset_imports=list(proto.opset_import),
                              ir_version=proto.ir_version)
    model.functions.extend(proto.functions)
    return model
