"""OpenCL's 'window' schedule (a depthwise or grouped conv's default): each work-item owns a few
output rows and the whole row as float16/8/4 vectors, reads each input row once for all of them,
tests a padded row once, and moves a vector read a lane over at the row's ends. Against ONNX's
reference on awkward shapes: rows no multiple of the vector width, rows shorter than a vector,
prime heights, batch > 1, dilation, stride 2, asymmetric pads wide enough that whole vectors
read only padding, a channel multiplier, with a prologue in the reads and epilogues (a residual
input, a per-channel scale) in the stores; every valid rows-per-item choice; and bad options
refused."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, require, require_vectors_of
from reference import evaluate_chain

from kernelgen import backends
from kernelgen.tune import tune
import kernelgen as kg
from kernelgen.fastrun import FastRunDB
from kernelgen.backends.opencl import window
from kernelgen.backends.opencl.window import opencl_window
from kernelgen.ir.expr import extent

BLOCKS = {  # name: (x shape, w shape, conv attributes)
    "3x3-37-wide": ((2, 6, 9, 37), (6, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 6}),
    "3x3-16-wide-prime-height": ((1, 4, 13, 16), (4, 1, 3, 3), {"pads": [1, 1, 1, 1],
                                                                 "group": 4}),
    "3x3-7-wide": ((1, 3, 7, 7), (3, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 3}),
    "5x5-dilated-asym": ((1, 3, 8, 41), (3, 1, 5, 5),
                         {"pads": [4, 3, 4, 5], "dilations": [2, 2], "group": 3}),
    "pads-wider-than-a-vector": ((1, 2, 4, 5), (2, 1, 3, 3), {"pads": [1, 17, 1, 0],
                                                               "group": 2}),
    "narrow-row-wide-pads": ((1, 2, 6, 3), (2, 1, 3, 3), {"pads": [2, 2, 2, 2], "group": 2}),
    "channel-multiplier": ((1, 6, 5, 19), (12, 2, 3, 3), {"pads": [0, 2, 1, 1], "group": 3}),
    "7x7": ((1, 2, 11, 23), (2, 1, 7, 7), {"pads": [3, 3, 3, 3], "group": 2}),
    # stride 2 (MobileNet's downsampling): every second input column, deinterleaved
    "3x3-stride2-31-wide": ((1, 5, 15, 31), (5, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 5,
                                                            "strides": [2, 2]}),
    "3x3-stride2-asym": ((2, 3, 14, 28), (3, 1, 3, 3), {"pads": [0, 1, 1, 0], "group": 3,
                                                         "strides": [2, 2]}),
    "5x5-stride2-45-wide": ((1, 4, 11, 45), (4, 1, 5, 5), {"pads": [2, 2, 2, 2], "group": 4,
                                                            "strides": [2, 2]}),
    # the last vector's read ends at the input's last float (4 lanes: 8 columns)
    "3x3-stride2-buffer-end": ((1, 2, 3, 17), (2, 1, 3, 3), {"group": 2, "strides": [2, 2]}),
    # grouped convs with at least WINDOW_LOOP_MIN input channels a group: a loop over them
    # (the 1x1 with fewer than SPLIT_MIN_CHANNELS outputs a group; with more, the lowering
    # splits the groups and the 'tiled' schedule takes it: test_nn, Conv-groups-1x1)
    "grouped-1x1-17-channels": ((1, 34, 5, 19), (14, 17, 1, 1), {"group": 2}),
    "grouped-3x3-16-channels": ((1, 32, 6, 13), (32, 16, 3, 3), {"pads": [1, 1, 1, 1],
                                                                 "group": 2}),
}
LOOPED = {"grouped-1x1-17-channels": 17, "grouped-3x3-16-channels": 16}
STRIDED = [name for name in BLOCKS if "stride2" in name]


def _block(name: str, epilogue: str):
    """relu -> depthwise conv -> an epilogue: sigmoid, a residual add, or a per-channel
    scale and shift (BatchNormalization folded by hand)."""
    x_shape, w_shape, attrs = BLOCKS[name]
    rng = np.random.default_rng(sum(x_shape) + len(epilogue))
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "w": (rng.standard_normal(w_shape) / 3).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", x_shape))
    conv = kg.conv(pre, kg.constant("w", feeds["w"]), **attrs)
    ops = [pre, conv]
    if epilogue == "sigmoid":
        ops.append(kg.sigmoid(conv))
    elif epilogue == "residual":
        feeds["r"] = rng.standard_normal(conv.shape).astype(np.float32)
        ops.append(kg.add(conv, kg.tensor("r", conv.shape)))
    else:
        for name in ("scale", "shift"):
            feeds[name] = rng.standard_normal((1, conv.shape[1], 1, 1)).astype(np.float32)
        scaled = kg.mul(conv, kg.constant("scale", feeds["scale"]))
        ops += [scaled, kg.add(scaled, kg.constant("shift", feeds["shift"]))]
    return ops, feeds


def _check(kernel: kg.Kernel, ops, feeds) -> None:
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    args = [feeds[a["name"]] for a in kernel.metadata["args"] if a["role"] == "input"]
    assert_close(kernel(*args), want, scale=4)


@pytest.mark.parametrize("epilogue", ["sigmoid", "residual", "scale"])
@pytest.mark.parametrize("name", BLOCKS)
def test_window_is_the_default_and_matches_onnx(name: str, epilogue: str) -> None:
    require("opencl")
    ops, feeds = _block(name, epilogue)
    kernel = kg.fuse(*ops).emit("opencl", tuning="none", algorithm="direct")
    assert kernel.metadata["schedule"] == "window"
    source = kernel.source
    # a padded row is tested once for all its vectors: the range test and one test per padded
    # input row, unless no vector read inside the row covers an edge vector's lanes (a row
    # shorter than two vectors, padding wider than the rest of the row): then the generic
    # guarded load with its lane-by-lane fallback. A stride-2 read (twice its lanes, then
    # the even ones: one vload's .even up to 2 lanes, a kg_vload_even helper past them) tests
    # that it ends inside the buffer where it reads past its last lane's float (the .even).
    if "an edge" not in source:
        assert source.count("if (") <= 1 + sum(BLOCKS[name][2].get("pads", [0] * 4)[::2])
    else:
        assert name in ("narrow-row-wide-pads", "pads-wider-than-a-vector", *STRIDED)
    assert (".even" in source or "kg_vload_even" in source) == (name in STRIDED)
    # the widest vectors the device builds of which two fit in a row (16 columns: two float8);
    # an unpadded 1x1 conv's run is its whole plane
    width = ops[-1].shape[-1] * (ops[-1].shape[-2] if BLOCKS[name][1][2:] == (1, 1) else 1)
    widths = [w for w in backends.get("opencl").caps.vector_widths if w >= 4] or [4]
    lanes = next((w for w in widths if 2 * w <= width), widths[-1])
    assert f"float{lanes} kg_acc0_0" in source
    _check(kernel, ops, feeds)


def _out_height(name: str) -> int:
    x_shape, w_shape, attrs = BLOCKS[name]
    span = (w_shape[2] - 1) * attrs.get("dilations", [1, 1])[0] + 1
    return (x_shape[2] + sum(attrs.get("pads", [0] * 4)[::2]) - span) // \
        attrs.get("strides", [1, 1])[0] + 1


@pytest.mark.parametrize("name", ["3x3-37-wide", "3x3-16-wide-prime-height", "7x7",
                                  "3x3-stride2-31-wide", "3x3-stride2-asym",
                                  "channel-multiplier", "grouped-3x3-16-channels"])
def test_every_rows_choice_and_group_size(name: str) -> None:
    require("opencl")
    ops, feeds = _block(name, "sigmoid")
    fused = kg.fuse(*ops)
    plan = opencl_window(fused.lower(), backends.get("opencl").caps.vector_widths)
    assert plan is not None
    height = _out_height(name)
    choices = plan.row_choices
    # divisors of the height up to 8 whose straight-line code stays within the budget
    per_row = extent(plan.contraction.reduce) * len(plan.starts)
    assert choices == tuple(r for r in range(1, min(height, 8) + 1)
                            if height % r == 0 and r * per_row <= window.WINDOW_MAX_FMAS)
    for rows in choices:
        for local in (1, 8, 64):
            kernel = fused.emit("opencl", tuning="none", algorithm="direct", window_rows=rows,
                                local_size=local)
            assert kernel.metadata["tunables"]["window_rows"] == rows
            if "an edge" not in kernel.source:  # each padded input row tested once
                pads = BLOCKS[name][2].get("pads", [0] * 4)
                assert kernel.source.count("if (") <= 1 + pads[0] + pads[2]
            _check(kernel, ops, feeds)


@pytest.mark.parametrize("name", [*LOOPED, "3x3-37-wide", "channel-multiplier", "7x7"])
def test_long_channel_groups_run_as_a_loop(name: str) -> None:
    """A grouped conv's input channels (no two read one vector) run as a loop around the
    unrolled taps once a group has ``WINDOW_LOOP_MIN`` of them; unrolled whole, ShuffleNet's
    136 took PoCL over a minute to compile. A depthwise window's taps, which padding tests and
    rows share, stay unrolled."""
    require("opencl")
    ops, feeds = _block(name, "residual")
    fused = kg.fuse(*ops)
    plan = opencl_window(fused.lower(), backends.get("opencl").caps.vector_widths)
    assert plan is not None
    assert (plan.loop[1] if plan.loop else None) == LOOPED.get(name)
    kernel = fused.emit("opencl", tuning="none", algorithm="direct")
    assert kernel.metadata["schedule"] == "window"
    loop = f"< {LOOPED[name]}; ++" if name in LOOPED else None
    assert (loop in kernel.source) if loop else "for (" not in kernel.source
    _check(kernel, ops, feeds)


@pytest.mark.parametrize("stride", [1, 2])
def test_default_rows_follow_the_read_budget(stride: int) -> None:
    """A work-item owns the most rows whose distinct input vectors fit ``WINDOW_MAX_READS``
    (never fewer than the largest divisor up to ``WINDOW_ROWS``): a 3x3 conv's R output rows
    read (R - 1) * stride + 3 input rows, each as 3 shifted vectors per vector of the row."""
    require("opencl")
    caps = backends.get("opencl").caps
    widths = caps.vector_widths
    for channels, out_hw in ((576, 7), (144, 28), (32, 56)):
        hw = out_hw * stride
        x = kg.tensor("x", (1, channels, hw, hw))
        conv = kg.conv(kg.relu(x), kg.tensor("w", (channels, 1, 3, 3)), pads=[1, 1, 1, 1],
                       strides=[stride, stride], group=channels)
        loop = kg.fuse(conv.inputs[0], conv).lower()
        plan = opencl_window(loop, widths)
        assert plan is not None
        reads = {r: len(plan.starts) * window.distinct_reads(loop, plan.contraction,
                                                             plan.columns, plan.block, r)
                 for r in plan.row_choices}
        for r, n in reads.items():
            assert n == ((r - 1) * stride + 3) * 3 * len(plan.starts)
        least = max(r for r in plan.row_choices if r <= window.WINDOW_ROWS)
        fitting = [r for r, n in reads.items() if n <= window.WINDOW_MAX_READS]
        assert plan.read_budget_rows == max([least, *fitting])
        kernel = kg.fuse(conv.inputs[0], conv).emit("opencl", tuning="none",
                                                    algorithm="direct")
        assert kernel.metadata["tunables"]["window_rows"] == plan.default_rows(caps)
        # on a CPU the budget's rows, but at stride 2 with 16 registers (AVX2) the budget in
        # register-wide pieces (test_stride2_rows_count_register_pieces_on_avx2); a GPU wants
        # the work-items: one row each
        assert plan.default_rows(backends.get("opencl").for_device("desktop-gpu").caps) == 1
        assert plan.default_rows(backends.get("opencl").for_device("cpu-avx512").caps) == \
            plan.read_budget_rows
        assert plan.stride == stride
        if stride == 1:
            assert plan.default_rows(backends.get("opencl").for_device("cpu-avx2").caps) == \
                plan.read_budget_rows
        if out_hw == 7:  # MobileNetV2's last stages: a work-item owns a whole channel
            assert plan.read_budget_rows == 7


@pytest.mark.parametrize("side,avx2_rows,avx512_rows", [(112, 1, 4), (56, 1, 4), (28, 2, 2),
                                                        (14, 7, 7)])
def test_stride2_rows_count_register_pieces_on_avx2(side: int, avx2_rows: int,
                                                    avx512_rows: int) -> None:
    """At stride 2 on a CPU with 16 registers (AVX2) a work-item owns the most rows whose
    reads, each counted in register-wide pieces, fit the budget of 108, else one: a 112-wide
    map writes rows of four float16 vectors, each read spanning 32 lanes (four registers),
    so one row (AVX-512: the floor of four); 56 wide four float8 (two registers a read), one
    row; 28 wide four float4, two rows on both; 14 wide (two float4 over 7 columns) all 7
    rows. MobileNetV2's 96x112x112 ran 0.68 ms with one row against 1.39 with four on an AMD
    EPYC (bench/window_rows.py). The AVX2 kernel runs on the test device against ONNX's
    reference."""
    require("opencl")
    rng = np.random.default_rng(side)
    feeds = {"x": rng.standard_normal((1, 3, side, side)).astype(np.float32),
             "w": (rng.standard_normal((3, 1, 3, 3)) / 3).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", (1, 3, side, side)))
    conv = kg.conv(pre, kg.constant("w", feeds["w"]), pads=[1, 1, 1, 1], strides=[2, 2],
                   group=3)
    fused = kg.fuse(pre, conv)
    kernels = {device: fused.emit(backends.get("opencl").for_device(device), tuning="none",
                                  algorithm="direct") for device in ("cpu-avx2", "cpu-avx512")}
    for device, rows in (("cpu-avx2", avx2_rows), ("cpu-avx512", avx512_rows)):
        metadata = kernels[device].metadata
        assert (metadata["schedule"], metadata["tunables"]["window_rows"]) == ("window", rows)
    require_vectors_of(kernels["cpu-avx2"].source)
    _check(kernels["cpu-avx2"], [pre, conv], feeds)


def test_shapes_outside_the_window_fall_back() -> None:
    """A stride-3 conv reads no run as vectors and a row of 2 is shorter than any vector:
    both keep another schedule, and stay right."""
    require("opencl")
    rng = np.random.default_rng(3)
    for x_shape, attrs in (((1, 4, 9, 29), {"pads": [1, 1, 1, 1], "group": 4,
                                            "strides": [3, 3]}),
                           ((1, 4, 9, 2), {"pads": [1, 1, 1, 1], "group": 4})):
        feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
                 "w": rng.standard_normal((4, 1, 3, 3)).astype(np.float32)}
        ops = [kg.conv(kg.tensor("x", x_shape), kg.constant("w", feeds["w"]), **attrs)]
        kernel = kg.fuse(*ops).emit("opencl", tuning="none", algorithm="direct")
        assert kernel.metadata["schedule"] != "window"
        _check(kernel, ops, feeds)


def test_bad_window_options_are_refused() -> None:
    require("opencl")
    ops, _ = _block("3x3-37-wide", "sigmoid")  # 9 rows: 1, 3 or 9 (over 8)
    fused = kg.fuse(*ops)
    with pytest.raises(ValueError, match=r"fused_relu_conv_sigmoid.*window_rows must be one "
                                         r"of \(1, 3\).*got 2"):
        fused.emit("opencl", tuning="none", algorithm="direct", window_rows=2)
    with pytest.raises(ValueError, match="window_rows applies to the 'window' schedule"):
        fused.emit("opencl", tuning="none", algorithm="direct", schedule="tiled",
                   window_rows=3)
    matmul = kg.fuse(kg.matmul(kg.tensor("a", (5, 7)), kg.tensor("b", (7, 9))))
    with pytest.raises(ValueError, match="schedule 'window' needs"):
        matmul.emit("opencl", tuning="none", schedule="window")


def test_tuner_searches_window_rows(tmp_path) -> None:
    """The search space holds the default, other rows per item and the 'tiled' tiles; every
    candidate is checked, and the winner is one of them."""
    require("opencl")
    ops, _ = _block("3x3-16-wide-prime-height", "residual")  # 13 rows: 1 only
    loop = kg.fuse(*ops).lower()
    space = backends.get("opencl").search_space(loop)
    options = [c.as_options() for c in space]
    assert any(o.get("schedule") == "window" for o in options)
    assert any("tile" in o for o in options)
    result = tune(loop, "opencl", db=FastRunDB(tmp_path / "db"), repeat=2)
    assert all(c.status in ("ok", "skipped: budget") for c in result.candidates)
    assert result.best in space
    # a strided one: window rows only (its columns read no contiguous run for the tiles)
    strided, _ = _block("3x3-stride2-31-wide", "residual")
    options = [c.as_options() for c in backends.get("opencl").search_space(
        kg.fuse(*strided).lower())]
    assert any(o.get("schedule") == "window" for o in options)
    assert not any("tile" in o for o in options)


@pytest.mark.parametrize("batch,channels,side,stride", [(1, 12, 14, 2), (1, 20, 9, 1),
                                                        (2, 12, 7, 2)])
def test_a_depthwise_conv_reads_through_a_channel_shuffles_reshape(
        batch: int, channels: int, side: int, stride: int) -> None:
    """ShuffleNet's channel shuffle (Reshape to groups, Transpose, Reshape back) before a
    depthwise conv; the conv's block fuses the last Reshape: its reads index (c // 4, c % 4,
    h, w) of the transposed tensor (4 channels a group), which stays the 'window' schedule
    with no division in the index arithmetic (it had kept one by the whole plane times 4 at
    every tap, and run 'item' 5-9x slower). Against ONNX's reference on a prime side, batch
    2, both strides."""
    require("opencl")
    rng = np.random.default_rng(channels + side)
    # the shuffle's Transpose is a block of its own: this block reads its (batch, channels
    # / 4, 4, side, side) output and merges the two channel axes back
    x_shape = (batch, channels // 4, 4, side, side)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "w": (rng.standard_normal((channels, 1, 3, 3)) / 3).astype(np.float32)}
    back = kg.reshape(kg.tensor("x", x_shape), (batch, channels, side, side))
    conv = kg.conv(back, kg.constant("w", feeds["w"]), pads=[1, 1, 1, 1], group=channels,
                   strides=[stride, stride])
    ops = [back, conv]
    kernel = kg.fuse(back, conv).emit("opencl", tuning="none")
    assert kernel.metadata["schedule"] == "window"
    assert "KG_FLOORDIV" not in kernel.source.split("__kernel", 1)[1]
    want = evaluate_chain(ops, feeds)[conv.name]
    assert_close(kernel(feeds["x"]), want, scale=4)
