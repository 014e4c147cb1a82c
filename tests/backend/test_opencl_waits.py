"""Waiting for the OpenCL device (``backends/opencl/waiting.py``): on a device where polling
pays, the host polls for a kernel that has run briefly at a wait before, when it is the only
one launched since the last wait, and sleeps otherwise; polling gives up after its limit; whichever
way, a wait returns with the kernel's results complete. Whether polling pays is measured once,
at the first wait that could poll."""
from __future__ import annotations

from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest
from conftest import require

import kernelgen as kg
from kernelgen.backends.opencl import waiting
from kernelgen.backends.opencl.runtime import device


@pytest.fixture
def polls() -> Iterator[mock.MagicMock]:
    """``waiting._poll`` counted (still polling) on a device taken to be one where polling
    pays, whose runs are not polled for (as a model placed 'packed-polled' leaves it), after
    a wait for what earlier tests left."""
    require("opencl")
    dev = device()
    dev.waits.finish(dev.queue)
    with mock.patch.object(dev.waits, "polls", True), \
            mock.patch.object(dev.waits, "poll_runs", False), \
            mock.patch.object(waiting, "_poll", wraps=waiting._poll) as counted:
        yield counted


def _relu(n: int) -> tuple[kg.Kernel, list[object], np.ndarray, np.ndarray]:
    """A ReLU over ``n`` floats, its device buffers (input, output), its input and NumPy's
    output."""
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    kernel = kg.fuse(kg.relu(kg.tensor("x", (n,)))).emit("opencl")
    rt = kernel.runtime
    return (kernel, [rt.device_array(x), rt.device_empty(kernel.loop.outputs[0])], x,
            np.maximum(x, 0))


