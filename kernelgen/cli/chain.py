"""Operator chains described in JSON: the CLI's input format until the ONNX importer lands.

    {"inputs": {"x": {"shape": [4, 8], "dtype": "float32"}},
     "ops": [{"name": "y", "op": "Relu", "inputs": ["x"], "attrs": {}}]}

``op`` is an ONNX operator type; ``attrs`` use ONNX attribute names.
"""
from __future__ import annotations

import difflib
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


class ChainFileError(KernelgenError):
    """A chain file that cannot be read or does not describe a chain; names the file and the
    entry at fault."""


def load_chain(path: str | Path = DEFAULT_CHAIN) -> Chain:
    """Build the operators a JSON chain file describes; ``ChainFileError`` when it cannot."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ChainFileError(f"{path}: cannot read the chain file ({why})") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ChainFileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column "
                             f"{exc.colno})") from None
    return _build(spec, str(path))


def _build(spec: Any, path: str) -> Chain:
    _require(path, isinstance(spec, dict), "the file", 'an object with "inputs" and "ops"',
             spec)
    _require(path, isinstance(spec.get("inputs"), dict) and spec["inputs"], '"inputs"',
             'a non-empty object of name: {"shape": [...], "dtype": ...}', spec.get("inputs"))
    _require(path, isinstance(spec.get("ops"), list) and spec["ops"], '"ops"',
             "a non-empty list of operators", spec.get("ops"))
    values: dict[str, Value] = {}
    for name, t in spec["inputs"].items():
        where = f'inputs["{name}"]'
        _require(path, isinstance(t, dict) and "shape" in t, where, 'an object with "shape"', t)
        try:
            values[name] = tensor(name, t["shape"], t.get("dtype", "float32"))
        except (KernelgenError, TypeError, ValueError) as exc:
            raise ChainFileError(f"{path}: {where}: {exc}") from None
    inputs = list(values.values())
    ops = [_op(path, k, entry, values) for k, entry in enumerate(spec["ops"])]
    return Chain(inputs, ops, str(spec.get("description", "")))


def _op(path: str, k: int, entry: Any, values: dict[str, Value]) -> Op:
    """``ops[k]`` built from the values defined before it, and added to them."""
    _require(path, isinstance(entry, dict) and isinstance(entry.get("op"), str), f"ops[{k}]",
             'an object with "op" (an ONNX operator type) and "inputs"', entry)
    kind = entry["op"]
    where = f"ops[{k}] ({kind})"
    if kind not in CONSTRUCTORS:
        close = difflib.get_close_matches(kind, CONSTRUCTORS, n=3)
        known = (f"did you mean {' or '.join(close)}?" if close
                 else f"known: {', '.join(sorted(CONSTRUCTORS))}")
        raise ChainFileError(f"{path}: {where}: unknown ONNX operator type; {known}")
    names, attrs = entry.get("inputs"), entry.get("attrs", {})
    _require(path, isinstance(names, list) and all(isinstance(n, str) for n in names),
             f'{where} "inputs"', "a list of names", names)
    _require(path, isinstance(attrs, dict), f'{where} "attrs"', "an object", attrs)
    missing = [n for n in names if n not in values]
    if missing:
        raise ChainFileError(f"{path}: {where}: input '{missing[0]}' is not defined before use")
    args: list[Any] = [values[n] for n in names]
    try:
        op = CONSTRUCTORS[kind](*([args] if kind == "Concat" else args), **attrs)
    except (KernelgenError, TypeError, ValueError, IndexError, KeyError) as exc:
        raise ChainFileError(f"{path}: {where}: {exc}") from None
    if not isinstance(op, Op):
        raise ChainFileError(f"{path}: {where}: operators with several outputs are not "
                             "supported in chain files")
    name = entry.get("name", op.name)
    _require(path, isinstance(name, str) and name not in values, f'{where} "name"',
             "a name not used before", name)
    op.name = name
    values[name] = op
    return op


def _require(path: str, ok: object, where: str, what: str, got: object) -> None:
    """Raise naming the file, the entry and what it should have been, unless ``ok``."""
    if not ok:
        shown = json.dumps(got, default=str)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ChainFileError(f"{path}: {where}: expected {what}, got {shown}")
