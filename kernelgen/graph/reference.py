"""A graph run operator by operator on the IR interpreter (``ir/interp.py``): kernelgen's
reference semantics for a whole model. NumPy throughout, so it is slow for large convolutions;
tests use it on small graphs and to check importers without any backend."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..exec.arguments import bind_inputs
from ..fusion import fuse
from ..ir.interp import interpret
from ..ir.node import Constant, Op
from ..lower import lower
from .model import Graph


def interpret_graph(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Output name -> array, each operator evaluated alone by the interpreter."""
    arrays = bind_inputs(f"graph '{graph.name}'", graph.inputs, (), feeds)
    values: dict[int, np.ndarray] = {id(v): a for v, a in zip(graph.inputs, arrays)}
    values.update((id(c), np.asarray(c.value)) for c in graph.constants)
    for op in graph.ops:
        block = fuse(op)
        (values[id(op)],) = interpret(lower(block), *(_value(values, v) for v in block.inputs))
    return {name: values[id(v)].copy() for name, v in graph.outputs.items()}


def _value(values: dict[int, np.ndarray], v: object) -> np.ndarray:
    if isinstance(v, Constant) and id(v) not in values:
        return np.asarray(v.value)
    assert isinstance(v, (Op, Constant)) or id(v) in values
    return values[id(v)]
