"""NEON C: one C function with ARM NEON intrinsics per fused block, built into a shared library
and called through ctypes; on x86 through SIMDe's implementation of the intrinsics."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ...ir.loop import LoopKernel
from ...lower import unroll
from ...lower.contraction import contraction, operand_has_reduction
from .. import templates
from ..base import Backend, Config, Emitted
from . import runtime as rt
from .emit import CAPABILITIES, columns_plan, emit_neon


@dataclass(frozen=True)
class Neon(Backend):
    batch_builds: ClassVar[bool] = True  # SIMDe's headers cost about a second per unit
    def problem(self) -> str | None:
        try:
            rt.toolchain()
        except Exception as exc:  # noqa: BLE001
            return (f"NEON C unavailable (needs gcc, and SIMDe off ARM: pip install "
                    f"cmeel-simde): {exc}")
        return None

    def device_identity(self) -> str:
        return rt.toolchain()[1]

    def template_digest(self) -> str:
        return templates.digest(self.name)

    def search_space(self, loop: LoopKernel) -> list[Config]:
        return search_space(loop)

    def emit(self, loop: LoopKernel, options: Mapping[str, Any]) -> Emitted:
        options = {("pack_b" if k == "pack" else k): v for k, v in options.items()}
        source, extra = emit_neon(loop, capabilities=self.caps, **options)
        runtime = rt.NeonRuntime(source, len(loop.inputs) + len(loop.outputs))
        return Emitted(source.text, None, extra, runtime)

    def prebuild(self, emitted: Sequence[Emitted]) -> None:
        """One SIMDe parse per 80 kernels instead of one per kernel."""
        sources = [e.runtime.source for e in emitted]  # type: ignore[attr-defined]
        for start in range(0, len(sources), 80):
            rt.build_kernels(sources[start:start + 80])


def search_space(loop: LoopKernel) -> list[Config]:
    c = contraction(loop)
    if c is not None:  # register tiles; columns in whole float32x4
        tiles = [Config.of(tile_m=m, tile_n=n, pack_b=p) for p in (False, True)
                 for m, n in ((4, 8), (8, 8), (4, 16), (6, 8), (2, 16), (1, 4))]
        # packed blocks a quarter and 4x the default's cache footprint
        tiles += [Config.of(tile_m=m, tile_n=n, pack_b=True, pack_block_kib=kib)
                  for m, n in ((4, 8), (4, 16)) for kib in (128, 2048)]
        # AGO: the emitter's own tile spans the producer once; most others recompute it
        return [Config.of(), *tiles] if operand_has_reduction(c.left) else tiles
    if columns_plan(loop) is not None:  # windows in vector lanes, or one at a time
        return [Config.of(), Config.of(schedule="row")]
    if loop.staged:  # queries per iteration, sharing the loads of keys and values
        return [Config.of(), *(Config.of(group_rows=r)
                               for r in unroll.group_row_choices(loop))]
    return [Config.of()]  # nothing else to tune (the vector width is the hardware's)


BACKEND = Neon("neon", CAPABILITIES, suffix="c", comment="//")
