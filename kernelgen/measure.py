"""One benchmark methodology for every kernel and backend: device-resident buffers allocated once,
warm-up launches (compilation happens at the first one), repeated timed launches, and the median
with p20/p80. Throughput uses the loop IR's counts: bytes = each input read once plus each
output written once, flops = arithmetic counted on the IR.

A sequence of kernels (an unfused chain) is timed the same way, wired by buffer name, and
credited with the bytes and flops of the useful work (its external inputs and final outputs), so
fused and unfused report comparable effective GB/s.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np

from .errors import ArgumentError
from .exec import Kernel, Program
from .exec.arguments import bind_inputs


@dataclass(frozen=True)
class Measurement:
    """Timing of repeated runs, in milliseconds, and the throughput at the median."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    gbps: float
    gflops: float
    runs: int
    bytes_moved: int
    flops: int
    loadavg: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return (f"{self.median_ms:.3f} ms (p20 {self.p20_ms:.3f}, p80 {self.p80_ms:.3f}), "
                f"{self.gbps:.1f} GB/s, {self.gflops:.2f} GFLOP/s")


def pipeline_io(kernels: Sequence[Kernel]) -> tuple[list[Any], list[Any]]:
    """External input buffers (in order of first use) and final output buffers of a chain."""
    produced = {b.name for k in kernels for b in k.loop.outputs}
    consumed = {b.name for k in kernels for b in k.loop.inputs}
    inputs: dict[str, Any] = {}
    for k in kernels:
        for b in k.loop.inputs:
            if b.name not in produced:
                inputs.setdefault(b.name, b)
    outputs = [b for k in kernels for b in k.loop.outputs if b.name not in consumed]
    return list(inputs.values()), outputs


def _chain(kernels: Any) -> list[Kernel]:
    if isinstance(kernels, Program):
        return list(kernels.kernels)
    if isinstance(kernels, Kernel):
        return [kernels]
    if isinstance(kernels, (list, tuple)) and kernels and \
            all(isinstance(k, Kernel) for k in kernels):
        return list(kernels)
    raise ArgumentError(f"bench takes a kernel or Program (what FusedOp.emit returns) or a "
                        f"list of kernels, then its input arrays; got {type(kernels).__name__} "
                        f"{kernels!r:.60}")


def runner(kernels: Kernel | Sequence[Kernel] | Program, *inputs: np.ndarray,
           placement: str | None = None) -> Callable[[], None]:
    """A zero-argument callable that runs ``kernels`` (one kernel, a chain wired by buffer
    name, or a ``Program``) on device-resident copies of ``inputs`` and waits for the last one.
    Buffers are allocated once, here, and the launches bound to them (``Runtime.bound``, as a
    compiled model runs them); the first launch (compilation happens there) too. Where the
    runtime places its worker threads (OpenCL on PoCL), the placement under which these
    runs are fastest is chosen here, or ``placement`` is taken, and applied before each run,
    as a compiled model does (``KERNELGEN_OPENCL_PLACEMENT=off`` leaves them to the OS); the
    callable's ``placement`` attribute names it (None where nothing is placed). Runners timed
    in turns should share one placement, or each run first moves the workers back
    (``bench/patterns.py`` gives its copy kernel the pattern's). This is the callable to hand
    to pytest-benchmark's ``benchmark`` fixture."""
    chain = _chain(kernels)
    if len({k.backend for k in chain}) != 1:
        raise ArgumentError("bench: every kernel of a chain must come from the same backend")
    ins, _ = pipeline_io(chain)
    if isinstance(kernels, Program):
        env = kernels.bind(*inputs)
        arrays = [env[b.name] for b in ins]
    else:  # checked as a call checks them: count, shape, dtype (never converted); C order made
        callee = (f"bench: kernel '{chain[0].name}'" if len(chain) == 1 else
                  f"bench: the chain {', '.join(repr(k.name) for k in chain)}")
        constants = {name: value for k in chain for name, value in k.constants.items()}
        arrays = bind_inputs(callee, ins, inputs, {}, constants)
    runtime = chain[0].runtime
    handles: dict[str, Any] = {}
    for buf, arr in zip(ins, arrays):
        handles[buf.name] = runtime.device_array(arr)
    for k in chain:
        for b in k.loop.outputs:
            handles[b.name] = runtime.device_empty(b)

    def bound(k: Kernel) -> Callable[[], None]:
        args = [handles[b.name] for b in k.loop.inputs + k.loop.outputs]
        if hasattr(k.runtime, "bound"):  # as a compiled model binds it: arguments set once
            return k.bound_launch(*args)
        return partial(k.launch, *args, wait=False)
    calls = [bound(k) for k in chain]

    def run_once() -> None:
        for call in calls:
            call()
        runtime.sync()

    run_once()
    # the runtime's worker threads placed as these runs are fastest, as a compiled model's
    # are (graph/executor.py, ``warm_up``): on PoCL, Linux left both workers on one core
    placed = None
    if hasattr(runtime, "choose_placement"):  # a given one untimed, its workers found
        placed = runtime.choose_placement(run_once, given=placement) or placement
    if placed is None:
        run_once.placement = None  # type: ignore[attr-defined]
        return run_once

    def run_placed() -> None:
        runtime.place(placed)  # type: ignore[attr-defined]  # another runner placed them
        run_once()
    run_placed.placement = placed  # type: ignore[attr-defined]
    return run_placed


