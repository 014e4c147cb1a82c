"""How the host waits for the OpenCL device's queue: polling the last kernel's status for a
kernel that runs briefly, sleeping in ``clFinish`` otherwise.

PoCL's ``clFinish`` (and an event's wait) sleeps on a condition variable, and waking the host
thread again is slow on the virtual machines measured here: on a Sapphire Rapids VM with 2
cores, a channel shuffle whose kernel ran 5 us took 85 us from launch to the end of the wait,
and 27 us when the host polled its event instead (``bench/brief_waits.py``). Polling holds a
core, which a longer kernel's work-items need: 50 us of polling made a 0.2 ms residual add
50 us slower. So a wait polls only when exactly one kernel was launched since the last wait
and that kernel ran under ``POLL_BELOW_S`` the last time the host waited for it (its first
wait sleeps); polling gives up after ``POLL_LIMIT_S`` and sleeps. Compiled models launch many
kernels a run and keep sleeping.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Protocol

POLL_BELOW_S = 50e-6
POLL_LIMIT_S = 200e-6


class Timed(Protocol):
    """What launched a kernel: whether its last run was brief enough to poll for."""

    brief: bool


class Waits:
    """The kernels launched on one queue since the host last waited for it (the last one's
    event and launcher), shared by every thread that launches there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launches = 0
        self._last: tuple[Any, Timed] | None = None

    def launched(self, event: Any, launcher: Timed) -> None:
        """Note a kernel enqueued on the queue, with its event."""
        with self._lock:
            self._launches += 1
            self._last = (event, launcher)

    def finish(self, queue: Any) -> None:
        """Wait until everything enqueued on ``queue`` is done (``queue.finish()``), polling
        first where the only kernel since the last wait is a brief one; then note whether
        that kernel was brief this time."""
        with self._lock:
            only = self._last if self._launches == 1 else None
            self._launches, self._last = 0, None
        if only is not None and only[1].brief:
            _poll(queue, only[0])
        queue.finish()
        if only is not None:
            only[1].brief = _seconds(only[0]) < POLL_BELOW_S


def polled(queue: Any, event: Any) -> None:
    """Wait for ``event``, a command that moves no data (a map or unmap of a buffer over host
    memory), polling first: a call on NumPy arrays whose kernel ran 5 us took 0.19 ms with a
    sleeping map and unmap beside it, 0.10 with both polled."""
    _poll(queue, event)
    event.wait()


def _poll(queue: Any, event: Any) -> None:
    """Until ``event`` completes, fails (a negative status), or ``POLL_LIMIT_S`` passes."""
    queue.flush()  # an implementation may hold commands until a flush
    deadline = time.perf_counter() + POLL_LIMIT_S
    while event.command_execution_status > 0 and time.perf_counter() < deadline:
        pass


def _seconds(event: Any) -> float:
    """The kernel's run time from its profiling counters (infinite where the implementation
    gives none)."""
    try:
        return (event.profile.end - event.profile.start) * 1e-9
    except Exception:  # pyopencl's RuntimeError or cl.Error: no profiling information
        return float("inf")
