"""A model's OpenCL kernels built in worker processes while it compiles
(``backends/opencl/prewarm.py``): on PoCL the workers build and launch every job, filling its
disk cache, starting once enough jobs wait; a broken job or a stopped pool costs only time; the
kernels then compute in this process what NumPy does."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import require

import kernelgen as kg
from kernelgen.backends.opencl import prewarm
from kernelgen.backends.opencl.language import Launch
from kernelgen.backends.opencl.runtime import device

SIZES = [3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]  # one distinct source each


def _blocks() -> list[kg.FusedOp]:
    out = []
    for n in SIZES:
        x = kg.tensor("x", (n,))
        total = kg.add(x, x)
        out.append(kg.fuse(total, kg.relu(total)))
    return out


def _build(jobs: list[prewarm.Job], device_name: str) -> int:
    """Every job given to a pool at once; how many the workers ran."""
    pool = prewarm.Pool(device_name)
    pool.add(jobs)
    return pool.finish()


def _pocl() -> str:
    require("opencl")
    name = device().name
    if "pocl" not in name.lower():
        pytest.skip(f"the workers fill PoCL's disk cache; this device ({name}) is not PoCL")
    return name


def test_workers_build_and_launch_every_job(monkeypatch: pytest.MonkeyPatch) -> None:
    name = _pocl()
    monkeypatch.setenv(prewarm.WORKERS_ENV, "2")
    kernels = [b.emit("opencl", tuning="none") for b in _blocks()]
    jobs = prewarm.jobs_of(kernels + kernels[:3])  # a kernel twice is one job
    assert len(jobs) == len(SIZES)
    assert _build(jobs, name) == len(SIZES)
    for n, kernel in zip(SIZES, kernels):
        x = np.linspace(-2, 2, n, dtype=np.float32)
        np.testing.assert_array_equal(kernel(x), np.maximum(x + x, 0))


def test_the_pool_starts_at_the_threshold_and_takes_jobs_as_they_come(
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = _pocl()
    monkeypatch.setenv(prewarm.WORKERS_ENV, "2")
    kernels = [b.emit("opencl", tuning="none") for b in _blocks()]
    pool = prewarm.Pool(name)
    pool.add_kernels(kernels[:prewarm.MIN_KERNELS - 1])
    assert not pool.workers  # too few to pay for the workers yet
    pool.add_kernels(kernels[prewarm.MIN_KERNELS - 1:])
    assert len(pool.workers) == 2
    pool.add_kernels(kernels[:3])  # seen already
    assert pool.finish() == len(SIZES)
    stopped = prewarm.Pool(name)
    stopped.add_kernels(kernels)
    stopped.cancel()
    assert not stopped.workers
    built = prewarm.Pool(name, skip=lambda source: True)  # all built in this process
    built.add_kernels(kernels)
    assert not built.workers and built.finish() == 0


def test_a_broken_job_costs_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    name = _pocl()
    monkeypatch.setenv(prewarm.WORKERS_ENV, "2")
    jobs = prewarm.jobs_of([b.emit("opencl", tuning="none") for b in _blocks()])
    broken = prewarm.Job("__kernel void k(__global float* x) { x[0] = y; }", "k",
                         Launch((1,), None), 1, ((1, "<f4"),))
    assert _build([broken, *jobs], name) == len(jobs)


def test_arguments_in_launch_order_with_their_dtypes() -> None:
    require("opencl")
    data, idx = kg.tensor("data", (6, 5)), kg.tensor("idx", (4,), "int64")
    kernel = kg.fuse(kg.gather(data, idx, axis=0)).emit("opencl", tuning="none")
    (job,) = prewarm.jobs_of([kernel])
    assert job.args == ((30, "<f4"), (4, "<i8"), (20, "<f4"))
    assert job.n_inputs == 2 and job.entry == kernel.runtime.name


def test_nothing_runs_where_it_would_not_pay(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [prewarm.Job(f"// {k}", "k", Launch((1,), None), 0, ()) for k in range(20)]
    monkeypatch.setenv(prewarm.WORKERS_ENV, "2")
    assert _build(jobs, "Intel(R) OpenCL CPU") == 0  # no disk cache
    assert _build(jobs[:prewarm.MIN_KERNELS - 1], "pthread-cpu pocl") == 0
    monkeypatch.setenv(prewarm.WORKERS_ENV, "0")
    assert _build(jobs, "pthread-cpu pocl") == 0
    monkeypatch.setenv(prewarm.WORKERS_ENV, "two")
    with pytest.raises(ValueError, match=prewarm.WORKERS_ENV):
        prewarm.workers()
