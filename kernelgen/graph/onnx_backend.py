"""ONNX's backend interface (``onnx.backend.base``) over ``compile_model``, so the tools written
for it, ONNX's own node and model test suites among them, run models on kernelgen:

    import kernelgen.graph.onnx_backend as backend
    rep = backend.prepare(model, device="CPU", fusion="dnnfusion")   # compiles once
    outputs = rep.run([x])                  # positional, in the graph's input order, or a dict
    outputs = backend.run_model(model, [x])  # prepare + run
    backend.supports_device("CPU")           # True: kernelgen's backends run on the host's CPU

``device`` is ONNX's device string. "CPU" runs on ``backend`` ('opencl' by default, which picks
the OpenCL device as ``kernelgen.backends`` does; 'neon', 'c' and 'triton' name the others);
kernelgen has no CUDA device of its own (Triton's GPU path goes through ``backend='triton'``).
Other keyword arguments go to ``compile_model`` (``fusion``, ``rewrite``, ``tuning``...).
"""
from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from .. import backends
from ..errors import ArgumentError, ValueInputError
from .onnx_import import ModelLike, check_model, load_model
from .session import Session, compile_model


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds (IR 3 lists the weights among the inputs too)."""
    weights = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in weights]


def _fully_shaped(info: onnx.ValueInfoProto) -> bool:
    t = info.type.tensor_type
    return t.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0
                                       for d in t.shape.dim)


def _ancestors(model: onnx.ModelProto, tensor: str) -> set[str]:
    """The graph inputs that ``tensor`` is computed from (itself, if it is one)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inputs = {i.name for i in _graph_inputs(model)}
    seen, todo, found = set(), [tensor], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.add(name)
        elif name in producer:
            todo.extend(producer[name].input)
    return found


def _with_constants(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with the graph inputs ``values`` names turned into initializers."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    kept = [i for i in fixed.graph.input if i.name not in values]
    del fixed.graph.input[:]
    fixed.graph.input.extend(kept)
    fixed.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), n)
                                   for n, v in values.items())
    fixed.ir_version = max(fixed.ir_version, 4)  # IR 3 wants every initializer an input too
    return fixed


