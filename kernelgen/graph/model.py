"""A model as a graph of kernelgen operators, whatever built it (the ONNX importer is one
frontend; a ``torch.compile`` one would be another): named inputs, named outputs, the constants
the operators read, and the operators in topological order with the consumers of every value.

    x = kg.tensor("x", (1, 3, 8, 8))
    y = kg.relu(kg.conv(x, kg.constant("w", w)))
    graph = Graph.build([x], {"y": y})

``Graph.build`` keeps only the operators the outputs need and checks the graph: every input is
listed, no two values share a name, no cycle. Nothing here knows about ONNX.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelError
from ..ir.node import Constant, Op, Placeholder, Value


@dataclass(frozen=True, eq=False)
class Graph:
    """Operators in topological order between named inputs and named outputs.

    ``inputs``: the tensors a caller feeds (``Placeholder``s that are not constants), in order.
    ``outputs``: output name -> value (an operator, or an input or a constant passed through).
    ``ops``: every operator the outputs depend on, each after the operators it reads.
    """

    name: str
    inputs: tuple[Placeholder, ...]
    outputs: dict[str, Value]
    ops: tuple[Op, ...]
    _consumers: dict[int, tuple[Op, ...]] = field(repr=False, compare=False)

    @classmethod
    def build(cls, inputs: Sequence[Placeholder], outputs: Mapping[str, Value] | Sequence[Value],
              name: str = "graph") -> Graph:
        """The graph computing ``outputs`` (by name, or a list named after the values) from
        ``inputs``; raises ``ModelError`` for an input the outputs read but ``inputs`` does not
        list, two values with one name, a cycle, or an input listed twice."""
        named = dict(outputs) if isinstance(outputs, Mapping) else {v.name: v for v in outputs}
        if not named:
            raise ModelError(f"graph '{name}' has no outputs")
        for key, value in named.items():
            if not isinstance(value, Value):
                raise ModelError(f"graph '{name}': output '{key}' is a {type(value).__name__}, "
                                 "not a kernelgen tensor or operator")
        inputs = tuple(inputs)
        for v in inputs:
            if not isinstance(v, Placeholder) or isinstance(v, Constant):
                raise ModelError(f"graph '{name}': input '{v.name}' must be a tensor "
                                 f"(kg.tensor), got {type(v).__name__}")
        if len({id(v) for v in inputs}) != len(inputs):
            raise ModelError(f"graph '{name}' lists an input twice: "
                             f"{[v.name for v in inputs]}")
        ops = _topological(named.values(), name)
        _check_sources(inputs, ops, named, name)
        consumers: dict[int, list[Op]] = {}
        for op in ops:
            for read in dict.fromkeys(op.inputs):
                consumers.setdefault(id(read), []).append(op)
        return cls(name, inputs, named, tuple(ops),
                   {k: tuple(v) for k, v in consumers.items()})

    @property
    def constants(self) -> tuple[Constant, ...]:
        """Every constant an operator reads or an output is, in first-use order."""
        seen: dict[int, Constant] = {}
        for v in (*(i for op in self.ops for i in op.inputs), *self.outputs.values()):
            if isinstance(v, Constant):
                seen.setdefault(id(v), v)
        return tuple(seen.values())

    def consumers(self, value: Value) -> tuple[Op, ...]:
        """The operators that read ``value``, in topological order (each once)."""
        return self._consumers.get(id(value), ())

    def is_output(self, value: Value) -> bool:
        return any(v is value for v in self.outputs.values())

    def producer_index(self) -> dict[int, int]:
        """id(op) -> its position in ``ops``."""
        return {id(op): k for k, op in enumerate(self.ops)}

    def summary(self) -> dict[str, Any]:
        """Counts for a report: operators by kind, constants and their bytes."""
        kinds: dict[str, int] = {}
        for op in self.ops:
            kinds[op.kind] = kinds.get(op.kind, 0) + 1
        consts = self.constants
        return {"name": self.name, "inputs": [v.name for v in self.inputs],
                "outputs": list(self.outputs), "ops": len(self.ops), "kinds": kinds,
                "constants": len(consts),
                "constant_bytes": sum(c.numel * c.dtype.itemsize for c in consts)}

    def __str__(self) -> str:
        lines = [f"graph {self.name}"]
        lines += [f"  input  {v.name}: {v.dtype}{list(v.shape)}" for v in self.inputs]
        lines += [f"  {op!r}" for op in self.ops]
        lines += [f"  output {k} = {v.name}: {v.dtype}{list(v.shape)}"
                  for k, v in self.outputs.items()]
        return "\n".join(lines)


def _topological(outputs: Iterable[Value], name: str) -> list[Op]:
    """The operators ``outputs`` depend on, producers first (iterative depth-first search; a
    value reached again while its own inputs are being visited is a cycle)."""
    order: list[Op] = []
    state: dict[int, int] = {}  # 1: visiting, 2: done
    for root in outputs:
        stack: list[tuple[Value, int]] = [(root, 0)]
        while stack:
            value, k = stack.pop()
            if not isinstance(value, Op):
                continue
            if k == 0:
                if state.get(id(value)) == 2:
                    continue
                if state.get(id(value)) == 1:
                    raise ModelError(f"graph '{name}' has a cycle through '{value.name}' "
                                     f"({value.kind})")
                state[id(value)] = 1
            if k < len(value.inputs):
                stack.append((value, k + 1))
                child = value.inputs[k]
                if isinstance(child, Op) and state.get(id(child)) == 1:
                    raise ModelError(f"graph '{name}' has a cycle through '{child.name}' "
                                     f"({child.kind})")
                stack.append((child, 0))
            else:
                state[id(value)] = 2
                order.append(value)
    return order


def _check_sources(inputs: tuple[Placeholder, ...], ops: list[Op], outputs: dict[str, Value],
                   name: str) -> None:
    """Every placeholder read is a listed input or a constant; names are unique."""
    listed = {id(v) for v in inputs}
    names: dict[str, Value] = {}
    for v in (*inputs, *ops, *(i for op in ops for i in op.inputs), *outputs.values()):
        if isinstance(v, Placeholder) and not isinstance(v, Constant) and id(v) not in listed:
            user = next((op for op in ops if any(i is v for i in op.inputs)), None)
            where = f"read by '{user.name}' ({user.kind})" if user else "an output"
            raise ModelError(f"graph '{name}': tensor '{v.name}' ({where}) is not one of the "
                             f"graph's inputs {[i.name for i in inputs]}")
        seen = names.setdefault(v.name, v)
        if seen is not v:
            raise ModelError(f"graph '{name}': two distinct values are named '{v.name}' "
                             f"(kernel arguments are named after values)")


def fresh_name(base: str, names: set[str]) -> str:
    """``base``, or ``base.1``, ``base.2``, ... : the first not in ``names`` (which it joins)."""
    name, k = base, 1
    while name in names:
        name, k = f"{base}.{k}", k + 1
    names.add(name)
    return name
