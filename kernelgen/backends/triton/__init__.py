"""Triton: a ``@triton.jit`` kernel per fused block in a generated module, run on a CUDA GPU or,
with ``TRITON_INTERPRET=1``, through Triton's interpreter on CPU tensors."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...ir.loop import LoopKernel
from ...lower.contraction import contraction
from .. import templates
from ..base import Backend, Config, Emitted
from . import runtime as rt
from .emit import CAPABILITIES, STAGED_TILE, emit_triton, staged_block


@dataclass(frozen=True)
class Triton(Backend):
    def problem(self) -> str | None:
        try:
            import torch  # noqa: F401
            import triton  # noqa: F401
        except ImportError as exc:
            return f"Triton unavailable (pip install triton torch==2.13.0): {exc}"
        return None

    def device_identity(self) -> str:
        import triton

        return f"triton {triton.__version__} on {rt.device()}"

    def template_digest(self) -> str:
        return templates.digest(self.name)

    def search_space(self, loop: LoopKernel) -> list[Config]:
        return search_space(loop)

    def emit(self, loop: LoopKernel, options: Mapping[str, Any]) -> Emitted:
        options = {("pack_rows" if k == "pack" else k): v for k, v in options.items()}
        source, launch, extra = emit_triton(loop, capabilities=self.caps, **options)
        if source.scratch:
            launch.update(args="the inputs, the outputs, then the scratch buffer",
                          scratch_bytes=4 * source.scratch)
        runtime = rt.TritonRuntime(source, loop, launch)
        return Emitted(source.text, launch, extra, runtime)


def search_space(loop: LoopKernel) -> list[Config]:
    if contraction(loop) is not None:  # tl.dot tiles
        return [Config.of(block_m=m, block_n=n, block_k=k)
                for m, n, k in ((32, 32, 32), (64, 64, 32), (16, 64, 32), (64, 16, 32),
                                (128, 64, 32), (64, 128, 32))]
    if loop.staged:  # a per-element sum over a staged row is a [row, BLOCK_E] tile
        # tiles up to 4x the emitter's default
        return [Config.of()] + [Config.of(block_e=e) for e in (4, 16, 64, 256)
                                if e * staged_block(loop) <= 4 * STAGED_TILE]
    if loop.grouped:
        return [Config.of(block_r=r, block_e=e) for r in (256, 64, 1024) for e in (256, 1024)]
    return [Config.of(block=b) for b in (1024, 256, 4096)]


BACKEND = Triton("triton", CAPABILITIES, suffix="py", comment="#")
