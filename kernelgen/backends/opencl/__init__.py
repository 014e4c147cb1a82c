"""OpenCL C through PyOpenCL: one ``__kernel`` per fused block, on whatever OpenCL device the
process finds (PoCL on these machines)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...ir.loop import LoopKernel
from ..base import Backend, Capabilities, Config, Runtime, Schedule, Source
from . import runtime as rt
from .emit import render
from .language import VECTOR, OpenCLSource
from .schedule import OpenCLSchedule, choose, search_space

CAPABILITIES = Capabilities(
    name="opencl", vector_width=VECTOR.width, max_work_group=4096,
    # A CPU device runs a work-group on one core: rows reduce fastest as one work-item with
    # explicit vector loops (measured 2.4 ms vs 13 ms for a 1024x4096 softmax on PoCL).
    simd_within_work_item=True, pads_aliased_rows=True, direct_schedule="item",
    pointwise_conv_in_place=True, winograd_4x4=True)


@dataclass(frozen=True)
class OpenCL(Backend):
    def problem(self) -> str | None:
        try:
            rt.device()
        except Exception as exc:  # noqa: BLE001 - any failure means no usable device
            return f"OpenCL device unavailable (needs pyopencl + PoCL): {exc}"
        return None

    def device_identity(self) -> str:
        return rt.device().name

    def search_space(self, loop: LoopKernel) -> list[Config]:
        return search_space(loop)

    def choose(self, loop: LoopKernel, options: Mapping[str, Any]) -> OpenCLSchedule:
        return choose(loop, options, self.caps)

    def render(self, schedule: Schedule) -> OpenCLSource:
        assert isinstance(schedule, OpenCLSchedule)
        return render(schedule, self.caps)

    def runtime(self, loop: LoopKernel, source: Source) -> Runtime:
        assert isinstance(source, OpenCLSource)
        return rt.OpenCLRuntime(source.text, source.entry, source.geometry, len(loop.inputs))


BACKEND = OpenCL("opencl", CAPABILITIES, suffix="cl", comment="//")
