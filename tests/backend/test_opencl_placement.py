"""Where PoCL's worker threads run (``backends/opencl/placement.py``): a compiled model on
PoCL finds them and chooses a placement by timing, each placement gives onnxruntime's outputs,
and the settings that leave the threads alone do. Elsewhere (Intel's runtime) nothing is
placed."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from unittest import mock

import numpy as np
import pytest
from conftest import require
from onnx import helper, numpy_helper

import kernelgen as kg
from kernelgen.backends.opencl import placement
from kernelgen.backends.opencl.runtime import device

rng = np.random.default_rng(5)


def _model() -> tuple[kg.Session, np.ndarray, np.ndarray]:
    """relu(x W + b) then a softmax, on a 37 x 61 input: the session, x and NumPy's
    outputs."""
    w, b = rng.standard_normal((61, 29)).astype(np.float32), rng.standard_normal(29)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"]),
             helper.make_node("Relu", ["g"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "placed", [helper.make_tensor_value_info("x", 1, [37, 61])],
        [helper.make_tensor_value_info("y", 1, [37, 29])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b.astype(np.float32), "b")])
    session = kg.compile_model(helper.make_model(graph), backend="opencl", fusion="dnnfusion")
    x = rng.standard_normal((37, 61)).astype(np.float32)
    r = np.maximum(x.astype(np.float64) @ w + b, 0)
    e = np.exp(r - r.max(axis=1, keepdims=True))
    return session, x, e / e.sum(axis=1, keepdims=True)


@pytest.fixture()
def released() -> Iterator[None]:
    require("opencl")
    yield
    placement.release()
    device().waits.poll_runs = False


def test_opencl_model_places_the_workers_it_times(released: None) -> None:
    session, x, want = _model()
    info = device().info
    if not placement.applicable(info):
        assert session.model.placement is None, info.name  # Intel's runtime: not PoCL
        return
    assert session.model.placement in placement.PLACEMENTS
    workers = placement._workers
    assert workers is not None and len(workers) == info.compute_units
    cores = sorted(os.sched_getaffinity(0))
    for chosen in placement.PLACEMENTS:
        session.model.placement = chosen
        (got,) = session.run(None, {"x": x})  # a run applies its model's placement
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        pinned = [os.sched_getaffinity(t) for t in workers]
        expected = [{cores[k]} for k in range(len(workers))] if chosen == "spread" \
            else [{cores[-1]}] * len(workers)
        assert pinned == expected, chosen
        assert device().waits.poll_runs == (chosen == "packed-polled"), chosen
    placement.release()
    assert all(os.sched_getaffinity(t) == set(cores) for t in workers)


def test_warming_up_again_times_each_placement_as_itself(released: None) -> None:
    """A model warmed up again (its placement kept from the first time) times every
    placement on runs under that placement: before, each run applied the kept one first, so
    all three were timed as one and the choice was a toss (a BERT layer then kept 'packed',
    1.5 ms a run against 1.1 spread)."""
    session, _, _ = _model()
    model = session.model
    if model.placement is None:
        pytest.skip(f"workers are placed on PoCL only; the device is {device().info.name}")
    seen: list[tuple[str, str | None, bool]] = []

    def trial(run: Callable[[], object], info: object, apply: Callable[[str], None],
              given: str | None = None) -> str:
        assert given is None
        for p in placement.PLACEMENTS:
            apply(p)
            run()
            seen.append((p, placement._applied, device().waits.poll_runs))
        return "packed"
    model.placement = "spread"
    with mock.patch.object(placement, "choose", trial):
        model.warm_up()
    assert seen == [(p, p, placement.polls(p)) for p in placement.PLACEMENTS]
    assert model.placement == "packed"


@pytest.mark.parametrize("setting", ["off", "packed", "packed-polled", "pocl_affinity"])
def test_opencl_placement_settings(released: None, monkeypatch: pytest.MonkeyPatch,
                                   setting: str) -> None:
    """``KERNELGEN_OPENCL_PLACEMENT=off`` and a user's ``POCL_AFFINITY`` leave the threads
    alone; ``=packed`` (or ``=packed-polled``) takes that placement without timing the
    others."""
    if setting == "pocl_affinity":
        monkeypatch.setenv("POCL_AFFINITY", "1")
    else:
        monkeypatch.setenv(placement.PLACEMENT_ENV, setting)
    session, x, want = _model()
    (got,) = session.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    pocl = "PoCL" in device().info.name
    assert session.model.placement == (setting if setting.startswith("packed") and pocl
                                       else None)


def test_opencl_workers_are_not_guessed(released: None) -> None:
    """The busy threads are taken for the workers only if there are as many as the device
    has compute units."""
    session, x, _ = _model()
    units = device().info.compute_units
    assert placement.find_workers(lambda: session.run(None, {"x": x}), units + 1) is None


def test_benchmark_runners_place_the_workers_as_a_model(released: None) -> None:
    """``measure.runner`` chooses a placement for its calls as a compiled model does and
    applies it before each call, whatever another runner or model placed since."""
    from kernelgen.measure import runner
    kernel = kg.fuse(kg.relu(kg.tensor("x", (4099,)))).emit("opencl")
    x = rng.standard_normal(4099).astype(np.float32)
    chosen: list[str | None] = []

    def recorded(*args: object, **kwargs: object) -> str | None:
        chosen.append(choose(*args, **kwargs))
        return chosen[-1]
    choose = placement.choose
    with mock.patch.object(placement, "choose", recorded):
        run = runner(kernel, x)
    if not placement.applicable(device().info):
        assert chosen == [None], device().info.name  # Intel's runtime: nothing placed
        return
    (mine,) = chosen
    assert mine in placement.PLACEMENTS
    other = "spread" if mine != "spread" else "packed"
    device_runtime = kernel.runtime
    device_runtime.place(other)  # as another runner or a model might
    run()
    cores = sorted(os.sched_getaffinity(0))
    workers = placement._workers
    assert workers is not None
    expected = [{cores[k]} for k in range(len(workers))] if mine == "spread" \
        else [{cores[-1]}] * len(workers)
    assert [os.sched_getaffinity(t) for t in workers] == expected
    assert device().waits.poll_runs == placement.polls(mine)


def test_benchmark_runners_take_a_given_placement(released: None) -> None:
    """``runner(..., placement=...)`` takes the placement it is given (a runner timed in
    turns with another shares the other's) without timing any; the callable names it, and
    an unknown name is refused."""
    from kernelgen.measure import runner
    kernel = kg.fuse(kg.relu(kg.tensor("x", (4099,)))).emit("opencl")
    x = rng.standard_normal(4099).astype(np.float32)
    choose = placement.choose

    def untimed(*args: object, given: str | None = None) -> str | None:
        assert given is not None, "timed"  # given: the workers found, nothing timed
        return choose(*args, given=given)  # type: ignore[arg-type]
    with mock.patch.object(placement, "choose", untimed):
        run = runner(kernel, x, placement="packed")
    np.testing.assert_array_equal(kernel(x), np.maximum(x, 0))
    assert run.placement == "packed"  # type: ignore[attr-defined]
    run()
    if placement._workers is not None:  # PoCL's workers, once found
        cores = sorted(os.sched_getaffinity(0))
        assert [os.sched_getaffinity(t) for t in placement._workers] == \
            [{cores[-1]}] * len(placement._workers)
    with pytest.raises(ValueError, match="unknown placement of PoCL's workers 'sideways'"):
        runner(kernel, x, placement="sideways")()


def test_a_given_placement_is_applied_before_any_was_timed(released: None) -> None:
    """A runner given a placement in a process where none was timed yet finds the workers
    (without timing any placement) and pins them: before, nothing was placed, and a
    benchmark's two variants ran with both workers on one core in some processes (device
    times 1.7x those of others)."""
    from kernelgen.measure import runner
    if not placement.applicable(device().info):
        pytest.skip(f"workers are placed on PoCL only; the device is {device().info.name}")
    kernel = kg.fuse(kg.relu(kg.tensor("x", (4099,)))).emit("opencl")
    x = rng.standard_normal(4099).astype(np.float32)
    with mock.patch.object(placement, "_workers", None), \
            mock.patch.object(placement, "find_workers", wraps=placement.find_workers) as found:
        run = runner(kernel, x, placement="packed")
        run()
        assert found.call_count == 1 and placement._workers is not None
        cores = sorted(os.sched_getaffinity(0))
        assert [os.sched_getaffinity(t) for t in placement._workers] == \
            [{cores[-1]}] * len(placement._workers)
