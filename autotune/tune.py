"""Search a kernel's tunables by measurement, keep only correct candidates, remember the winner.

``tune`` is a stateless function: candidates come from the backend's search space (or the
caller), pass an optional constraint (AGO's no-redundancy rule, device limits), are built,
**checked against the loop-IR interpreter** (a wrong candidate is discarded however fast it is),
then timed with ``kernelgen.bench``. The search stops starting new candidates when the time
budget is spent, reports progress on long searches, and stores the winner in the Fast-Run
database under the kernel's fingerprint, shapes, backend, device and toolchain versions.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import templates

from .config import Config
from .database import FastRunDB

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


def search_space(loop: Any, backend: str) -> list[Config]:
    """Each backend's tunables for this kernel (the default first)."""
    if backend == "opencl":
        from kernelgen.emit.opencl import WINDOW_ROWS, opencl_contraction, opencl_window
        from kernelgen.loop_ir import operand_has_reduction

        c = opencl_contraction(loop)
        if c is not None and not c.rows:  # depthwise: one row, columns in vectors
            tiles = [Config.of(tile_m=1, tile_n=n) for n in (32, 16, 48, 64)]
            window = opencl_window(loop)
            if window is None:
                return tiles
            # the default's window rows first, then the others and a few group sizes
            rows = sorted(window.row_choices,
                          key=lambda r: (r > WINDOW_ROWS, -r if r <= WINDOW_ROWS else r))
            return [Config.of(), *(Config.of(reduce_strategy="window", window_rows=r,
                                             local_size=ls)
                                   for r in rows[:4] for ls in (8, 32)), *tiles]
        if c is not None:  # register tiles of the contraction templates
            # rows x columns; columns in float16 vectors (8 or 4 lanes on short runs)
            # (6x64: 293 GFLOP/s on im2col's 64x576x3136 GEMM, against 222 for 8x32)
            tiles = [Config.of(tile_m=m, tile_n=n) for m, n in
                     ((8, 32), (8, 48), (6, 64), (4, 64), (12, 32), (6, 32), (8, 16), (4, 16),
                      (4, 4))]
            # AGO: the emitter's own tile spans the producer once; most others recompute it
            ago = operand_has_reduction(c.left) or operand_has_reduction(c.right)
            if ago:
                return [Config.of(), *tiles]
            # the right operand read in place, packed by each column tile's item, or packed
            # by a first kernel: each way for the five likeliest tiles first, so a short
            # budget still measures every one
            ways = ({"pack_b": False}, {"pack_b": True, "pack_in_tile": True},
                    {"pack_b": True, "pack_in_tile": False})
            return [*(Config.of(**t.as_options(), **way) for t in tiles[:5] for way in ways),
                    *(Config.of(**t.as_options(), pack_b=False) for t in tiles[5:])]
        from kernelgen.emit import unroll

        if loop.staged:  # a staged row is one work-item's array; queries a work-item share loads
            return [Config.of(), *(Config.of(reduce_strategy="row", group_rows=r)
                                   for r in unroll.group_row_choices(loop)),
                    *(Config.of(reduce_strategy="item", local_size=ls) for ls in (256, 64))]
        strategies: list[str | None] = [None]
        if loop.hoisted:
            strategies += ["row", "group", "item"]
        configs = [Config.of(**({"local_size": ls} | ({"reduce_strategy": st} if st else {})))
                   for st in strategies for ls in (256, 64, 1024)]
        plans = unroll.ranked(loop)
        if plans:  # the default takes the first; the next two and one point per item too
            configs += [Config.of(local_size=ls, unroll=p)
                        for p in (*plans[1:3], unroll.none(loop)) for ls in (256, 1024)]
        return configs
    if backend == "triton":
        from kernelgen.emit.triton import STAGED_TILE, staged_block
        from kernelgen.loop_ir import contraction

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
    if backend == "neon":
        from kernelgen.loop_ir import contraction, operand_has_reduction

        c = contraction(loop)
        if c is not None:  # register tiles; columns in whole float32x4
            tiles = [Config.of(tile_m=m, tile_n=n, pack_b=p) for p in (False, True)
                     for m, n in ((4, 8), (8, 8), (4, 16), (6, 8), (2, 16), (1, 4))]
            # packed blocks a quarter and 4x the default's cache footprint
            tiles += [Config.of(tile_m=m, tile_n=n, pack_b=True, pack_block_kib=kib)
                      for m, n in ((4, 8), (4, 16)) for kib in (128, 2048)]
            # AGO: the emitter's own tile spans the producer once; most others recompute it
            return [Config.of(), *tiles] if operand_has_reduction(c.left) else tiles
        from kernelgen.emit import unroll
        from kernelgen.emit.neon import columns_plan

        if columns_plan(loop) is not None:  # windows in vector lanes, or one at a time
            return [Config.of(), Config.of(schedule="row")]
        if loop.staged:  # queries per iteration, sharing the loads of keys and values
            return [Config.of(), *(Config.of(group_rows=r)
                                   for r in unroll.group_row_choices(loop))]
    return [Config.of()]  # nothing else to tune (the vector width is the hardware's)


