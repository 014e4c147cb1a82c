"""Which cores PoCL's worker threads run on, chosen per compiled model by timing it.

PoCL's CPU device runs work-groups on one worker thread per compute unit, and lets Linux place
them. Linux wakes a thread on an idle core near the one that woke it and does not move a
thread that ran in the last half millisecond ("cache hot"), so on the 2-core VMs measured here
both workers often shared one core for good: a 1.8 MB scaling ran all of its 1764 work-groups
on core 0 (read in the kernel with rdtscp), and a BERT layer took 1.37-1.48 ms a run against
1.04-1.10 ms with a worker pinned to each core. Pinned so ("spread"), the many tiny kernels of
a MobileNetV2 at 112x112 took 0.56-0.60 ms against 0.52-0.53 with both workers pinned to one
core ("packed"): a kernel that ends hands the next one to the other core's sleeping worker,
and that wake-up costs more than such a kernel's work. Packed, the host's own core runs no
worker, so the host may poll for the end of a run instead of sleeping in ``clFinish``, whose
wake-up took 40-60 us a run ("packed-polled": MobileNetV2 0.52 -> 0.48 ms); spread, polling
takes a worker's core (the BERT layer 1.14 -> 1.27-1.47 ms). Which one wins is the model's, so
a compiled model times the three at compile time and applies its choice before each run
(``CompiledModel.warm_up``).

The workers are found as the threads of this process, other than the caller's, that are busy
while a model runs (``/proc/self/task/*/schedstat``); they are placed only if there are as
many as the device has compute units. ``POCL_AFFINITY`` (PoCL's own pinning) set by the user,
or ``KERNELGEN_OPENCL_PLACEMENT=off``, leaves them where they are; ``=spread`` or ``=packed``
(or ``=packed-polled``) takes that placement without timing.
"""
from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .device import DeviceInfo

PLACEMENTS = ("spread", "packed", "packed-polled")
PLACEMENT_ENV = "KERNELGEN_OPENCL_PLACEMENT"
FIND_S = 0.05      # seconds of runs in which the workers are seen busy
BUSY_SHARE = 0.05  # of those seconds, on a core, that makes a thread a worker
TIME_BUDGET_S = 0.4  # of the runs that time the placements, about
ROUNDS = 5

_lock = threading.Lock()
_workers: list[int] | None = None  # native thread ids, once found
_applied: str | None = None


def _on_core_ns() -> dict[int, int]:
    """Nanoseconds each thread of this process has run, by native thread id."""
    out: dict[int, int] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            pass
    return out


def applicable(info: DeviceInfo) -> bool:
    """Whether this process may place ``info``'s workers: PoCL's CPU device on Linux, with
    each worker a core of its own to go to, and no one else placing them."""
    setting = os.environ.get(PLACEMENT_ENV, "").strip().lower()
    return (setting != "off" and not os.environ.get("POCL_AFFINITY")
            and info.kind == "cpu" and "PoCL" in info.name
            and hasattr(os, "sched_setaffinity") and Path("/proc/self/task").is_dir()
            and 2 <= info.compute_units <= len(os.sched_getaffinity(0)))


def find_workers(run: Callable[[], object], compute_units: int) -> list[int] | None:
    """The native ids of the threads busy while ``run`` runs again and again (the caller's
    excluded), if there are ``compute_units`` of them; else None."""
    me = threading.get_native_id()
    before, start = _on_core_ns(), time.perf_counter()
    while time.perf_counter() - start < FIND_S:
        run()
    after, wall = _on_core_ns(), time.perf_counter() - start
    busy = sorted(t for t, ns in after.items()
                  if t != me and ns - before.get(t, ns) > BUSY_SHARE * wall * 1e9)
    return busy if len(busy) == compute_units else None


def place(placement: str) -> None:
    """Pin the workers found so far as ``placement`` says: ``spread``, the k-th to the k-th
    core this process may use; ``packed`` (and ``packed-polled``), all to the last one.
    Nothing when none were found, or when they are placed so already. (Whether the host
    polls is the runtime's: ``polls``.)"""
    global _applied, _workers
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement of PoCL's workers '{placement}'; known: "
                         + ", ".join(f"'{p}'" for p in PLACEMENTS))
    with _lock:
        if _workers is None or placement == _applied:
            return
        cores = sorted(os.sched_getaffinity(0))
        try:
            for k, tid in enumerate(_workers):
                os.sched_setaffinity(tid, {cores[k % len(cores)] if placement == "spread"
                                           else cores[-1]})
        except OSError:  # a worker ended (the platform was released): place nothing more
            _workers, _applied = None, None
            return
        _applied = placement


def polls(placement: str | None) -> bool:
    """Whether the host polls for the end of a run under ``placement``."""
    return placement == "packed-polled"


def release() -> None:
    """Let the workers found so far run on any core this process may use again."""
    global _applied
    with _lock:
        cores = os.sched_getaffinity(0)
        for tid in _workers or ():
            try:
                os.sched_setaffinity(tid, cores)
            except OSError:
                pass
        _applied = None


def choose(run: Callable[[], object], info: DeviceInfo,
           apply: Callable[[str], None] = place, given: str | None = None) -> str | None:
    """The placement under which ``run`` (a compiled model's run) is fastest, timed in
    rounds that alternate them (each applied by ``apply``: the runtime's, which also sets
    the polling), or ``PLACEMENT_ENV``'s, or else ``given`` (a saved model's choice), without
    timing any (the workers found all the same, so that it can be applied); None where the
    workers cannot be placed."""
    global _workers
    if not applicable(info):
        return None
    with _lock:
        known = _workers is not None
    if not known:
        found = find_workers(run, info.compute_units)
        with _lock:
            _workers = _workers or found
            if _workers is None:
                return None
    setting = os.environ.get(PLACEMENT_ENV, "").strip().lower()
    if setting in PLACEMENTS:
        return setting
    if given is not None:
        return given
    start = time.perf_counter()
    run()
    # each round runs each placement 1 + repeat times; a slow model gets fewer rounds
    runs = TIME_BUDGET_S / max(time.perf_counter() - start, 1e-6) / len(PLACEMENTS)
    rounds = max(1, min(ROUNDS, int(runs / 2)))
    repeat = max(1, min(10, int(runs / rounds) - 1))
    times: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
    for _ in range(rounds):
        for p in PLACEMENTS:
            apply(p)
            run()  # the first run after a move pays for the caches the threads left
            for _ in range(repeat):
                start = time.perf_counter()
                run()
                times[p].append(time.perf_counter() - start)
    return min(PLACEMENTS, key=lambda p: statistics.median(times[p]))
