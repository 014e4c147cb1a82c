"""Triton: a ``@triton.jit`` kernel per fused block in a generated module, run on a CUDA GPU or,
with ``TRITON_INTERPRET=1``, through Triton's interpreter on CPU tensors; ``aot.py`` compiles
the modules for GPU targets without a GPU."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...ir.loop import LoopKernel
from ..base import Backend, Capabilities, Config, Runtime, Schedule, Source
from . import runtime as rt
from .emit import render
from .language import TritonSource
from .schedule import TritonSchedule, choose, search_space

# exp, expm1, log, log1p, tanh and erf are the library's expansions (lower/fastmath.py), as
# on the other backends: on a GPU tl.exp is ex2.approx of x*log2(e), tens of ulps off for large
# |x| (docs/fastmath.md); the expansion runs the same arithmetic under the interpreter
CAPABILITIES = Capabilities(name="triton", vector_width=1, direct_schedule="row")


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

    def search_space(self, loop: LoopKernel) -> list[Config]:
        return search_space(self.expand(loop))

    def choose(self, loop: LoopKernel, options: Mapping[str, Any]) -> TritonSchedule:
        return choose(self.expand(loop), options, self.caps)

    def render(self, schedule: Schedule) -> TritonSource:
        assert isinstance(schedule, TritonSchedule)
        return render(schedule, self.caps)

    def runtime(self, loop: LoopKernel, source: Source) -> Runtime:
        assert isinstance(source, TritonSource)
        return rt.TritonRuntime(source, loop)


BACKEND = Triton("triton", CAPABILITIES, suffix="py", comment="#")
