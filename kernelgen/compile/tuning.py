"""Where a kernel's tunables, a convolution block's algorithm and a yellow block's choice of
fused or split come from, passed to the driver as a policy: the results stored in the Fast-Run
database (``Stored``, the default), none (``NO_TUNING``: the backends' defaults, the same source
on every machine), or measured now on a miss (``kernelgen.tune.Measure``, above the driver).
Explicit options always win.

A stored entry is data from disk, not a decision: one the backend's ``choose`` (or the
convolution's applicability check) refuses is ignored with a ``CacheWarning``, and the
defaults apply, so a bad database never stops ``emit``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..backends import Backend
from ..fastrun import FastRunDB, stored_algorithm, stored_options, stored_verdict
from ..fusion import FusedBlock, FusionVerdict
from ..ir.loop import LoopKernel
from ..options import warn_cache
from .conv_algorithms import applicable


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

    def fusion(self, block: FusedBlock, backend: Backend) -> FusionVerdict | None:
        """Whether ``block``, which holds yellow edges, runs fused or split (None: no
        measurement, so fused as it was built)."""
        ...


@dataclass(frozen=True)
class NoTuning:
    """The backends' defaults and the convolution heuristic: deterministic source."""

    name: str = "none"

    def options(self, loop: LoopKernel, backend: Backend) -> dict[str, Any]:
        return {}

    def algorithm(self, block: FusedBlock, backend: Backend) -> str | None:
        return None

    def fusion(self, block: FusedBlock, backend: Backend) -> FusionVerdict | None:
        return None


@dataclass(frozen=True)
class Stored:
    """What the Fast-Run database holds for this kernel, shape and device (``db``: the default
    database under the cache directory), else the defaults."""

    db: FastRunDB | None = None
    name: str = "stored"

    def options(self, loop: LoopKernel, backend: Backend) -> dict[str, Any]:
        # checked where they are used (``compile_loop`` falls back to the defaults): checking
        # here would choose and render every kernel twice
        return stored_options(loop, backend, self.db)

    def algorithm(self, block: FusedBlock, backend: Backend) -> str | None:
        algorithm = stored_algorithm(block, backend, self.db)
        if algorithm is None:
            return None
        why = applicable(block).get(algorithm, "not a known algorithm")
        if why is not None:
            warn_cache(f"ignored the convolution algorithm {algorithm!r} stored for block "
                       f"'{block.name}' on {backend.name} ({why}); using the heuristic's pick")
            return None
        return algorithm

    def fusion(self, block: FusedBlock, backend: Backend) -> FusionVerdict | None:
        return stored_verdict(block, backend, self.db)


def generate(loop: LoopKernel, backend: Backend, options: dict[str, Any],
             stored: dict[str, Any]) -> tuple[Any, Any]:
    """(schedule, source) of ``loop`` with ``stored`` tunables under explicit ``options``;
    rendered too, since a stored value of the wrong type can pass ``choose`` and fail in the
    printer."""
    if not all(_plain(v) for v in stored.values()):
        raise TypeError("tunables are ints, booleans, names or tuples of them")
    schedule = backend.choose(loop, {**stored, **options})
    return schedule, backend.render(schedule)


def ignore_stored(loop: LoopKernel, backend: Backend, options: dict[str, Any],
                  exc: Exception, instead: str = "using the defaults") -> None:
    """One ``CacheWarning``: stored ``options`` the backend refused, why, and what is done
    ``instead``."""
    warn_cache(f"ignored the tunables {options} stored for kernel '{loop.name}' on "
               f"{backend.name} ({type(exc).__name__}: {exc}); {instead}")


def valid_options(loop: LoopKernel, backend: Backend, options: dict[str, Any],
                  instead: str = "using the defaults") -> bool:
    """Whether ``backend`` can generate ``loop`` with ``options`` (stored ones); if not,
    ``ignore_stored`` warns."""
    if not options:
        return True
    try:
        generate(loop, backend, {}, options)
    except Exception as exc:  # noqa: BLE001 - data from disk: whatever it breaks, the defaults
        ignore_stored(loop, backend, options, exc, instead)
        return False
    return True


def _plain(value: Any) -> bool:
    """No tunable is a float: a stored 4.5 is damage, not a tile size."""
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return isinstance(value, (bool, int, str))


NO_TUNING = NoTuning()
STORED = Stored()
