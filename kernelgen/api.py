"""The user's entry to the kernel layer: ``fuse`` returns a ``FusedOp`` that lowers and emits
itself. It sits above the compile driver and the tuner (which it calls), so the data class
below it (``fusion.FusedBlock``) stays pure data.

    fused = kernelgen.fuse(a, r, s)
    kernel = fused.emit("opencl")                      # stored tunables, else the defaults
    kernel = fused.emit("opencl", tuning="measure")    # measured now on a miss, then stored
    kernel = fused.emit("opencl", tuning="none")       # the defaults: the same on any machine

    fused = kernelgen.fuse(t, m, measure=True)          # a yellow block: fused or split, timed
    print(fused.report())                               # ... which won, by how much
    program = fused.emit("opencl")                      # the winner
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import backends
from .backends import Backend
from .compile import NO_TUNING, STORED, TuningPolicy, compile, compile_kernel
from .exec import Executable, Kernel
from .fastrun import FastRunDB
from .fusion import FusedBlock, FusionVerdict
from .fusion import fuse as fuse_block
from .ir.loop import LoopKernel
from .ir.node import Op
from .lower import lower
from .measure_fusion import measure_fusion
from .tune import Measure, MeasureFusion

Tuning = TuningPolicy | str


class FusedOp(FusedBlock):
    """A fused block (``FusedBlock``: its operators, inputs, outputs, the fusion rules it was
    built under and its composed index maps) that lowers and emits itself. ``verdict`` is the
    measurement of fused against split when ``fuse(..., measure=True)`` took one."""

    verdict: FusionVerdict | None = None

    @classmethod
    def of(cls, block: FusedBlock) -> FusedOp:
        return cls(block.ops, block.inputs, block.outputs, block.edges, block.mapping_type,
                   block.ranges)

    def report(self) -> str:
        """The fused edges with their rules, the fused type and, when measured, which of fused
        and split won and by how much."""
        text = super().report()
        return text if self.verdict is None else f"{text}\n{self.verdict}"

    def lower(self, name: str | None = None) -> LoopKernel:
        """The loop IR of this block (``kernelgen.lower``), lowered once per name."""
        return lower(self, name)

    def emit(self, backend: str | Backend = backends.DEFAULT, *, algorithm: str | None = None,
             tuning: Tuning = "stored", tuned: bool | None = None,
             **options: Any) -> Executable:
        """Generate, for ``backend``, a kernel object with ``.source``, ``.metadata`` and a call
        (``kernelgen.compile.compile``). Tunables come from ``tuning``: 'stored' (the Fast-Run
        database's measurement for this kernel, shape and device, else the backend's
        defaults), 'measure' (measured now on a miss, then stored), 'none' (the defaults), or
        a policy object; ``metadata['tuning']`` says which applied. Explicit ``options`` (the
        backend's tunables) always win. ``tuned`` is the older spelling (None, True, False
        for 'stored', 'measure', 'none'). A block with yellow edges runs as its measured
        winner: split (a ``Program``, ``metadata['algorithm'] == 'split'``) where the
        measurement ``fuse(..., measure=True)`` took, or the policy's, found that faster."""
        policy = tuning_policy(tuning, tuned)
        be = backends.get(backend)
        if self.verdict is not None and self.verdict.backend == be.name:
            policy = _Decided(policy, self.verdict)
        return compile(self, be, algorithm=algorithm, tuning=policy, **options)

    def emit_kernel(self, backend: str | Backend = backends.DEFAULT, *,
                    tuning: Tuning = "stored", tuned: bool | None = None,
                    **options: Any) -> Kernel:
        """The whole block as one kernel: no algorithm choice, no padded copies."""
        return compile_kernel(self, backend, tuning=tuning_policy(tuning, tuned), **options)


def fuse(*ops: Op, outputs: Iterable[Op] | None = None, force: bool = False,
         conservative_oto_into_heavy: bool = False, measure: bool = False,
         backend: str | Backend = backends.DEFAULT, db: FastRunDB | None = None) -> FusedOp:
    """Fuse operators into one kernel-shaped operator.

    ``ops`` may be given in any order; they form chains, diamonds or several independent pieces
    of the same output shape. Outputs are the operators no other block member consumes, plus any
    listed in ``outputs``. A red edge (DNNFusion Table 3) raises ``FusionError`` quoting the rule
    unless ``force``; yellow edges fuse and mark the result ``needs_measurement``.

    ``measure``: a block with yellow (or forced red) edges is timed on ``backend`` against its
    split alternative (``kernelgen.measure_fusion``: the block cut at those edges); the
    verdict is stored in the Fast-Run database, kept as ``verdict``, shown by ``report()``,
    and ``emit`` on that backend returns the winner. A block with only green edges has
    nothing to measure (``verdict`` stays None); one with several outputs cannot be measured
    (``FusionError``: its split would need a program per output). ``db``: the Fast-Run
    database to read and store the verdict (default: the one in kernelgen's cache directory).
    """
    fused = FusedOp.of(fuse_block(*ops, outputs=outputs, force=force,
                                  conservative_oto_into_heavy=conservative_oto_into_heavy))
    if measure and (fused.needs_measurement or fused.forced):
        fused.verdict = measure_fusion(fused, backend, db=db)
    return fused


@dataclass(frozen=True)
class _Decided:
    """``policy`` with the fused-or-split choice already measured."""

    policy: TuningPolicy
    verdict: FusionVerdict

    @property
    def name(self) -> str:
        return self.policy.name

    def options(self, loop: LoopKernel, backend: Backend) -> dict[str, Any]:
        return self.policy.options(loop, backend)

    def algorithm(self, block: FusedBlock, backend: Backend) -> str | None:
        return self.policy.algorithm(block, backend)

    def fusion(self, block: FusedBlock, backend: Backend) -> FusionVerdict | None:
        return self.verdict


_POLICIES: dict[str, TuningPolicy] = {"stored": STORED, "none": NO_TUNING, "measure": Measure(),
                                      "measure-fusion": MeasureFusion()}
_TUNED = {None: "stored", True: "measure", False: "none"}


def tuning_policy(tuning: Tuning = "stored", tuned: bool | None = None) -> TuningPolicy:
    """The policy ``tuning`` names ('stored', 'measure', 'none', or 'measure-fusion': the
    stored tunables with yellow blocks measured fused against split), or ``tuning`` itself;
    the older ``tuned`` flag, when given, names one instead."""
    if tuned is not None:
        warnings.warn("emit(tuned=...) is deprecated: pass tuning='measure' (True) or "
                      "'none' (False)", DeprecationWarning, stacklevel=3)
        tuning = _TUNED[tuned]
    if not isinstance(tuning, str):
        return tuning
    if tuning not in _POLICIES:
        raise ValueError(f"tuning must be one of {sorted(_POLICIES)} or a policy object "
                         f"(kernelgen.compile.Stored(db), kernelgen.tune.Measure(db)), "
                         f"got {tuning!r}")
    return _POLICIES[tuning]


__all__ = ["FusedOp", "Tuning", "fuse", "tuning_policy"]
