"""The compile driver: the one module that knows the whole path from a fused block to something
that runs.

    compile(block, backend)
      -> conv_algorithms: which algorithm runs a block around a Conv (stored, measured or the
         heuristic's pick), and its stages (im2col, Winograd: ``winograd.py``)
      -> a block with yellow edges: fused, or split where the policy's measurement says so
      -> padding: padded copies of operands whose rows alias in the cache, where the backend
         asks for them and its kernel does not pack
      -> for each stage: lower -> tuning policy -> backend.choose -> backend.render
         -> backend.runtime -> Kernel
      -> one Kernel, or a Program of several (``exec``), called alike

Tunables come from a ``TuningPolicy`` passed in (``tuning.py``): the Fast-Run database's
stored results by default, none, or measured now (``kernelgen.tune.Measure``). Explicit options
always win over the policy's.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from .. import backends
from ..backends import Backend
from ..errors import UnsupportedError
from ..exec import Executable, Kernel, Program, metadata
from ..fusion import FusedBlock, fuse, split_parts
from ..ir.interp import interpret
from ..ir.loop import LoopKernel
from ..ir.node import Constant, Op, tensor
from ..lower import lower
from ..ops.registry import GENERATED
from . import padding
from .conv_algorithms import (ALGORITHMS, WINOGRAD_TILES, applicable, conv_block, heuristic,
                              im2col_stages)
from .tuning import (
                     NO_TUNING,
                     STORED,
                     NoTuning,
                     Stored,
                     TuningPolicy,
                     generate,
                     ignore_stored,
)
from .winograd import winograd_stages


def compile(block: FusedBlock, backend: str | Backend = backends.DEFAULT, *,
            algorithm: str | None = None, tuning: TuningPolicy = STORED,
            **options: Any) -> Executable:
    """``block`` as a kernel object for ``backend``: ``.source``, ``.metadata`` and a call on
    NumPy arrays. A block around a convolution runs with ``algorithm`` ('direct',
    'implicit_gemm', 'im2col', 'winograd', 'winograd_4x4'), by default the one ``tuning``
    names or the heuristic's pick; Winograd (and im2col where its patches cannot be packed)
    returns a ``Program`` of several kernels, as does a contraction whose operands' rows alias
    in the cache on a backend that pads them, and so does a block with yellow edges whose
    measurement (``tuning.fusion``) found its split alternative faster. ``options`` are the
    backend's tunables."""
    be = backends.get(backend)
    # a policy written before policies answered the fusion question has no ``fusion``
    decide = getattr(tuning, "fusion", None)
    if algorithm is None and not options and decide is not None and (
            block.needs_measurement or block.forced):
        verdict = decide(block, be)
        if verdict is not None and not verdict.fused:
            return compile_split(block, be, tuning=tuning) or \
                compile_fused(block, be, tuning=tuning)
    return compile_fused(block, be, algorithm=algorithm, tuning=tuning, **options)


def compile_fused(block: FusedBlock, backend: str | Backend = backends.DEFAULT, *,
                  algorithm: str | None = None, tuning: TuningPolicy = STORED,
                  **options: Any) -> Executable:
    """``compile`` without the fused-or-split choice: ``block`` as it was fused."""
    be = backends.get(backend)
    if algorithm is None and not any(op.kind == "Conv" for op in block.ops):
        kernel = compile_kernel(block, be, tuning=tuning, **options)
        if not be.caps.pads_aliased_rows or kernel.metadata["tunables"].get("pack"):
            return kernel  # a packed operand's panels do not alias in the cache
        return _padded(block, be, tuning, options) or kernel
    if algorithm is None:
        algorithm = tuning.algorithm(block, be) or heuristic(block, be.caps)
    return _convolution(block, algorithm, be, tuning, options)


