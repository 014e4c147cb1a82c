"""The OpenCL device's launch floor: the wall time of one empty kernel enqueued and waited for
(what every single-kernel timing in bench/ includes), sleeping in the wait and polling the
event's status (as kernelgen waits for a brief kernel, ``backends/opencl/waiting.py``), the
same per kernel when ten are queued before one wait (how a Program's stages run), and the
event-profiled execution time. On PoCL's pthread device the floor is the threads' wake-up,
not the kernel, and it bounds any small kernel's speed against a CPU library that runs in the
calling thread. What a wake-up costs on this machine is printed after them: two threads
handing a turn back and forth through a condition variable (bench/wake_latency.c, built with
the C compiler), pinned to one core and to two.

    python bench/launch_floor.py [--repeat 200]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kernelgen.backends.opencl.runtime import device


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    import pyopencl as cl

    dev = device()
    buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 4096)
    kernel = cl.Program(dev.context, "__kernel void empty(__global float* x) {}").build().empty
    kernel(dev.queue, (1,), None, buf).wait()
    single, polled, queued, profiled = [], [], [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        event = kernel(dev.queue, (1,), None, buf)
        event.wait()
        single.append(time.perf_counter() - t0)
        profiled.append((event.profile.end - event.profile.start) * 1e-9)
        t0 = time.perf_counter()
        for _ in range(10):
            kernel(dev.queue, (1,), None, buf)
        dev.queue.finish()
        queued.append((time.perf_counter() - t0) / 10)
    for _ in range(args.repeat):  # apart: a sleeping wait leaves the threads slower to wake
        t0 = time.perf_counter()
        event = kernel(dev.queue, (1,), None, buf)
        dev.queue.flush()
        while event.command_execution_status > 0:
            pass
        polled.append(time.perf_counter() - t0)
    print(f"device: {dev.name}")
    print(f"empty kernel, enqueue + wait: median {np.median(single) * 1e3:.4f} ms")
    print(f"empty kernel, enqueue + polled wait: median {np.median(polled) * 1e3:.4f} ms")
    print(f"empty kernel, 10 queued then one wait: median {np.median(queued) * 1e3:.4f} ms "
          f"per kernel")
    print(f"empty kernel, profiled execution: median {np.median(profiled) * 1e3:.4f} ms")
    wake_ups()
    return 0


def wake_ups(rounds: int = 20000) -> None:
    """Print the round trip of two threads waking each other (bench/wake_latency.c) on one
    core and across two."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("thread wake-ups: not measured, no C compiler (cc or gcc) on PATH")
        return
    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "wake_latency"
        subprocess.run([cc, "-O2", "-pthread", str(Path(__file__).parent / "wake_latency.c"),
                        "-o", str(exe)], check=True)
        pairs = [("one core", cores[0], cores[0])]
        if len(cores) > 1:
            pairs.append(("two cores", cores[0], cores[1]))
        for label, a, b in pairs:
            us = float(subprocess.run([str(exe), str(a), str(b), str(rounds)], check=True,
                                      capture_output=True, text=True).stdout)
            print(f"two threads waking each other, {label} (cores {a}, {b}): "
                  f"{us:.1f} us a round trip")


if __name__ == "__main__":
    sys.exit(main())