def _output(kernel: kg.Kernel, handle: object, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(shape, np.float32)
    kernel.runtime.to_host(handle, out)
    return out


def test_a_brief_kernel_is_polled_for_from_its_second_wait(polls: mock.MagicMock) -> None:
    kernel, handles, _, want = _relu(7)
    with mock.patch.object(waiting, "POLL_BELOW_S", 10.0):  # every kernel counts as brief
        kernel.launch(*handles)
        assert polls.call_count == 0  # its first wait sleeps: nothing is known of it yet
        assert kernel.runtime.fastest_s < 10.0
        for calls in (1, 2):
            kernel.launch(*handles)
            assert polls.call_count == calls
    np.testing.assert_array_equal(_output(kernel, handles[1], want.shape), want)


def test_a_kernel_that_ran_long_is_slept_for(polls: mock.MagicMock) -> None:
    kernel, handles, _, want = _relu(13)
    with mock.patch.object(waiting, "POLL_BELOW_S", 0.0):  # no kernel counts as brief
        for _ in range(3):
            kernel.launch(*handles)
    assert polls.call_count == 0
    np.testing.assert_array_equal(_output(kernel, handles[1], want.shape), want)


def test_one_long_run_does_not_stop_the_polling(polls: mock.MagicMock) -> None:
    """Another process taking the cores lengthens a run, not the kernel's work: the fastest
    run seen decides."""
    kernel, handles, _, want = _relu(9)
    kernel.launch(*handles)
    kernel.runtime.fastest_s = 1e-6
    with mock.patch.object(waiting, "seconds", return_value=1.0):  # a run of a second
        kernel.launch(*handles)
    kernel.launch(*handles)
    assert polls.call_count == 2 and kernel.runtime.fastest_s <= 1e-6
    np.testing.assert_array_equal(_output(kernel, handles[1], want.shape), want)


def test_a_wait_after_two_launches_sleeps(polls: mock.MagicMock) -> None:
    """The second launch may wait behind the first: what ran briefly alone says nothing."""
    kernel, handles, _, want = _relu(11)
    with mock.patch.object(waiting, "POLL_BELOW_S", 10.0):
        kernel.launch(*handles)
        kernel.launch(*handles, wait=False)
        kernel.launch(*handles)
    assert polls.call_count == 0
    np.testing.assert_array_equal(_output(kernel, handles[1], want.shape), want)


@pytest.mark.parametrize("poll_runs", [False, True])
def test_a_run_is_polled_for_only_where_its_placement_says(polls: mock.MagicMock,
                                                           poll_runs: bool) -> None:
    """After several launches (a compiled model's run) the wait polls a marker behind them
    where ``poll_runs`` is set (placement.py's 'packed-polled'), and sleeps otherwise;
    either way every launch is complete when it returns."""
    kernel, handles, _, want = _relu(13)
    kernel.launch(*handles)
    waits = device().waits
    with mock.patch.object(waits, "poll_runs", poll_runs), \
            mock.patch.object(waits, "launched", wraps=waits.launched) as launched:
        for _ in range(3):
            kernel.launch(*handles, wait=False)
        waits.finish(device().queue)
    assert polls.call_count == int(poll_runs)
    if poll_runs:  # the marker's, with the runs' limit, not the brief kernels'
        assert polls.call_args.args[2] == waiting.RUN_POLL_LIMIT_S
    assert all(c.args[0].command_execution_status == 0 for c in launched.call_args_list)
    np.testing.assert_array_equal(_output(kernel, handles[1], want.shape), want)


def test_polling_gives_up_and_the_wait_still_returns_the_results(
        polls: mock.MagicMock) -> None:
    """A kernel that ran briefly before and now runs longer than the polling limit: the wait
    sleeps for the rest and returns with every output written."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((96, 96)).astype(np.float32) for _ in range(2))
    kernel = kg.fuse(kg.matmul(kg.tensor("a", a.shape), kg.tensor("b", b.shape))).emit("opencl")
    rt = kernel.runtime
    handles = [rt.device_array(a), rt.device_array(b), rt.device_empty(kernel.loop.outputs[0])]
    kernel.launch(*handles)
    waits = device().waits
    for _ in range(3):
        rt.fastest_s = 0.0  # as if it had run briefly before
        with mock.patch.object(waiting, "POLL_LIMIT_S", 0.0), \
                mock.patch.object(waits, "launched", wraps=waits.launched) as launched:
            kernel.launch(*handles)
        assert polls.call_count > 0
        event = launched.call_args.args[0]
        assert event.command_execution_status == 0  # CL_COMPLETE once the wait returns
        np.testing.assert_allclose(_output(kernel, handles[2], (96, 96)), a @ b, rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("n", [1, 7, 4099])
def test_calls_on_numpy_arrays_poll_their_maps(polls: mock.MagicMock, n: int) -> None:
    """A call on host arrays waits for the kernel, the map of each output and its unmap; on a
    device working on host memory the maps are polled for."""
    kernel, _, x, want = _relu(n)
    for _ in range(3):
        np.testing.assert_array_equal(kernel(x), want)
    if device().info.unified_memory:
        assert polls.call_count >= 2 * 3  # a map and an unmap a call


@pytest.mark.parametrize("slept, polled, polls", [(70e-6, 25e-6, True), (8e-6, 4e-6, False)],
                         ids=["sleeping-slowly", "sleeping-fast"])
def test_whether_polling_pays_is_measured_once_and_obeyed(slept: float, polled: float,
                                                           polls: bool) -> None:
    """The first wait for a brief kernel measures the device's floors, once; afterwards brief
    kernels are polled for exactly where polling saved ``POLL_GAIN_S`` (PoCL's floors and
    Intel's runtime's, as measured)."""
    require("opencl")
    dev = device()
    dev.waits.finish(dev.queue)
    kernel, handles, _, want = _relu(5)
    with mock.patch.object(dev.waits, "polls", None), \
            mock.patch.object(waiting, "POLL_BELOW_S", 10.0), \
            mock.patch.object(waiting, "floors", return_value=(slept, polled)) as floors, \
            mock.patch.object(waiting, "_poll", wraps=waiting._poll) as counted:
        for _ in range(4):
            kernel.launch(*handles)
        assert floors.call_count == 1 and dev.waits.polls is polls
        assert counted.call_count == (3 if polls else 0)
    np.testing.assert_array_equal(_output(kernel, handles[1], want.shape), want)


def test_the_floors_are_two_durations() -> None:
    require("opencl")
    dev = device()
    dev.waits.finish(dev.queue)
    slept, polled = waiting.floors(dev.queue)
    assert 0 < slept < 1 and 0 < polled < 1
