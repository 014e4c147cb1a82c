"""A structural hash of a loop kernel: what tuning results are keyed on."""
from __future__ import annotations

import hashlib

import sympy

from .expr import Call, Cast, Const, Expr, IndexCond, Load, Reduce, Select
from .loop import LoopKernel


def fingerprint(kernel: LoopKernel) -> str:
    """A stable hash of the kernel's structure: buffers by position, symbols named by where they
    are bound (domain position, reduction, gather), so the same computation built twice, from
    differently named tensors, hashes the same. Tuning results are keyed on it."""
    names: dict[sympy.Basic, sympy.Symbol] = {
        s: sympy.Symbol(f"d{k}") for k, (s, _) in enumerate(kernel.domain)}
    buffers = {b.name: f"in{k}" for k, b in enumerate(kernel.inputs)}
    buffers.update({b.name: f"out{k}" for k, b in enumerate(kernel.outputs)})
    buffers.update({st.buffer.name: f"stage{k}" for k, st in enumerate(kernel.staged)})
    memo: dict[int, str] = {}

    def bind(s: sympy.Symbol) -> None:
        names.setdefault(s, sympy.Symbol(f"s{len(names)}"))

    def ix(e: sympy.Basic) -> str:
        return str(e.xreplace(names))

    def text(node: Expr) -> str:
        if id(node) in memo:
            return memo[id(node)]
        if isinstance(node, Reduce):
            for s, _ in node.axes:
                bind(s)
            axes = ",".join(f"{ix(s)}<{n}" for s, n in node.axes)
            out = f"{node.kind}[{axes}]({text(node.body)})"
        elif isinstance(node, (Load, IndexCond)):
            data = []
            for s, n, v in node.data:
                data.append(f"{text(v)}<{n}")
                bind(s)
            out = f"?({ix(node.cond)}|{';'.join(data)})" if isinstance(node, IndexCond) else \
                f"{buffers[node.buffer]}[{ix(node.offset)}|{ix(node.guard)}|{';'.join(data)}]"
        elif isinstance(node, Const):
            out = f"{node.value!r}"
        elif isinstance(node, Call):
            out = f"{node.fn}({','.join(text(a) for a in node.args)})"
        elif isinstance(node, (Select, Cast)):
            out = f"{type(node).__name__}({','.join(text(c) for c in node.children())})"
        else:
            raise TypeError(f"fingerprint: unknown node {type(node).__name__}")
        out = f"{out}:{node.dtype}"
        memo[id(node)] = out
        return out

    parts = [f"domain{[n for _, n in kernel.domain]}"]
    parts += [f"{buffers[b.name]}:{b.dtype}{list(b.shape)}" for b in kernel.inputs + kernel.outputs]
    for st in kernel.staged:
        bind(st.row)
        parts.append(f"{buffers[st.buffer.name]}[{ix(st.row)}<{st.buffer.numel}]={text(st.value)}")
    parts += [f"{buffers[st.buffer]}={text(st.value)}" for st in kernel.stores]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
