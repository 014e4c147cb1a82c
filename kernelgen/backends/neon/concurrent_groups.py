"""IOS's parallel stages on NEON C: each group of kernel calls runs on a thread of its own, the
groups at once, each group's OpenMP regions on its share of the cores.

A NEON kernel is a C function called through ctypes, which releases the GIL for the call, so
groups on separate threads run their kernels at the same time. OpenMP's thread count is a
per-thread setting (``omp_set_num_threads`` sets the calling thread's), so each group thread
sets its share before its calls; the threads are kept for the process, and with them the
OpenMP teams each one leads (a new host thread per stage would start a new team each time).
Kernels allocate their scratch per call, so any kernel may run in a group.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


@functools.cache
def _openmp() -> Any:
    """libgomp, whose per-thread settings the kernels' parallel regions read (GCC's OpenMP,
    which the kernels are built with); None where it cannot be loaded (the groups then share
    the cores by the OS's scheduling alone)."""
    try:
        return ctypes.CDLL("libgomp.so.1")
    except OSError:
        return None


def _cores() -> int:
    """The threads one kernel's parallel regions use when it runs alone."""
    omp = _openmp()
    return int(omp.omp_get_max_threads()) if omp is not None else os.cpu_count() or 1


def shares(groups: int, cores: int) -> list[int]:
    """Each group's OpenMP threads: the cores split as evenly as they go, at least one each."""
    return [max(1, cores // groups + (k < cores % groups)) for k in range(groups)]


def _run(calls: Sequence[Callable[[], None]], threads: int) -> None:
    omp = _openmp()
    if omp is not None:
        omp.omp_set_num_threads(threads)
    for call in calls:
        call()


def concurrently(groups: Sequence[Sequence[Callable[[], None]]]) -> None:
    """Run each group's calls in order, the groups at once on the pool's threads; return when
    every group is done, raising the first group's error if any failed."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="kernelgen-neon")
        pool = _pool
    futures: list[Future[None]] = [pool.submit(_run, g, n)
                                   for g, n in zip(groups, shares(len(groups), _cores()))]
    errors = [f.exception() for f in futures]  # waits for each
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