def device_identity(backend: str) -> str:
    """What the measurement depends on besides the kernel: device and toolchain versions."""
    if backend == "opencl":
        from kernelgen.runtime import opencl
        return opencl.device().name
    if backend == "neon":
        from kernelgen.runtime.neon import toolchain
        return toolchain()[1]
    if backend == "triton":
        import triton

        from kernelgen.runtime import triton as triton_runtime
        return f"triton {triton.__version__} on {triton_runtime.device()}"
    return backend


def tuning_key(loop: Any, backend: str) -> dict[str, Any]:
    from kernelgen import __version__
    from kernelgen.loop_ir import fingerprint

    return {"kind": "tile-config", "kernel": fingerprint(loop), "backend": backend,
            "device": device_identity(backend), "layout": "row-major",
            "kernelgen": __version__, "templates": templates.digest(backend)}


def _correct(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> bool:
    """Every element within rtol of the output's scale (max-norm): a long float32 reduction
    summed in another order differs by far less, one wrong element by far more. Integers and
    booleans must match exactly; NaN must be where the reference has NaN."""
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return False
        if not np.issubdtype(w.dtype, np.floating):
            if not np.array_equal(g, w):
                return False
            continue
        if not np.array_equal(np.isnan(g), np.isnan(w)):
            return False
        finite = np.isfinite(w)
        if not np.array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)]):
            return False
        rtol = 5e-3 if w.dtype == np.float16 else 1e-4
        scale = float(np.max(np.abs(w[finite]), initial=0.0)) + 1.0
        diff = np.abs(g[finite].astype(np.float64) - w[finite].astype(np.float64))
        if diff.size and float(diff.max()) > rtol * scale:
            return False
    return True


