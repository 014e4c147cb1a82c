"""Search a kernel's tunables by measurement, keep only correct candidates, remember the winner.

``tune`` is a stateless function: candidates come from the backend's search space (or the
caller), pass an optional constraint (AGO's no-redundancy rule, device limits), are built,
**checked against the loop-IR interpreter** (a wrong candidate is discarded however fast it is),
then timed with ``kernelgen.bench``. The search stops starting new candidates when the time
budget is spent, reports progress on long searches, and stores the winner in the Fast-Run
database under the kernel's fingerprint, shapes, backend, device and toolchain versions.
``Measure`` is the tuning policy that measures on a miss (tunables, convolution algorithms, and
yellow blocks fused against split, ``measure_fusion``); it sits above the compile driver,
which it calls to build candidates.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import backends
from .backends import Backend, Config
from .compile import NO_TUNING, STORED, Stored, TuningPolicy, compile, compile_loop
from .compile.tuning import valid_options
from .compile.conv_algorithms import applicable
from .fastrun import FastRunDB, algorithm_key, stored_config, tuning_key
from .fusion import FusedBlock, FusionVerdict
from .ir.interp import interpret
from .ir.loop import LoopKernel
from .ir.node import Constant
from .lower import lower
from .measure import bench
from .measure_fusion import measure_fusion
from .reference_check import matches, random_input

Progress = Callable[[int, int, Config, float | None, str], None]


@dataclass(frozen=True)
class Candidate:
    config: Config
    ms: float | None   # median time; None when not timed
    status: str        # "ok", "wrong", "error: ...", "rejected: ...", "skipped: budget"


@dataclass
class TuneResult:
    best: Config
    ms: float | None
    candidates: list[Candidate] = field(default_factory=list)
    from_cache: bool = False


def tune(loop: LoopKernel, backend: str | Backend = backends.DEFAULT,
         inputs: Sequence[np.ndarray] | None = None, *,
         configs: Iterable[Config] | None = None,
         build: Callable[[Config], Any] | None = None,
         constraint: Callable[[Config], str | None] | None = None,
         budget_s: float = 30.0, repeat: int = 10, db: FastRunDB | None = None,
         use_cache: bool = True, progress: Progress | None = None,
         reference: Sequence[np.ndarray] | None = None,
         key: dict[str, Any] | None = None) -> TuneResult:
    """Pick the fastest correct configuration of ``loop`` (a ``LoopKernel``) on ``backend``.

    ``build(config)`` makes the kernel (default: emit with the config's options).
    ``constraint(config)`` returns a reason to reject a config before building it, or None.
    ``reference`` is the expected output on ``inputs`` when the caller has an independent one
    cheaper than the loop-IR interpreter (NumPy's matmul for a large GEMM). ``key`` replaces
    the database key (default ``tuning_key``). With a database, a stored result is returned
    without measuring (``from_cache``) when it is still valid: one of ``configs`` when they are
    given, else options the backend accepts; an invalid one is measured again and replaced.
    """
    be = backends.get(backend)
    db = db if db is not None else FastRunDB()
    key = key or tuning_key(loop, be)
    configs = list(configs) if configs is not None else None  # read twice: the hit, the search
    hit = db.get(key) if use_cache else None
    stored = stored_config(hit)
    if hit is not None and stored is not None and (
            stored in configs if configs is not None
            else valid_options(loop, be, stored.as_options(), "measuring again")):
        return TuneResult(stored, hit["ms"], [], from_cache=True)
    build = build or (lambda config: compile_loop(loop, be, tuning=NO_TUNING,
                                                  **config.as_options()))
    if reference is not None and inputs is None:
        raise ValueError("tune: a reference output needs the inputs it was computed from")
    if inputs is None:
        rng = np.random.default_rng(0)
        inputs = [random_input(rng, b) for b in loop.inputs]
    want = list(reference) if reference is not None else interpret(loop, *inputs)
    space = list(configs) if configs is not None else be.search_space(loop)
    report = progress or (_print_progress if len(space) > 4 else None)
    start = time.perf_counter()
    results: list[Candidate] = []
    for i, config in enumerate(space):
        if results and time.perf_counter() - start > budget_s:
            results.append(Candidate(config, None, "skipped: budget"))
            continue
        results.append(_try(config, build, constraint, inputs, want, repeat))
        if report:
            report(i + 1, len(space), config, results[-1].ms, results[-1].status)
    good = [c for c in results if c.status == "ok" and c.ms is not None]
    if not good:
        reasons = "; ".join(f"{c.config}: {c.status}" for c in results)
        raise RuntimeError(f"tuning kernel '{loop.name}' on {be.name}: no correct candidate "
                           f"({reasons})")
    best = min(good, key=lambda c: c.ms)  # type: ignore[arg-type, return-value]
    db.put(key, dict(best.config.values), best.ms)
    return TuneResult(best.config, best.ms, results)


def tune_algorithm(fused: FusedBlock, backend: str | Backend = backends.DEFAULT, *,
                   budget_s: float = 120.0, repeat: int = 10,
                   db: FastRunDB | None = None, use_cache: bool = True,
                   tune_tiles: bool = False, progress: Progress | None = None) -> TuneResult:
    """Measure every convolution algorithm that can run ``fused`` (a ``FusedBlock``) on
    ``backend``, each checked against the interpreter's output, and store the fastest under
    the block's fingerprint and device. ``tune_tiles`` tunes each stage's tiles first;
    otherwise stages use stored tiles or the defaults."""
    be = backends.get(backend)
    loop = lower(fused)
    rng = np.random.default_rng(0)
    inputs = [np.asarray(v.value) if isinstance(v, Constant) else random_input(rng, v)
              for v in fused.inputs]
    configs = [Config.of(algorithm=a) for a, why in applicable(fused).items() if why is None]
    tiles: TuningPolicy = Measure(db) if tune_tiles else STORED
    return tune(loop, be, inputs, configs=configs,
                build=lambda c: compile(fused, be, algorithm=c.as_options()["algorithm"],
                                        tuning=tiles),
                budget_s=budget_s, repeat=repeat, db=db, use_cache=use_cache,
                progress=progress, key=algorithm_key(fused, be))


@dataclass(frozen=True)
class Measure:
    """The tuning policy that measures on a miss: the stored result when there is one, else
    ``tune`` (or ``tune_algorithm``) now, stored for the next time."""

    db: FastRunDB | None = None
    name: str = "measure"

    def options(self, loop: LoopKernel, backend: Backend) -> dict[str, Any]:
        if len(backend.search_space(loop)) < 2:
            return {}
        return tune(loop, backend, db=self.db).best.as_options()

    def algorithm(self, block: FusedBlock, backend: Backend) -> str | None:
        return str(tune_algorithm(block, backend, db=self.db).best.as_options()["algorithm"])

    def fusion(self, block: FusedBlock, backend: Backend) -> FusionVerdict | None:
        if len(block.outputs) != 1:  # a program returns one output: such a block stays fused
            return None
        return measure_fusion(block, backend, db=self.db, tuning=STORED)


@dataclass(frozen=True)
class MeasureFusion:
    """The stored tunables and algorithms (``Stored``), with yellow blocks measured fused
    against split on a miss: the cheap part of ``Measure``, for planning a model."""

    db: FastRunDB | None = None
    name: str = "measure-fusion"

    def options(self, loop: LoopKernel, backend: Backend) -> dict[str, Any]:
        return Stored(self.db).options(loop, backend)

    def algorithm(self, block: FusedBlock, backend: Backend) -> str | None:
        return Stored(self.db).algorithm(block, backend)

    def fusion(self, block: FusedBlock, backend: Backend) -> FusionVerdict | None:
        return Measure(self.db).fusion(block, backend)


def _try(config: Config, build: Callable[[Config], Any],
         constraint: Callable[[Config], str | None] | None, inputs: Sequence[np.ndarray],
         want: Sequence[np.ndarray], repeat: int) -> Candidate:
    if constraint is not None and (why := constraint(config)):
        return Candidate(config, None, f"rejected: {why}")
    try:
        kernel = build(config)
        recomputed = getattr(kernel, "metadata", {}).get("producer_redundancy", 1.0)
        if recomputed > 1.0:  # AGO's constraint: each fused producer element computed once
            return Candidate(config, None, f"rejected: computes the fused producer "
                                           f"{recomputed:g} times")
        got = kernel(*inputs)
        got = got if isinstance(got, tuple) else (got,)
        if not matches(got, want):
            return Candidate(config, None, "wrong")
        return Candidate(config, bench(kernel, *inputs, repeat=repeat).median_ms, "ok")
    except Exception as exc:  # noqa: BLE001 - a failing config scores 'error', the search goes on
        return Candidate(config, None, f"error: {type(exc).__name__}: {str(exc)[:200]}")


def _print_progress(i: int, n: int, config: Config, ms: float | None, status: str) -> None:
    timing = f"{ms:.3f} ms" if ms is not None else status
    print(f"  tuning [{i}/{n}] {config}: {timing}", file=sys.stderr, flush=True)
