"""Operator chains described in JSON: the CLI's input format until the ONNX importer lands.

    {"inputs": {"x": {"shape": [4, 8], "dtype": "float32"}},
     "ops": [{"name": "y", "op": "Relu", "inputs": ["x"], "attrs": {}}]}

``op`` is an ONNX operator type; ``attrs`` use ONNX attribute names.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import KernelgenError
from ..ir.node import Op, Value, tensor
from ..ops.registry import CONSTRUCTORS

DEFAULT_CHAIN = Path(__file__).parent / "examples" / "default_chain.json"


@dataclass
class Chain:
    inputs: list[Value]
    ops: list[Op]
    description: str = ""


def load_chain(path: str | Path = DEFAULT_CHAIN) -> Chain:
    """Build the operators a JSON chain file describes."""
    spec = json.loads(Path(path).read_text())
    values: dict[str, Value] = {}
    inputs = []
    for name, t in spec["inputs"].items():
        values[name] = tensor(name, t["shape"], t.get("dtype", "float32"))
        inputs.append(values[name])
    ops: list[Op] = []
    for k, entry in enumerate(spec["ops"]):
        kind = entry["op"]
        where = f"{path}: ops[{k}] ({kind})"
        if kind not in CONSTRUCTORS:
            raise KernelgenError(f"{where}: unknown operator; known: {sorted(CONSTRUCTORS)}")
        try:
            args: list[Any] = [values[n] for n in entry["inputs"]]
        except KeyError as exc:
            raise KernelgenError(f"{where}: input {exc} is not defined before use") from None
        if kind == "Concat":
            args = [args]
        op = CONSTRUCTORS[kind](*args, **entry.get("attrs", {}))
        if not isinstance(op, Op):
            raise KernelgenError(f"{where}: operators with several outputs are not supported in "
                                 "chain files")
        op.name = entry.get("name", op.name)
        values[op.name] = op
        ops.append(op)
    return Chain(inputs, ops, spec.get("description", ""))