def tune(loop: Any, backend: str, inputs: Sequence[np.ndarray] | None = None, *,
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
    without measuring (``from_cache``).
    """
    from kernelgen.interp import interpret
    from kernelgen.kernel import emit
    from kernelgen.measure import bench

    db = db if db is not None else FastRunDB()
    key = key or tuning_key(loop, backend)
    if use_cache and (hit := db.get(key)) is not None:
        return TuneResult(Config.of(**hit["value"]), hit["ms"], [], from_cache=True)
    build = build or (lambda config: emit(loop, backend, **config.as_options()))
    if reference is not None and inputs is None:
        raise ValueError("tune: a reference output needs the inputs it was computed from")
    if inputs is None:
        rng = np.random.default_rng(0)
        inputs = [_random_input(rng, b) for b in loop.inputs]
    want = list(reference) if reference is not None else interpret(loop, *inputs)
    space = list(configs) if configs is not None else search_space(loop, backend)
    report = progress or (_print_progress if len(space) > 4 else None)
    start = time.perf_counter()
    results: list[Candidate] = []
    for i, config in enumerate(space):
        if results and time.perf_counter() - start > budget_s:
            results.append(Candidate(config, None, "skipped: budget"))
            continue
        results.append(_try(config, build, constraint, inputs, want, repeat, bench))
        if report:
            report(i + 1, len(space), config, results[-1].ms, results[-1].status)
    good = [c for c in results if c.status == "ok" and c.ms is not None]
    if not good:
        reasons = "; ".join(f"{c.config}: {c.status}" for c in results)
        raise RuntimeError(f"tuning kernel '{loop.name}' on {backend}: no correct candidate "
                           f"({reasons})")
    best = min(good, key=lambda c: c.ms)  # type: ignore[arg-type, return-value]
    db.put(key, dict(best.config.values), best.ms)
    return TuneResult(best.config, best.ms, results)


def stored_options(loop: Any, backend: str, measure: bool = False,
                   db: FastRunDB | None = None) -> dict[str, Any]:
    """Emit options for ``loop`` from the Fast-Run database: what was measured for this kernel,
    shape and device, or (``measure``) measured now; {} when the kernel has nothing to tune or
    nothing was stored. This is how templates use the tuner by default."""
    if len(search_space(loop, backend)) < 2:
        return {}
    if measure:
        return tune(loop, backend, db=db).best.as_options()
    hit = (db if db is not None else FastRunDB()).get(tuning_key(loop, backend))
    return dict(hit["value"]) if hit is not None else {}


def algorithm_key(fused: Any, backend: str) -> dict[str, Any]:
    return {**tuning_key(fused.lower(), backend), "kind": "conv-algorithm"}


def stored_algorithm(fused: Any, backend: str, db: FastRunDB | None = None) -> str | None:
    """The convolution algorithm measured fastest for this block and device, if any."""
    hit = (db if db is not None else FastRunDB()).get(algorithm_key(fused, backend))
    return str(hit["value"]["algorithm"]) if hit is not None else None


def tune_algorithm(fused: Any, backend: str, *, budget_s: float = 120.0, repeat: int = 10,
                   db: FastRunDB | None = None, use_cache: bool = True,
                   tune_tiles: bool = False, progress: Progress | None = None) -> TuneResult:
    """Measure every convolution algorithm that can run ``fused`` (a ``FusedOp``) on
    ``backend``, each checked against the interpreter's output, and store the fastest under
    the block's fingerprint and device. ``tune_tiles`` tunes each stage's tiles first;
    otherwise stages use stored tiles or the defaults."""
    from kernelgen.conv_algorithms import applicable, build
    from kernelgen.graph import Constant

    loop = fused.lower()
    rng = np.random.default_rng(0)
    inputs = [np.asarray(v.value) if isinstance(v, Constant) else _random_input(rng, v)
              for v in fused.inputs]
    configs = [Config.of(algorithm=a) for a, why in applicable(fused).items() if why is None]
    return tune(loop, backend, inputs, configs=configs,
                build=lambda c: build(fused, c.as_options()["algorithm"], backend,
                                      tuned=True if tune_tiles else None),
                budget_s=budget_s, repeat=repeat, db=db, use_cache=use_cache,
                progress=progress, key=algorithm_key(fused, backend))


def _try(config: Config, build: Callable[[Config], Any],
         constraint: Callable[[Config], str | None] | None, inputs: Sequence[np.ndarray],
         want: Sequence[np.ndarray], repeat: int, bench: Any) -> Candidate:
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
        if not _correct(got, want):
            return Candidate(config, None, "wrong")
        return Candidate(config, bench(kernel, *inputs, repeat=repeat).median_ms, "ok")
    except Exception as exc:  # noqa: BLE001 - a failing config scores 'error', the search goes on
        return Candidate(config, None, f"error: {type(exc).__name__}: {str(exc)[:200]}")


def _random_input(rng: np.random.Generator, buf: Any) -> np.ndarray:
    if buf.dtype.value == "bool":
        return rng.random(buf.shape) < 0.5
    if buf.dtype.is_int:
        return rng.integers(0, 3, buf.shape).astype(buf.dtype.numpy)  # valid gather indices
    return rng.standard_normal(buf.shape).astype(buf.dtype.numpy)


def _print_progress(i: int, n: int, config: Config, ms: float | None, status: str) -> None:
    timing = f"{ms:.3f} ms" if ms is not None else status
    print(f"  tuning [{i}/{n}] {config}: {timing}", file=sys.stderr, flush=True)
