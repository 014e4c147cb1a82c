"""A structural hash of a loop kernel: what tuning results are keyed on, and what plans that
name nothing in a kernel are cached by (``by_structure``)."""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

import sympy

from .expr import Call, Cast, Const, Expr, IndexCond, Load, Reduce, Select
from .loop import LoopKernel

# functions whose arguments sympy orders by its own key, which renaming symbols would change
_COMMUTATIVE = (sympy.Add, sympy.Mul, sympy.And, sympy.Or, sympy.Min, sympy.Max, sympy.Eq,
                sympy.Ne)


def fingerprint(kernel: LoopKernel) -> str:
    """A stable hash of the kernel's structure: buffers by position, symbols named by where they
    are bound (domain position, reduction, gather), so the same computation built twice, from
    differently named tensors, hashes the same. Tuning results are keyed on it."""
    names: dict[sympy.Basic, str] = {s: f"d{k}" for k, (s, _) in enumerate(kernel.domain)}
    buffers = {b.name: f"in{k}" for k, b in enumerate(kernel.inputs)}
    buffers.update({b.name: f"out{k}" for k, b in enumerate(kernel.outputs)})
    buffers.update({st.buffer.name: f"stage{k}" for k, st in enumerate(kernel.staged)})
    memo: dict[int, str] = {}  # each node's text
    texts: dict[sympy.Basic, str] = {}  # each index expression's

    def bind(s: sympy.Symbol) -> None:
        if s not in names:
            names[s] = f"s{len(names)}"
            texts.clear()  # a text printed before ``s`` was bound names it otherwise

    def ix(e: sympy.Basic) -> str:
        """``e`` as prefix text with its symbols renamed: the arguments of commutative
        functions sorted by their text, so renaming (which would reorder sympy's own
        arguments) cannot change it. Printing with sympy's ``str`` instead took 0.12 s a
        kernel (ResNet-50's cold compile spent 26 of 152 profiled seconds in it)."""
        hit = texts.get(e)
        if hit is None:
            if e.is_Symbol:
                hit = names.get(e, str(e))
            elif not e.args:  # numbers, sympy.true and false
                hit = str(e)
            else:
                args = [ix(a) for a in e.args]
                if isinstance(e, _COMMUTATIVE):
                    args.sort()
                hit = f"{type(e).__name__}({','.join(args)})"
            texts[e] = hit
        return hit

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


R = TypeVar("R")


class _Structure:
    """A kernel that compares by its structure: its fingerprint and the axes that key its
    hoisted reductions (which the fingerprint leaves out)."""

    __slots__ = ("kernel", "key")

    def __init__(self, kernel: LoopKernel) -> None:
        self.kernel: LoopKernel | None = kernel
        self.key = (fingerprint(kernel), kernel.group)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Structure) and self.key == other.key


def by_structure(maxsize: int) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Cache ``fn(kernel, *args)`` (hashable ``args``) by the kernel's structure, for results
    that name nothing in it (unroll factors, vector widths): a model repeats a block's shapes
    under other tensors' names (SqueezeNet's fire modules, ResNet's bottlenecks), and planning
    one Winograd output transform took 1.7 s on a Zen 1 CPU. The first kernel of a structure
    is the one ``fn`` sees."""
    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        @functools.lru_cache(maxsize=maxsize)
        def on_structure(structure: _Structure, *args: Any) -> R:
            kernel, structure.kernel = structure.kernel, None  # the cache keeps no kernel alive
            assert kernel is not None
            return fn(kernel, *args)

        @functools.wraps(fn)
        def cached(kernel: LoopKernel, *args: Any) -> R:
            return on_structure(_Structure(kernel), *args)
        return cached
    return decorate
