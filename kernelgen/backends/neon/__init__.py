"""NEON C: one C function with ARM NEON intrinsics per fused block, built into a shared library
and called through ctypes; on x86 through SIMDe's implementation of the intrinsics. The AArch64
check (``aarch64.py``) runs the same source as real ARMv8.0 code under qemu."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ...ir.loop import LoopKernel
from ...lower import fastmath
from ..base import Backend, Capabilities, Config, Runtime, Schedule, Source
from . import runtime as rt
from .emit import render
from .language import VECTOR, NeonSource
from .schedule import NeonSchedule, choose, search_space

CAPABILITIES = Capabilities(name="neon", vector_width=VECTOR.width, simd_within_work_item=True,
                            direct_schedule="row", im2col_max_channels=64, split_small_convs=True,
                            fast_math=fastmath.EXPANDABLE)  # NEON has no exp, log, ... built-in


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

    def search_space(self, loop: LoopKernel) -> list[Config]:
        return search_space(self.expand(loop))

    def choose(self, loop: LoopKernel, options: Mapping[str, Any]) -> NeonSchedule:
        return choose(self.expand(loop), options, self.caps)

    def render(self, schedule: Schedule) -> NeonSource:
        assert isinstance(schedule, NeonSchedule)
        return render(schedule, self.caps)

    def runtime(self, loop: LoopKernel, source: Source) -> Runtime:
        assert isinstance(source, NeonSource)
        return rt.NeonRuntime(source, len(loop.inputs) + len(loop.outputs))

    def prebuild(self, sources: Sequence[Source]) -> None:
        """One SIMDe parse per 80 kernels instead of one per kernel."""
        neon = [s for s in sources if isinstance(s, NeonSource)]
        for start in range(0, len(neon), 80):
            rt.build_kernels(neon[start:start + 80])


BACKEND = Neon("neon", CAPABILITIES, suffix="c", comment="//")
