"""OpenCL C through PyOpenCL: one ``__kernel`` per fused block, generated for one OpenCL device:
the one this process runs on (``runtime.device()``), or a declared one (``for_device``:
``device.PROFILES`` or a ``DeviceInfo`` of your own), whose limits every kernel respects."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from ...ir.loop import LoopKernel
from ..base import Backend, Config, Runtime, Schedule, Source
from . import runtime as rt
from .device import PROFILES, DeviceInfo, capabilities, profile
from .emit import render
from .language import OpenCLSource
from .prewarm import Pool
from .schedule import OpenCLSchedule, choose
from .search import search_space

# without a device (source generated for another machine): the CPUs this project measures on
DEFAULT_TARGET = PROFILES["cpu-avx512"]


@dataclass(frozen=True)
class OpenCL(Backend):
    # the device generated for; None: this process's device, once ``bound`` reads it
    target: DeviceInfo | None = None

    def bound(self) -> OpenCL:
        if self.target is not None:
            return self
        try:
            info = rt.device().info
        except Exception:  # noqa: BLE001 - no device here: generate for the default target
            info = DEFAULT_TARGET
        return _for(self, info)

    def for_device(self, target: DeviceInfo | str) -> OpenCL:
        """This backend generating for ``target``: a ``DeviceInfo``, or a profile's name
        (``device.PROFILES``: 'mobile-gpu', 'desktop-gpu', 'cpu-avx512', 'cpu-sse')."""
        return _for(self, profile(target) if isinstance(target, str) else target)

    def problem(self) -> str | None:
        try:
            rt.device()
        except Exception as exc:  # noqa: BLE001 - any failure means no usable device
            return f"OpenCL device unavailable (needs pyopencl + PoCL): {exc}"
        return None

    def device_identity(self) -> str:
        return (self.target or rt.device().info).name

    def view_alignment(self) -> int:
        return rt.view_alignment()

    def search_space(self, loop: LoopKernel) -> list[Config]:
        return search_space(self.expand(loop), self.caps)

    def choose(self, loop: LoopKernel, options: Mapping[str, Any]) -> OpenCLSchedule:
        return choose(self.expand(loop), options, self.caps)

    def render(self, schedule: Schedule) -> OpenCLSource:
        assert isinstance(schedule, OpenCLSchedule)
        return render(schedule, self.caps)

    def runtime(self, loop: LoopKernel, source: Source) -> Runtime:
        assert isinstance(source, OpenCLSource)
        return rt.OpenCLRuntime(source.text, source.entry, source.geometry, len(loop.inputs))

    def prewarm_pool(self) -> Pool:
        return Pool(rt.device().name, skip=rt.built)

    def binary(self, text: str) -> bytes | None:
        return rt.program_binary(text)

    def preload(self, text: str, binary: bytes) -> bool:
        return rt.preload(text, binary)


@cache
def _for(backend: OpenCL, info: DeviceInfo) -> OpenCL:
    return replace(backend, caps=capabilities(info), target=info)


BACKEND = OpenCL("opencl", capabilities(DEFAULT_TARGET), suffix="cl", comment="//")
