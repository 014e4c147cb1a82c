"""Judge a reproducer again: the snippet ``run.py`` prints for a failure (the kernelgen code, its
input arrays, the run), rebuilt as a block and judged by the current ``judge.py`` on the named
backends. For a finding from another machine (a GPU run) after a change to the judge:

    .venv/bin/python tests/fuzz/rejudge.py CASE.py [--backends interp,opencl,neon,triton]

Prints one line per backend (OK, or the problem) and exits 1 if any fails.
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
os.environ.setdefault("TRITON_INTERPRET", "1")

from generate import Block, Input, Node  # noqa: E402
from judge import check, prepare  # noqa: E402


@dataclass(frozen=True)
class Given(Input):
    """An input with the reproducer's values instead of a seed's draws."""
    values: bytes = b""

    def array(self, dtype: str | None = None) -> np.ndarray:
        a = np.frombuffer(self.values, self.dtype).reshape(self.shape).copy()
        return a.astype(dtype or self.dtype)


def block_of(source: str) -> Block:
    """The block a reproducer builds: ``kg.tensor`` lines are inputs (with the values of its
    ``arrays``), ``v<k> = kg.fn(...)`` lines are nodes."""
    head = source.split("def run(")[0]
    names: dict = {}
    exec(head, names)  # noqa: S102 - a reproducer this project wrote
    inputs, nodes = [], []
    for st in ast.parse(head).body:
        if not (isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)
                and isinstance(st.value.func, ast.Attribute)):
            continue
        name, call = st.targets[0].id, st.value  # type: ignore[attr-defined]
        if call.func.attr == "tensor":
            shape, dtype = (ast.literal_eval(a) for a in call.args[1:3])
            data = names["arrays"][name].astype(dtype).tobytes()
            inputs.append(Given(name, shape, dtype, values=data))
        elif name.startswith("v"):
            args = tuple(None if isinstance(a, ast.Constant) and a.value is None
                         else tuple(e.id for e in a.elts) if isinstance(a, ast.List)
                         else a.id for a in call.args)  # type: ignore[attr-defined]
            attrs = tuple((k.arg, ast.literal_eval(k.value)) for k in call.keywords)
            nodes.append(Node(call.func.attr, args, attrs))
    return Block(inputs, nodes, force="force=True" in head, dtype=inputs[0].dtype)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--backends", default="interp,opencl,neon,triton")
    args = ap.parse_args(argv)
    case = prepare(block_of(Path(args.case).read_text()))
    failed = False
    for backend in args.backends.split(","):
        problem = check(case, backend)
        failed |= problem is not None
        print(f"{backend}: " + ("OK" if problem is None else f"{problem.kind}\n{problem.text}"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