def compile_split(block: FusedBlock, backend: str | Backend = backends.DEFAULT, *,
                  tuning: TuningPolicy = STORED) -> Program | None:
    """``block``'s split alternative (``fusion.split_parts``) as one ``Program``: a kernel (or
    an algorithm's stages) per piece, in order, intermediates kept on the device. None for a
    block with several outputs: a program returns one."""
    if len(block.outputs) != 1:
        return None
    be = backends.get(backend)
    kernels: list[Kernel] = []
    folded: dict[str, np.ndarray] = {}
    programs: list[Program] = []
    parts = split_parts(block)
    for part in parts:
        built = compile_fused(part, be, tuning=tuning)
        if isinstance(built, Program):
            kernels += built.kernels
            folded.update(built.folded)
            programs.append(built)
        else:
            assert isinstance(built, Kernel)
            kernels.append(built)
    refold = None
    if all(p.refold is not None or not p.folded for p in programs):
        refold = partial(_refold_parts, programs)
    return Program(f"{block.name}_split", be.name, block.inputs, kernels, folded,
                   {"algorithm": "split", "parts": [[op.name for op in p.ops] for p in parts]},
                   refold)


def _refold_parts(parts: Sequence[Program], constants: Mapping[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
    folded: dict[str, np.ndarray] = {}
    for part in parts:
        if part.refold is not None:
            folded.update(part.refold(constants))
    return folded


def compile_kernel(block: FusedBlock, backend: str | Backend = backends.DEFAULT, *,
                   tuning: TuningPolicy = STORED, **options: Any) -> Kernel:
    """The whole block as one kernel (no algorithm choice, no padding)."""
    kernel = compile_loop(lower(block), backend, tuning=tuning, **options)
    kernel.constants = {v.name: v.value for v in block.inputs if isinstance(v, Constant)}
    return kernel


def compile_loop(loop: LoopKernel, backend: str | Backend = backends.DEFAULT, *,
                 tuning: TuningPolicy = STORED, **options: Any) -> Kernel:
    """One loop kernel on ``backend``, with the tunables ``tuning`` gives under ``options``."""
    be = backends.get(backend)
    chosen = tuning.options(loop, be)
    try:
        schedule, source = generate(loop, be, options, chosen)
    except Exception as exc:
        if not chosen:
            raise
        # stored tunables are data from disk: whatever they break, the defaults apply (and
        # what the explicit options alone break still raises, below)
        ignore_stored(loop, be, chosen, exc)
        chosen = {}
        schedule, source = generate(loop, be, options, chosen)
    info = {"schedule": schedule.kind, "tunables": schedule.tunables(), **schedule.facts(),
            **source.facts, "tuning": {"policy": tuning.name, "options": chosen}}
    return Kernel(loop, be.name, source.text, metadata(loop, be.name, source.launch, info),
                  be.runtime(loop, source))


def unfused(ops: Sequence[Op], backend: str | Backend = backends.DEFAULT,
            **options: Any) -> list[Kernel]:
    """One kernel per operator: the baseline a fused kernel is compared with."""
    return [compile_kernel(fuse(op), backend, **options) for op in ops]


def copy_kernel(shape: tuple[int, ...], dtype: str = "float32",
                backend: str | Backend = backends.DEFAULT) -> Kernel:
    """A plain copy (Identity) kernel: the bandwidth roofline of the same backend."""
    return compile_kernel(fuse(GENERATED["identity"](tensor("src", shape, dtype))), backend)


def _padded(block: FusedBlock, be: Backend, tuning: TuningPolicy,
            options: dict[str, Any]) -> Program | None:
    padded = padding.padded_stages(block)
    if padded is None:
        return None
    kernels = [compile_kernel(c, be, tuning=NO_TUNING) for c in padded.copies]
    kernels.append(compile_kernel(padded.block, be, tuning=tuning, **options))
    return Program(f"{block.name}_padded", be.name, block.inputs, kernels, padded.folded,
                   {"algorithm": "padded-operands", "padded": list(padded.padded),
                    "pad_elements": padding.PAD_ELEMENTS}, partial(padding.refolded, padded))


def _convolution(block: FusedBlock, algorithm: str, be: Backend, tuning: TuningPolicy,
                 options: dict[str, Any]) -> Executable:
    """``block`` run with ``algorithm``: a Kernel for the one-kernel algorithms (im2col among
    them where its pack gathers the patches), a ``Program`` for the others."""
    reasons = applicable(block)
    why = reasons.get(algorithm, f"unknown algorithm (known: {', '.join(ALGORITHMS)})")
    if why is not None:
        raise UnsupportedError(be.name, f"convolution algorithm '{algorithm}'",
                               f"block '{block.name}': {why}")
    conv = conv_block(block)
    if algorithm == "direct":
        if reasons["implicit_gemm"] is not None:  # the backend's own choice is direct
            return compile_kernel(block, be, tuning=tuning, **options)
        return compile_kernel(block, be, tuning=NO_TUNING,
                              **{"schedule": be.caps.direct_schedule, **options})
    if algorithm == "implicit_gemm":
        # a packed operand would be im2col's patches: read them in place (a block of two
        # convs, AGO's, packs its producer's values on NEON instead)
        return compile_kernel(block, be, tuning=tuning,
                              **{**options, **({"pack": False} if conv else {})})
    assert conv is not None
    folds = _Folds()
    if algorithm == "im2col":
        kernel = compile_kernel(block, be, tuning=tuning, **{**options, "pack": True})
        packed = kernel.metadata.get("packed_operand_reads")
        if packed and conv.conv.inputs[1].name not in packed:
            return kernel  # the pack gathers the patches: im2col fused into the pack
        stages: list[FusedBlock | Constant] = list(im2col_stages(conv))
    else:
        stages = winograd_stages(conv, WINOGRAD_TILES[algorithm], fold=folds)
    return _program(block, algorithm, stages, folds, be, tuning, options)


class _Folds:
    """Stages whose inputs are all constants (Winograd's filter transform), each computed when
    it is asked for, on the host by the IR interpreter (no device is needed to generate code,
    so code for a declared device, ``for_device``, is generated without running anything on
    this one), and kept by the name of its result to compute it again from other constants
    (``refold``)."""

    def __init__(self) -> None:
        self.loops: dict[str, tuple[LoopKernel, tuple[Constant, ...]]] = {}

    def __call__(self, stage: FusedBlock) -> np.ndarray:
        loop, inputs = lower(stage), tuple(v for v in stage.inputs if isinstance(v, Constant))
        self.loops[stage.outputs[0].name] = (loop, inputs)
        return _interpret_fold(loop, inputs, {})

    def refold(self, fixed: dict[str, np.ndarray], block_inputs: frozenset[str],
               constants: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``fixed`` and every fold again, the block's constant inputs taking the values
        ``constants``; the stages' own constants (transform matrices) as they were."""
        given = {name: constants[name] for name in block_inputs}  # each one: never the old
        return {**fixed, **{name: _interpret_fold(loop, inputs, given)
                            for name, (loop, inputs) in self.loops.items()}}


def _interpret_fold(loop: LoopKernel, inputs: Sequence[Constant],
                    given: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.asarray(interpret(loop, *(given.get(v.name, v.value) for v in inputs))[0])


def _program(block: FusedBlock, algorithm: str, stages: Sequence[FusedBlock | Constant],
             folds: _Folds, be: Backend, tuning: TuningPolicy,
             options: dict[str, Any]) -> Program:
    folded: dict[str, np.ndarray] = {}
    kernels = []
    external = {id(v) for v in block.inputs}
    for stage in stages:
        if isinstance(stage, Constant):  # computed when the program was built
            folded[stage.name] = stage.value
            continue
        kernels.append(compile_kernel(stage, be, tuning=tuning, **options))
        folded.update((v.name, v.value) for v in stage.inputs  # the transforms' matrices
                      if isinstance(v, Constant) and id(v) not in external)
    made = {stage.name for stage in stages if isinstance(stage, Constant)}
    refold = None
    if made <= set(folds.loops):  # each folded stage can run again on other constants
        # the rest are the transforms' matrices, which no block input changes
        fixed = {name: value for name, value in folded.items() if name not in made}
        names = frozenset(v.name for v in block.inputs if isinstance(v, Constant))
        refold = partial(folds.refold, fixed, names)
    return Program(f"{block.name}_{algorithm}", be.name, block.inputs, kernels, folded,
                   {"algorithm": algorithm}, refold)


__all__ = ["NO_TUNING", "STORED", "NoTuning", "Stored", "TuningPolicy", "compile",
           "compile_fused", "compile_kernel", "compile_loop", "compile_split", "copy_kernel",
           "unfused"]
