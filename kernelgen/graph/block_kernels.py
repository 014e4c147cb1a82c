"""A plan's blocks as executables (``executor.compile_plan``'s first half).

Each block is fused on copies of its operators named by position (``fuse_block``: inputs
``in0``.., outputs ``out0``..), so that blocks of one structure print the same source; each
distinct structure (the loop IR's fingerprint and which inputs are constants) is compiled once
(``compile_blocks``) and its executable shared by every block of it; a program that folded its
block's weights (Winograd's transformed filters) shares its kernels instead, each block's
program folding its own weights (``Program.rebound``). ``arg_names`` are the names a launch of
an executable takes for a block, in the executable's argument order.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..backends import Backend
from ..compile import TuningPolicy, compile
from ..exec import Executable, Kernel, Program
from ..fusion import FusedBlock, fuse
from ..ir.fingerprint import fingerprint
from ..ir.node import Constant, Op, Placeholder, Value
from ..lower import lower
from .blocks import Block
from .model import Graph


@dataclass
class Compiled:
    """The executables of a model and, per block, which one runs it on which names."""

    executables: list[Executable] = field(default_factory=list)
    uses: list[int] = field(default_factory=list)
    launches: list[tuple[int, list[str]]] = field(default_factory=list)  # (kernel, arg names)


def fuse_block(graph: Graph, block: Block) -> tuple[FusedBlock, dict[str, str]]:
    """The block as one fused kernel whose outputs are what other blocks and the graph read,
    built on copies named by position (inputs ``in0``.., outputs ``out0``.., the rest ``t0``..)
    so that blocks of one structure print the same source and share one build; and the map
    from those names to the graph's."""
    members = {id(op) for op in block.ops}
    swap: dict[int, Value] = {}
    real: dict[str, str] = {}
    for op in block.ops:
        for v in op.inputs:
            if id(v) not in members and id(v) not in swap:
                name = f"in{len(swap)}"
                swap[id(v)] = (Constant(name, v.shape, v.dtype, v.value)
                               if isinstance(v, Constant) else Placeholder(name, v.shape, v.dtype))
                real[name] = v.name
    outputs: list[Op] = []
    copies: list[Op] = []
    for k, op in enumerate(block.ops):
        is_out = graph.is_output(op) or any(id(c) not in members for c in graph.consumers(op))
        name = f"out{len(outputs)}" if is_out else f"t{k}"
        copy = replace(op, name=name, inputs=tuple(swap.get(id(v), v) for v in op.inputs))
        swap[id(op)] = copy
        real[name] = op.name
        copies.append(copy)
        if is_out:
            outputs.append(copy)
    # the planner chose the block (TVM's rules ignore the table's colours), so no veto here
    return fuse(*copies, outputs=outputs, force=True), real


def _shareable(exe: Executable) -> bool:
    # kernels take every input; a program that folded constants holds one block's weights,
    # and shares its kernels where it can fold another block's (``_holds_weights``)
    return isinstance(exe, Kernel) or (isinstance(exe, Program) and (
        not exe.folded or exe.refold is not None))


def _holds_weights(exe: Executable) -> bool:
    return isinstance(exe, Program) and bool(exe.folded)


def compile_blocks(fused: Sequence[FusedBlock], names: Sequence[dict[str, str]], be: Backend,
                   tuning: TuningPolicy, algorithm: str | None, options: dict[str, Any],
                   compiled: Callable[[Executable], None] = lambda exe: None) -> Compiled:
    """Each distinct block compiled once (``compiled`` is told of each as it is made)."""
    out = Compiled()
    shared: dict[tuple[str, tuple[bool, ...]], int] = {}
    for block, real in zip(fused, names):
        key = (fingerprint(lower(block)), tuple(isinstance(v, Constant) for v in block.inputs))
        k = shared.get(key)
        if k is None:
            conv = algorithm if any(op.kind == "Conv" for op in block.ops) else None
            exe = compile(block, be, algorithm=conv, tuning=tuning, **options)
            compiled(exe)
            k = len(out.executables)
            out.executables.append(exe)
            out.uses.append(0)
            if _shareable(exe):
                shared[key] = k
            _check_args(exe, arg_names(block, exe))
        elif _holds_weights(out.executables[k]):
            # the same kernels with this block's own weights folded: nothing generated or built
            program = out.executables[k]
            assert isinstance(program, Program)
            k = len(out.executables)
            out.executables.append(program.rebound(block.inputs))
            out.uses.append(0)
        out.uses[k] += 1
        out.launches.append((k, [real[n] for n in arg_names(block, out.executables[k])]))
    return out


def arg_names(block: FusedBlock, exe: Executable) -> list[str]:
    """The names ``exe.launch`` takes for ``block``: a kernel its loop's buffers, a program the
    block's inputs and its output (positions agree between blocks of one fingerprint)."""
    if isinstance(exe, Program):
        return [v.name for v in block.inputs] + [block.outputs[0].name]
    loop = lower(block)
    return [b.name for b in (*loop.inputs, *loop.outputs)]


def _check_args(exe: Executable, names: list[str]) -> None:
    declared = [a["name"] for a in exe.metadata["args"]]
    if declared != names:
        raise AssertionError(f"kernel '{exe.name}' takes {declared}, the executor passes {names}")
