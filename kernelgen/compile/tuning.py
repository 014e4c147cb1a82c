"""Where a kernel's tunables and a convolution block's algorithm come from, passed to the
driver as a policy: the results stored in the Fast-Run database (``Stored``, the default), none
(``NO_TUNING``: the backends' defaults, the same source on every machine), or measured now on a
miss (``kernelgen.tune.Measure``, above the driver). Explicit options always win."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..backends import Backend
from ..fastrun import FastRunDB, stored_algorithm, stored_options
from ..fusion import FusedBlock
from ..ir.loop import LoopKernel


class TuningPolicy(Protocol):
    @property
    def name(self) -> str:
        """Recorded in the metadata as ``tuning.policy``."""
        ...

    def options(self, loop: LoopKernel, backend: Backend) -> dict[str, Any]:
        """Tunables for ``loop`` on ``backend`` ({}: the backend's defaults)."""
        ...

    def algorithm(self, block: FusedBlock, backend: Backend) -> str | None:
        """The convolution algorithm for ``block`` (None: the heuristic's pick)."""
        ...


@dataclass(frozen=True)
class NoTuning:
    """The backends' defaults and the convolution heuristic: deterministic source."""

    name: str = "none"

    def options(self, loop: LoopKernel, backend: Backend) -> dict[str, Any]:
        return {}

    def algorithm(self, block: FusedBlock, backend: Backend) -> str | None:
        return None


@dataclass(frozen=True)
class Stored:
    """What the Fast-Run database holds for this kernel, shape and device (``db``: the default
    database under the cache directory), else the defaults."""

    db: FastRunDB | None = None
    name: str = "stored"

    def options(self, loop: LoopKernel, backend: Backend) -> dict[str, Any]:
        return stored_options(loop, backend, self.db)

    def algorithm(self, block: FusedBlock, backend: Backend) -> str | None:
        return stored_algorithm(block, backend, self.db)


NO_TUNING = NoTuning()
STORED = Stored()
