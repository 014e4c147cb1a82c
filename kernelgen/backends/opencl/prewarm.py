"""A model's OpenCL kernels built in worker processes while it compiles (PoCL only).

A cold compile of ResNet-50 on PoCL spent 45.6 s in ``clBuildProgram`` (76 programs) and 27.3 s
compiling work-group functions at each kernel's first launch, one after another on one core;
two threads building at once crashed Debian's PoCL ("double free or corruption"). PoCL keeps
both results in its on-disk cache (``$XDG_CACHE_HOME/pocl``), which every process on the machine
shares. So worker processes, one per core, build each kernel as soon as the model's compile has
generated it and launch it once on buffers of the right sizes, while the compile goes on with
the next blocks; the model's own builds and first launches then read the cache (a small kernel:
0.47 s to build cold, 0.04 s from the cache; its first launch 0.10 s, then 0.014 s).

Nothing depends on the workers: a kernel they did not reach, or a worker that failed, is built
by the main process as before. ``KERNELGEN_BUILD_WORKERS`` sets their number (0: none).
"""
from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from .language import Launch
from .runtime import OpenCLRuntime, _import_cl, device

WORKERS_ENV = "KERNELGEN_BUILD_WORKERS"
# the workers start once this many distinct kernels are waiting: for fewer, starting them
# (about 2 s each) costs more than it saves
MIN_KERNELS = 12
TIMEOUT_S = 900


@dataclass(frozen=True)
class Job:
    """One kernel to build and launch once: its source, entry point, launch and the element
    count and NumPy dtype of each argument (inputs, then outputs)."""

    source: str
    entry: str
    geometry: Launch
    n_inputs: int
    args: tuple[tuple[int, str], ...]


def workers() -> int:
    """How many worker processes build: ``KERNELGEN_BUILD_WORKERS``, else one per core."""
    value = os.environ.get(WORKERS_ENV, "").strip()
    if value:
        try:
            return max(0, int(value))
        except ValueError:
            raise ValueError(f"{WORKERS_ENV}={value!r}: expected a number of worker "
                             f"processes (0: build in this process only)") from None
    return os.cpu_count() or 1


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    jobs: queue.Queue[Job | None]  # what its feeder thread writes to its stdin
    feeder: threading.Thread
    load: int = 0  # characters of source given to it


class Pool:
    """Worker processes fed jobs as they come (``add``); ``finish`` waits for them all. They
    start once ``MIN_KERNELS`` jobs are waiting, and only for a device that caches its builds
    on disk (PoCL). The workers are ``python -m kernelgen.backends.opencl.prewarm`` (not
    multiprocessing, whose spawned children import the caller's main script again), sharing
    this environment: the device choice and the cache directories."""

    def __init__(self, device_name: str,
                 skip: Callable[[str], bool] = lambda source: False) -> None:
        self.count = workers() if "pocl" in device_name.lower() else 0
        self.skip = skip  # sources already built in this process
        self.seen: set[tuple[str, str, Launch]] = set()
        self.pending: list[Job] = []
        self.workers: list[_Worker] = []

    def add(self, jobs: Sequence[Job]) -> None:
        if self.count < 2:
            return
        for job in jobs:
            key = (job.source, job.entry, job.geometry)
            if key not in self.seen and not self.skip(job.source):
                self.seen.add(key)
                self.pending.append(job)
        if not self.workers and len(self.pending) >= MIN_KERNELS:
            self._start()
        if self.workers:
            for job in self.pending:  # to the worker with the least source given
                worker = min(self.workers, key=lambda w: w.load)
                worker.load += len(job.source)
                worker.jobs.put(job)
            self.pending.clear()

    def add_kernels(self, kernels: Sequence[Any]) -> None:
        """``add`` the launches of ``kernels`` (``exec.Kernel`` objects)."""
        self.add(jobs_of(kernels))

    def cancel(self) -> None:
        """Stop the workers (the compile failed)."""
        for worker in self.workers:
            worker.proc.kill()
        self.finish()

    def finish(self) -> int:
        """Wait for the workers to run every job given; returns how many ran (0: none
        started)."""
        for worker in self.workers:
            worker.jobs.put(None)
        done = 0
        for worker in self.workers:
            worker.feeder.join()
            try:  # a worker that died (a driver crash) or hangs only costs time
                out, _ = worker.proc.communicate(timeout=TIMEOUT_S)  # closes its stdin first
                words = out.split()
                done += int(words[-1]) if worker.proc.returncode == 0 and words else 0
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.communicate()
        self.workers.clear()
        return done

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[3])  # where ``import kernelgen`` works
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p))
        for _ in range(min(self.count, len(self.pending))):
            proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            jobs: queue.Queue[Job | None] = queue.Queue()
            feeder = threading.Thread(target=_feed, args=(jobs, proc.stdin), daemon=True)
            feeder.start()
            self.workers.append(_Worker(proc, jobs, feeder))


def _feed(jobs: queue.Queue[Job | None], pipe: IO[bytes] | None) -> None:
    """Write each job to a worker's stdin as a length-prefixed pickle, until None (``finish``
    then closes the pipe, which ends the worker)."""
    assert pipe is not None
    try:
        while (job := jobs.get()) is not None:
            data = pickle.dumps(job)
            pipe.write(struct.pack("<Q", len(data)) + data)
            pipe.flush()
    except (OSError, ValueError):  # the worker died: the main process builds what it did not
        pass


def _run(job: Job) -> bool:
    """In a worker: build the job's program and launch it once; whether that worked."""
    cl = _import_cl()
    dev = device()
    try:
        runtime = OpenCLRuntime(job.source, job.entry, job.geometry, job.n_inputs)
        # zeros, and ones for integers: indices in range, no integer division by zero
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
        handles = [cl.Buffer(dev.context, flags, hostbuf=np.full(
            max(n, 1), 1 if np.dtype(dtype).kind in "iu" else 0, dtype))
            for n, dtype in job.args]
        runtime.launch(handles)
        runtime.sync()
        return True
    except Exception:  # noqa: BLE001 - the main process builds it and reports any error
        return False


def _serve(stream: IO[bytes]) -> int:
    """In a worker: run the jobs read from ``stream`` until it ends; returns how many ran."""
    done = 0
    while len(head := stream.read(8)) == 8:
        done += _run(pickle.loads(stream.read(struct.unpack("<Q", head)[0])))
    return done


def jobs_of(kernels: Sequence[Any]) -> list[Job]:
    """The distinct OpenCL launches of ``kernels`` (``exec.Kernel`` objects)."""
    out: dict[tuple[str, str, Launch], Job] = {}
    for k in kernels:
        rt = getattr(k, "runtime", None)
        if not isinstance(rt, OpenCLRuntime):
            continue
        args = tuple((b.numel, b.dtype.numpy.str) for b in (*k.loop.inputs, *k.loop.outputs))
        out.setdefault((rt.source, rt.name, rt.geometry),
                       Job(rt.source, rt.name, rt.geometry, rt.n_inputs, args))
    return list(out.values())


if __name__ == "__main__":  # a worker: python -m kernelgen.backends.opencl.prewarm < jobs
    print(_serve(sys.stdin.buffer))