class KernelgenRep(BackendRep):
    """A compiled model as ONNX's ``BackendRep``.

    A model that kernelgen can compile as given is compiled once, in ``prepare``. kernelgen
    specialises kernels on shapes and on the values its operators take as attributes, so a
    model whose inputs have unknown dimensions, or that computes a Reshape's shape, a Slice's
    starts, reduction axes... from its inputs, is compiled at ``run`` for the shapes (and those
    inputs' values) it is given, once per distinct combination (``sessions``)."""

    def __init__(self, model: onnx.ModelProto, options: dict[str, Any],
                 session: Session | None = None) -> None:
        self.model, self.options = model, options
        self.inputs = [i.name for i in _graph_inputs(model)]
        self.sessions: dict[Any, Session] = {}
        self.value_inputs: set[str] = set()  # inputs found to be needed as values
        self._lock = threading.Lock()
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The model's outputs, as a named tuple, for ``inputs``: one array (a one-input model),
        a sequence in the order of the graph's inputs (weights excluded), or a dict by name;
        ``TensorProto`` values are taken as their arrays."""
        if kwargs:
            raise ArgumentError(f"run() takes no options, got {sorted(kwargs)}")
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            arrays = [inputs] if isinstance(inputs, (np.ndarray, onnx.TensorProto)) \
                else list(inputs)
            if len(arrays) != len(self.inputs):
                raise ArgumentError(f"model '{self.model.graph.name}' takes {len(self.inputs)} "
                                    f"input(s) {self.inputs}, got {len(arrays)}")
            feeds = dict(zip(self.inputs, arrays))
        feeds = {n: numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto)
                 else np.asarray(a) for n, a in feeds.items()}
        session = self.session or self._specialised(feeds)
        outputs = [o.name for o in session.get_outputs()]
        own = {n: a for n, a in feeds.items() if n not in self.value_inputs}  # not baked in
        return namedtupledict("Outputs", outputs)(*session.run(None, own))

    def _specialised(self, feeds: dict[str, np.ndarray]) -> Session:
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise ArgumentError(f"model '{self.model.graph.name}': input(s) {missing} not given")
        with self._lock:
            # kernels take no empty tensors; an empty input can only be a value (no axes)
            self.value_inputs |= {n for n in self.inputs if feeds[n].size == 0}
            while True:
                values = {n: feeds[n] for n in sorted(self.value_inputs)}
                key = (tuple((n, a.shape, a.dtype.str) for n, a in sorted(feeds.items())),
                       tuple((n, a.tobytes()) for n, a in values.items()))
                if key in self.sessions:
                    return self.sessions[key]
                shapes = {n: feeds[n].shape for n in self.inputs if n not in values}
                try:
                    session = compile_model(_with_constants(self.model, values),
                                            input_shapes=shapes, **self.options)
                except ValueInputError as exc:
                    needed = _ancestors(self.model, exc.tensor) - self.value_inputs
                    if not needed:
                        raise
                    self.value_inputs |= needed
                    continue
                self.sessions[key] = session
                return session


class KernelgenBackend(Backend):
    """``onnx.backend.base.Backend`` running models through ``kernelgen.compile_model``."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: ModelLike, device: str = "CPU",  # type: ignore[override]
                **kwargs: Any) -> KernelgenRep:
        """Import and compile ``model`` for ``device``; ``kwargs`` go to ``compile_model``
        (``backend`` defaults to kernelgen's default backend)."""
        if not cls.supports_device(device):
            raise ArgumentError(f"device {device!r} is not supported: kernelgen runs on 'CPU' "
                                "(its OpenCL, NEON C and Triton backends)")
        kwargs.setdefault("backend", backends.DEFAULT)
        model = load_model(model)
        if all(_fully_shaped(i) for i in _graph_inputs(model)):
            try:  # the import checks the model
                return KernelgenRep(model, kwargs, compile_model(model, **kwargs))
            except ValueInputError:
                return KernelgenRep(model, kwargs)  # compiled at run time for the values given
        check_model(model)  # a malformed model fails here, not at the first run
        return KernelgenRep(model, kwargs)

    @classmethod
    def run_model(cls, model: ModelLike, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """One node on ``inputs`` (arrays in the node's input order), as a one-node model at
        the installed onnx's default opset."""
        arrays = [np.asarray(a) for a in inputs]
        names = [n for n in node.input if n]
        if len(names) != len(arrays):
            raise ArgumentError(f"node '{node.name or node.op_type}' ({node.op_type}) has "
                                f"{len(names)} input(s), got {len(arrays)} arrays")
        inputs_info = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in zip(names, arrays)]
        outputs = [n for n in node.output if n]
        if outputs_info is not None:
            typed = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(
                np.dtype(dtype)), shape) for n, (dtype, shape) in zip(outputs, outputs_info)]
        else:  # the outputs' types, from ONNX's shape inference on the bare node
            bare = helper.make_model(helper.make_graph([node], "node", inputs_info, []))
            inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(bare).graph.value_info}
            typed = [inferred.get(n) or helper.make_tensor_value_info(n, 0, None) for n in outputs]
        graph = helper.make_graph([node], f"run_node_{node.op_type}", inputs_info, typed)
        model = helper.make_model(graph, producer_name="kernelgen.run_node")
        return cls.run_model(model, arrays, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except Exception:  # noqa: BLE001 - onnx refuses unknown device strings its own way
            return False


prepare = KernelgenBackend.prepare
run_model = KernelgenBackend.run_model
run_node = KernelgenBackend.run_node
supports_device = KernelgenBackend.supports_device

__all__ = ["KernelgenBackend", "KernelgenRep", "prepare", "run_model", "run_node",
           "supports_device"]
