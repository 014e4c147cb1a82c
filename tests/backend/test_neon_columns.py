"""NEON's 'columns' schedule (a depthwise or grouped conv's default): each output element's
window is a vector accumulator over four output columns, its loads through padding one vector
where the guard passes and lane by lane at the edges. The blocks of the OpenCL window tests
(rows no multiple of four, prime heights, batch > 1, dilation, asymmetric pads wider than a
vector, a channel multiplier, a 7x7 kernel; a ReLU prologue and three epilogues) against ONNX's
reference, on the default and on the forced 'row' schedule; stride-2 windows (convs and max
pools) through deinterleaving loads; where it does not apply; bad schedules refused; the
tuner's choice between the two."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_close, require
from reference import evaluate_chain
from test_opencl_window import BLOCKS, _block, _check

from kernelgen import backends
from kernelgen.tune import tune
import kernelgen as kg
from kernelgen.fastrun import FastRunDB
from kernelgen.backends.neon.schedule import columns_plan


@pytest.mark.parametrize("epilogue", ["sigmoid", "residual", "scale"])
@pytest.mark.parametrize("name", BLOCKS)
def test_columns_is_the_default_and_matches_onnx(name: str, epilogue: str) -> None:
    require("neon")
    ops, feeds = _block(name, epilogue)
    fused = kg.fuse(*ops)
    kernel = fused.emit("neon", tuning="none", algorithm="direct")
    width = ops[-1].shape[-1]
    # two vectors of four at least: a shorter row keeps the scalar 'row' schedule
    assert kernel.metadata["schedule"] == ("columns" if width >= 8 else "row")
    if width >= 8:
        load = "vld2q_f32(in0" if "stride2" in name else "vld1q_f32(in0"
        assert "vfmaq_f32(" in kernel.source and load in kernel.source
    _check(kernel, ops, feeds)
    _check(fused.emit("neon", tuning="none", algorithm="direct", schedule="row"), ops, feeds)


def test_columns_outside_a_conv() -> None:
    """Any kernel whose reductions are per element and vectorise along the last axis takes the
    schedule (a MatMul forced off its tiles); a reduction the last axis does not key runs once
    per row, before the vector loop (one loop over its 3 elements, not one inside every step
    of the product's sum that reads it); a kernel that keeps its group (a softmax) is refused
    it by name."""
    require("neon")
    rng = np.random.default_rng(5)
    a, b, s = kg.tensor("a", (5, 7)), kg.tensor("b", (7, 13)), kg.tensor("s", (5, 3))
    row_max = kg.ops.reduce_op("ReduceMax", s, [1], 1)
    centred = kg.sub(a, row_max)
    ops = [row_max, centred, kg.matmul(centred, b)]
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (a, b, s)}
    fused = kg.fuse(*ops, force=True)
    kernel = fused.emit("neon", tuning="none", schedule="columns")
    assert kernel.metadata["schedule"] == "columns"
    assert kernel.source.count(" < 3; ++") == 1
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    assert_close(kernel(*(feeds[v.name] for v in fused.inputs)), want, scale=10)
    softmax = kg.fuse(kg.softmax(kg.tensor("x", (4, 16)), 1))
    with pytest.raises(ValueError, match="'fused_softmax' cannot run schedule 'columns'"):
        softmax.emit("neon", tuning="none", schedule="columns")
    with pytest.raises(ValueError, match="NEON schedule must be one of"):
        softmax.emit("neon", tuning="none", schedule="window")


# stride-2 windows: (x shape, kernel, pads, group (0: a max pool)); the last two read one element
# past their last lane at the very end of the input (the deinterleaving load must not)
STRIDED = {
    "depthwise-3x3-s2-pad": ((1, 4, 9, 20), 3, [1, 1, 1, 1], 4),
    "depthwise-3x3-s2-odd": ((2, 3, 11, 23), 3, [0, 1, 1, 0], 3),
    "maxpool-3x3-s2-pad": ((1, 5, 12, 33), 3, [1, 1, 1, 1], 0),
    "depthwise-buffer-end": ((1, 1, 3, 17), 3, [0, 0, 0, 0], 1),
    "maxpool-buffer-end": ((1, 2, 3, 17), 3, [0, 0, 0, 0], 0),
}


@pytest.mark.parametrize("name", STRIDED)
def test_stride_two_windows_deinterleave(name: str) -> None:
    """A stride-2 window reads every second column: one deinterleaving vld2q_f32 where all
    it reads (one element past its last lane) lies in the buffer, else lane by lane."""
    require("neon")
    shape, k, pads, group = STRIDED[name]
    rng = np.random.default_rng(len(name))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    x = kg.tensor("x", shape)
    if group:
        feeds["w"] = rng.standard_normal((shape[1], 1, k, k)).astype(np.float32)
        ops = [kg.conv(x, kg.constant("w", feeds["w"]), pads=pads, group=group,
                       strides=[2, 2])]
    else:
        ops = [kg.max_pool(x, [k, k], pads=pads, strides=[2, 2])]
    fused = kg.fuse(*ops)
    kernel = fused.emit("neon", tuning="none")
    assert kernel.metadata["schedule"] == "columns"
    assert "vld2q_f32(" in kernel.source
    _check(kernel, ops, feeds)
    _check(fused.emit("neon", tuning="none", schedule="row"), ops, feeds)


def test_stride_three_keeps_the_row_schedule() -> None:
    """A stride-3 window has no deinterleaving load."""
    require("neon")
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((1, 4, 9, 40)).astype(np.float32),
             "w": rng.standard_normal((4, 1, 3, 3)).astype(np.float32)}
    ops = [kg.conv(kg.tensor("x", (1, 4, 9, 40)), kg.constant("w", feeds["w"]),
                   pads=[1, 1, 1, 1], group=4, strides=[3, 3])]
    fused = kg.fuse(*ops)
    assert columns_plan(fused.lower()) is None
    kernel = fused.emit("neon", tuning="none", algorithm="direct")
    assert kernel.metadata["schedule"] == "row"
    _check(kernel, ops, feeds)


def test_tuner_chooses_between_columns_and_row(tmp_path) -> None:
    require("neon")
    ops, _ = _block("3x3-37-wide", "residual")
    loop = kg.fuse(*ops).lower()
    space = backends.get("neon").search_space(loop)
    assert [c.as_options() for c in space] == [{}, {"schedule": "row"}]
    result = tune(loop, "neon", db=FastRunDB(tmp_path / "db"), repeat=2,
                  budget_s=math.inf)  # every status checked: no time budget
    assert all(c.status == "ok" for c in result.candidates)
    assert result.best in space


def test_step_two_slice_deinterleaves() -> None:
    """An elementwise kernel reading every second element (a step-2 slice of the last axis)
    uses the deinterleaving load too; its last vectors reach the input's end (37 columns)."""
    require("neon")
    rng = np.random.default_rng(9)
    feeds = {"x": rng.standard_normal((3, 37)).astype(np.float32),
             "b": rng.standard_normal((19,)).astype(np.float32)}
    sliced = kg.slice(kg.tensor("x", (3, 37)), [0], [37], [1], [2])
    ops = [sliced, kg.add(sliced, kg.tensor("b", (19,)))]
    kernel = kg.fuse(*ops).emit("neon", tuning="none")
    assert "vld2q_f32(" in kernel.source
    _check(kernel, ops, feeds)


def test_small_maps_with_long_windows_run_threaded() -> None:
    """Few output elements but many operations (a depthwise 3x3/2 conv of ReLU6 to 576x7x7:
    28224 elements, 9 taps each) run on OpenMP threads; as few elements of an elementwise
    kernel stay on one; both equal the reference."""
    require("neon")
    rng = np.random.default_rng(11)
    x = kg.tensor("x", (1, 576, 14, 14))
    w = (rng.standard_normal((576, 1, 3, 3)) / 3).astype(np.float32)
    six = kg.clip(x, 0.0, 6.0)
    conv = kg.conv(six, kg.constant("w", w), pads=[1, 1, 1, 1], strides=[2, 2], group=576)
    feeds = {"x": 4 * rng.standard_normal((1, 576, 14, 14)).astype(np.float32)}
    kernel = kg.fuse(six, conv).emit("neon", tuning="none", algorithm="direct")
    assert kernel.metadata["schedule"] == "row" and "#pragma omp parallel" in kernel.source
    assert_close(kernel(feeds["x"], w), evaluate_chain([six, conv], {**feeds, "w": w})[conv.name])
    y = kg.tensor("y", (576, 49))
    relu = kg.relu(y)
    small = kg.fuse(relu).emit("neon", tuning="none")
    assert "#pragma omp parallel" not in small.source
    ys = rng.standard_normal((576, 49)).astype(np.float32)
    assert_close(small(ys), np.maximum(ys, 0))