def bench(kernels: Kernel | Sequence[Kernel] | Program, *inputs: np.ndarray, warmup: int = 3,
          repeat: int = 20, min_time_s: float = 0.0) -> Measurement:
    """Time ``kernels`` (one kernel, a chain wired by buffer name, or a ``Program``) on
    ``inputs``.

    At least ``repeat`` timed runs after ``warmup`` untimed ones, more until ``min_time_s``.
    """
    run_once = runner(kernels, *inputs)
    for _ in range(warmup):
        run_once()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_time_s:
        t0 = time.perf_counter()
        run_once()
        times.append((time.perf_counter() - t0) * 1e3)
    return _measurement(kernels, times)


# How long one runtime's calls run untimed after another's before they are timed: a thread
# pool that spins after its own runs (onnxruntime's; Intel's CPU OpenCL runtime's TBB workers)
# slows whatever runs next on the cores it spins on. On a 2-core VM, 2026-12-04, the BERT layer
# on Intel's runtime ran 1.45-1.9 ms for about 25 ms after a block of onnxruntime's runs, and
# 0.95 ms from then on (docs/benchmarks.md, "Runtimes timed after each other's threads idle").
SETTLE_S = 0.05


def settle(calls: Mapping[str, Callable[[], object]], rounds: int = 1,
           seconds: float = SETTLE_S) -> None:
    """Untimed rounds of ``calls``: ``rounds`` at least, and more until ``seconds`` have passed,
    so that another runtime's threads still spinning after its own runs have gone idle (and
    these calls' own threads are awake) when the timed runs begin."""
    start = time.perf_counter()
    done = 0
    while done < rounds or time.perf_counter() - start < seconds:
        for call in calls.values():
            call()
        done += 1


def round_robin(calls: Mapping[str, Callable[[], object]], warmup: int = 3, repeat: int = 20,
                apart: Mapping[str, Callable[[], object]] | None = None, blocks: int = 2,
                settle_s: float = SETTLE_S) -> dict[str, list[float]]:
    """Each call's wall times in ms, ``repeat`` rounds of one call of each after ``warmup``
    untimed rounds, so that drift in the machine's state (the other core's load, frequency)
    hits every call alike and their ratios stay meaningful on a noisy machine.

    The calls in ``apart`` (another runtime, e.g. onnxruntime) are timed in ``blocks`` blocks
    of their own (``repeat`` runs in all, after ``warmup`` untimed ones), the first just before
    the rounds, the last just after them and the others between equal shares of them:
    onnxruntime's thread pool keeps spinning after each run, and a call right after it then
    shares the cores with those threads (on 2 cores, kernelgen's SqueezeNet ran 1.8x slower
    interleaved with it than alone). Whenever one side follows the other, it first runs
    untimed for ``settle_s`` at least (``settle``): ``warmup`` rounds did not outlast the other
    side's spinning threads."""
    apart = dict(apart or {})
    clash = sorted(set(calls) & set(apart))
    if clash:
        raise ArgumentError(f"round_robin: {clash} named both in calls and apart")
    if apart and blocks < 2:
        raise ArgumentError(f"round_robin: blocks={blocks}; the calls apart need 2 at least "
                            f"(before and after the rounds)")
    times: dict[str, list[float]] = {name: [] for name in (*calls, *apart)}

    def run(chosen: Mapping[str, Callable[[], object]], n: int, timed: bool) -> None:
        for _ in range(n):
            for name, call in chosen.items():
                t0 = time.perf_counter()
                call()
                if timed:
                    times[name].append((time.perf_counter() - t0) * 1e3)

    def share(i: int, parts: int) -> int:  # the i-th of ``parts`` near-equal shares of repeat
        return repeat * (i + 1) // parts - repeat * i // parts

    if not apart:
        settle(calls, warmup, settle_s)
        run(calls, repeat, True)
        return times
    for i in range(blocks - 1):
        for name, call in apart.items():
            settle({name: call}, warmup if i == 0 else 1, settle_s)
            run({name: call}, share(i, blocks), True)
        settle(calls, warmup if i == 0 else 1, settle_s)
        run(calls, share(i, blocks - 1), True)
    for name, call in apart.items():
        settle({name: call}, 1, settle_s)
        run({name: call}, share(blocks - 1, blocks), True)
    return times


def bench_interleaved(variants: dict[str, tuple[Any, Sequence[np.ndarray]]],
                      warmup: int = 3, repeat: int = 20) -> dict[str, Measurement]:
    """Time several variants round-robin (``round_robin``)."""
    runners = {name: runner(kernels, *arrays) for name, (kernels, arrays) in variants.items()}
    times = round_robin(runners, warmup, repeat)
    return {name: _measurement(variants[name][0], times[name]) for name in runners}


def _measurement(kernels: Any, times: list[float]) -> Measurement:
    chain = _chain(kernels)
    ins, outs = pipeline_io(chain)
    n_bytes = sum(b.numel * b.dtype.itemsize for b in ins + outs)
    n_flops = sum(k.loop.flops() for k in chain)
    median = float(np.median(times))
    return Measurement(median, float(np.percentile(times, 20)), float(np.percentile(times, 80)),
                       n_bytes / median / 1e6, n_flops / median / 1e6, len(times), n_bytes,
                       n_flops, os.getloadavg()[0])
