"""Where a compiled model's time goes: each launch timed on its own (``profile``).

A run of a compiled model waits for its device once, at the end; the profile runs each launch
and waits for it, in the plan's order, every round, so each launch finds the caches as the
one before it left them, as in a run, and the worker threads placed as the model's runs place
them. Its time is the device's own where the runtime counts it (OpenCL's profiling counters,
``Runtime.device_ms``: the kernels and their packing launches, without the host's launch and
wait), else the host's round trip from the launch to the end of the wait, which includes the
runtime's launch floor (docs/benchmarks.md: tens of microseconds on PoCL), so that the
launches add up to more than a run. Both are kept: ``waited_ms`` is the round trip. A launch
of a stage that runs concurrently is timed alone.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..exec import Program
from .executor import CompiledModel


@dataclass(frozen=True)
class LaunchTime:
    """One launch of a profiled model: its plan index, the operators it computes (``Kind(name)``
    where the graph has them), how long it took (medians over the rounds: ``ms`` on the
    profile's clock, ``waited_ms`` from the launch to the end of the wait), and the
    arithmetic and memory traffic counted on its loop IR (a program's stages added up)."""

    launch: int
    kernel: str
    ops: tuple[str, ...]
    schedule: str
    ms: float
    waited_ms: float
    flops: int
    bytes_moved: int

    @property
    def gflops(self) -> float:
        return self.flops / max(self.ms, 1e-9) / 1e6

    @property
    def gbytes(self) -> float:
        """Gigabytes a second read and written."""
        return self.bytes_moved / max(self.ms, 1e-9) / 1e6


@dataclass(frozen=True)
class Profile:
    """Every launch's time and the median whole run's, in milliseconds; ``clock`` says what
    the launches' ``ms`` are: 'device' (the runtime's counters) or 'host' (round trips)."""

    launches: tuple[LaunchTime, ...]
    run_ms: float
    clock: str

    @property
    def launches_ms(self) -> float:
        return sum(t.ms for t in self.launches)

    def table(self, top: int | None = None) -> str:
        """The launches slowest first (the ``top`` of them), each with its share of the
        launches' total, its rates and the operators it computes."""
        rows = sorted(self.launches, key=lambda t: -t.ms)[:top]
        total = self.launches_ms or 1.0
        lines = [f"{'#':>4} {self.clock + ' ms':>11} {'share':>6} {'waited':>7} "
                 f"{'GFLOP/s':>8} {'GB/s':>6}  {'schedule':<12} operators"]
        for t in rows:
            ops = ", ".join(t.ops)
            lines.append(f"{t.launch:>4} {t.ms:>11.3f} {t.ms / total:>6.1%} {t.waited_ms:>7.3f} "
                         f"{t.gflops:>8.1f} {t.gbytes:>6.1f}  {t.schedule:<12} "
                         f"{ops if len(ops) <= 60 else ops[:57] + '...'}")
        lines.append(f"{len(self.launches)} launches: {self.launches_ms:.3f} ms ({self.clock}), "
                     f"{sum(t.waited_ms for t in self.launches):.3f} ms waited for one by one; "
                     f"a whole run {self.run_ms:.3f} ms")
        return "\n".join(lines)


def profile(model: CompiledModel, feeds: Mapping[str, np.ndarray] | None = None,
            rounds: int = 20) -> Profile:
    """Time each launch of ``model`` on ``feeds`` (input name -> array; zeros when None) in
    ``rounds`` rounds over the plan's launches, and whole runs in between."""
    rt = model.runtime
    if feeds is None:
        feeds = {v.name: np.zeros(v.shape, v.dtype.numpy) for v in model.graph.inputs}
    if rt is None or not model.plan.launches:
        return Profile((), _median_ms(lambda: model.run(feeds), rounds), "host")
    handles = model.bind(feeds)
    plan = model.plan
    calls = [model.executables[launch.kernel].bound_launch(*(handles[a] for a in launch.args))
             for launch in plan.launches]

    def uncounted(call: Callable[[], None]) -> None:
        call()
        rt.sync()

    counted: Callable[[Callable[[], None]], float | None] = getattr(rt, "device_ms", uncounted)

    def timed(call: Callable[[], None]) -> tuple[float | None, float]:
        start = time.perf_counter()
        device = counted(call)  # waits for the device
        return device, (time.perf_counter() - start) * 1e3

    model.run(feeds)  # places the worker threads as a run does
    for call in calls:  # builds whatever is built on first use
        timed(call)
    device: list[list[float | None]] = [[] for _ in calls]
    host: list[list[float]] = [[] for _ in calls]
    runs: list[float] = []
    for _ in range(rounds):
        for k, call in enumerate(calls):
            d, h = timed(call)
            device[k].append(d)
            host[k].append(h)
        runs.append(_median_ms(lambda: model.run(feeds), 1))
    on_device = all(d is not None for times in device for d in times)
    kinds = {op.name: op.kind for op in model.graph.ops}  # none in a model loaded from a save
    return Profile(tuple(
        _launch_time(model, k, kinds, statistics.median(device[k] if on_device else host[k]),
                     statistics.median(host[k])) for k in range(len(calls))),
        statistics.median(runs), "device" if on_device else "host")


def _launch_time(model: CompiledModel, k: int, kinds: Mapping[str, str], ms: float,
                 waited_ms: float) -> LaunchTime:
    launch = model.plan.launches[k]
    exe = model.executables[launch.kernel]
    kernels: Sequence = exe.kernels if isinstance(exe, Program) else [exe]
    schedule = ("+".join(str(x.metadata.get("schedule")) for x in kernels)
                if len(kernels) <= 2 else f"{len(kernels)} stages")
    ops = tuple(f"{kinds[n]}({n})" if n in kinds else n for n in launch.ops)
    return LaunchTime(k, kernels[0].name, ops, schedule, ms, waited_ms,
                      sum(x.loop.flops() for x in kernels),
                      sum(x.loop.bytes_moved() for x in kernels))


def _median_ms(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
