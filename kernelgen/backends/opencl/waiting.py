"""How the host waits for the OpenCL device's queue: polling the last kernel's status for a
kernel that runs briefly, sleeping in ``clFinish`` otherwise.

PoCL's ``clFinish`` (and an event's wait) sleeps on a condition variable, and waking the host
thread again is slow on the virtual machines measured here: on a Sapphire Rapids VM with 2
cores, a channel shuffle whose kernel ran 5 us took 85 us from launch to the end of the wait,
and 27 us when the host polled its event instead (``bench/brief_waits.py``). Polling holds a
core, which a longer kernel's work-items need: 50 us of polling made a 0.2 ms residual add
50 us slower. So a wait polls only when exactly one kernel was launched since the last wait
and that kernel has run under ``POLL_BELOW_S`` at a wait before (the fastest run seen: another
process taking the cores lengthens some runs, not the kernel's work; its first wait sleeps);
polling gives up after ``POLL_LIMIT_S`` and sleeps. Compiled models launch many kernels a run
and sleep, unless their placement of PoCL's workers leaves the host's core free of them
(``poll_runs``, set by placement.py's 'packed-polled', which a model takes only where its
runs were timed faster so): then the host polls a marker behind the run's commands.

Not every implementation sleeps slowly: Intel's CPU runtime waited for an empty kernel in 8 us
sleeping (4 polled), and polling beside its worker threads made brief kernels up to 1.3x
slower. So at the first wait that could poll, the device's two floors are measured on an
empty kernel (``floors``), and its waits poll only where polling saves ``POLL_GAIN_S``.
The decision is made once per process: a brief wait that sleeps costs 40-60 us on PoCL, so
the measurement (3 ms there) pays for itself within a hundred such waits.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Protocol

POLL_BELOW_S = 50e-6
POLL_LIMIT_S = 200e-6
RUN_POLL_LIMIT_S = 0.05  # a polled run (``Waits.poll_runs``) sleeps after this much polling
# by ``floors``: Debian's PoCL 3.1 on 2 cores 69-84 us sleeping against 38-44 polled, pip's
# PoCL 3.0 68-82 against 32-53, Intel's CPU runtime 5.3-6.3 against 4.5-4.8
POLL_GAIN_S = 10e-6
FLOOR_SAMPLES, FLOOR_BLOCKS = 30, 3


class Timed(Protocol):
    """What launched a kernel: its fastest run seen at a wait, in seconds (infinite before
    the first)."""

    fastest_s: float


class Waits:
    """The kernels launched on one queue since the host last waited for it (the last one's
    event and launcher), shared by every thread that launches there. Kept without a lock: a
    compiled model notes every launch of a run (a lock cost a 15-kernel run 3 %), and a count
    that threads race on only changes whether a wait polls or sleeps, never what it waits
    for."""

    def __init__(self) -> None:
        self.launches = 0
        self.last: tuple[Any, Timed] | None = None
        self.polls: bool | None = None  # whether polling pays on this device (``floors``)
        self.recorded: list[Any] | None = None  # every launch's event, while a profile times
        # poll for the end of a wait after several launches (a compiled model's run): set by
        # the placement that leaves the host's core to it (placement.py, 'packed-polled')
        self.poll_runs = False

    def launched(self, event: Any, launcher: Timed) -> None:
        """Note a kernel enqueued on the queue, with its event."""
        self.launches += 1
        self.last = event, launcher
        self.note(event)

    def note(self, event: Any) -> None:
        """Keep ``event`` (a kernel's, or a packing launch's before it) for the profile
        timing the launches now (``OpenCLRuntime.device_ms``)."""
        if self.recorded is not None:
            self.recorded.append(event)

    def finish(self, queue: Any) -> None:
        """Wait until everything enqueued on ``queue`` is done (``queue.finish()``), polling
        first where the only kernel since the last wait is a brief one; then note its run."""
        only = self.last if self.launches == 1 else None
        several = self.launches > 1
        self.launches, self.last = 0, None
        if only is None:
            if several and self.poll_runs:  # a marker completes after everything before it
                import pyopencl as cl
                _poll(queue, cl.enqueue_marker(queue), RUN_POLL_LIMIT_S)
            queue.finish()
            return
        event, launcher = only
        if self.polls and launcher.fastest_s < POLL_BELOW_S:
            _poll(queue, event)
        queue.finish()
        launcher.fastest_s = min(launcher.fastest_s, seconds(event))
        if self.polls is None and launcher.fastest_s < POLL_BELOW_S:
            slept, polled = floors(queue)
            self.polls = slept - polled > POLL_GAIN_S

    def wait_for_map(self, queue: Any, event: Any) -> None:
        """Wait for ``event``, a command that moves no data (a map or unmap of a buffer over
        host memory), polling first where polling pays: a call on NumPy arrays whose kernel
        ran 5 us took 0.19 ms on PoCL with a sleeping map and unmap beside it, 0.10 with both
        polled."""
        if self.polls:
            _poll(queue, event)
        event.wait()


def floors(queue: Any) -> tuple[float, float]:
    """The medians of ``FLOOR_SAMPLES`` launches of an empty kernel on ``queue`` (idle) waited
    for sleeping and of as many polled for, in seconds (``bench/launch_floor.py`` prints the
    same)."""
    import pyopencl as cl
    kernel = cl.Kernel(cl.Program(queue.context, "__kernel void kg_empty(void) {}").build(),
                       "kg_empty")
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(FLOOR_BLOCKS):  # blocks of each way in turn, so that a passing load on
        for polled in (True, False):  # the cores hits both
            for k in range(FLOOR_SAMPLES // FLOOR_BLOCKS + 1):
                start = time.perf_counter()
                event = cl.enqueue_nd_range_kernel(queue, kernel, (1,), None)
                if polled:
                    _poll(queue, event)
                event.wait()
                if k:  # the first wait of a block follows the other way's: not counted
                    times[polled].append(time.perf_counter() - start)
    return statistics.median(times[False]), statistics.median(times[True])


def _poll(queue: Any, event: Any, limit_s: float = POLL_LIMIT_S) -> None:
    """Until ``event`` completes, fails (a negative status), or ``limit_s`` passes; yielding
    the core between looks, since nothing keeps the host off the core of the workers that run
    the kernel: with PoCL's workers packed on one core, a 5 us channel shuffle polled for
    without yielding took 0.09-0.1 ms (the host spun on their core until the limit), 0.023-
    0.025 yielding (bench/patterns.py with KERNELGEN_OPENCL_PLACEMENT=packed)."""
    queue.flush()  # an implementation may hold commands until a flush
    deadline = time.perf_counter() + limit_s
    while event.command_execution_status > 0 and time.perf_counter() < deadline:
        os.sched_yield()


def seconds(event: Any) -> float:
    """The kernel's run time from its profiling counters (infinite where the implementation
    gives none)."""
    try:
        return (event.profile.end - event.profile.start) * 1e-9
    except Exception:  # pyopencl's RuntimeError or cl.Error: no profiling information
        return float("inf")
