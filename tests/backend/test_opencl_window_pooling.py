"""Pooling windows on OpenCL's 'window' schedule: a MaxPool (one max over the window, no
weights) runs as a row-less contraction whose taps are combined with the reduction's own
operator, each work-item owning a few output rows as vectors. Against ONNX's reference on
awkward shapes (prime and sub-vector widths, stride 1 and 2, asymmetric and wide pads,
ceil_mode, dilation, batch > 1) with a prologue in the reads and an epilogue in the stores, at
every rows-per-item choice; NaN and -Inf against the 'item' schedule (ONNX's reference drops
NaN in MaxPool); a GPU keeps 'item'; the tuner may choose 'item'. AveragePools are pooling
windows too: a sum divided by the count of valid taps, whose conditions on the column are
lane masks in the vector epilogue."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, require, require_vectors_of
from reference import evaluate_chain

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl.schedule import choose
from kernelgen.backends.opencl.window import POOL_MAX_TAPS, opencl_window

POOLS = {  # name: (x shape, MaxPool attributes)
    "3x3-s1-p1-28": ((1, 5, 28, 28), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "3x3-s1-p1-prime": ((2, 3, 13, 17), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "3x3-s2-111": ((1, 3, 23, 111), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "3x3-s2-p1-asym": ((1, 4, 14, 29), {"kernel_shape": [3, 3], "strides": [2, 2],
                                        "pads": [0, 1, 1, 0]}),
    "3x3-s2-ceil": ((1, 3, 9, 27), {"kernel_shape": [3, 3], "strides": [2, 2],
                                    "ceil_mode": 1}),
    "5x5-s1-p2": ((1, 2, 11, 31), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    "2x2-s2": ((1, 3, 10, 34), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "3x3-dilated": ((1, 2, 12, 37), {"kernel_shape": [3, 3], "dilations": [2, 2],
                                     "pads": [2, 2, 2, 2]}),
    "3x3-s1-7-wide": ((1, 6, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
}


def _block(name: str) -> tuple[list[kg.Op], dict[str, np.ndarray]]:
    """relu -> MaxPool -> + a residual input."""
    shape, attrs = POOLS[name]
    rng = np.random.default_rng(sum(shape))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", shape))
    pool = kg.max_pool(pre, **attrs)
    feeds["r"] = rng.standard_normal(pool.shape).astype(np.float32)
    return [pre, pool, kg.add(pool, kg.tensor("r", pool.shape))], feeds


def _run(kernel: kg.Kernel, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return kernel(*[feeds[a["name"]] for a in kernel.metadata["args"] if a["role"] == "input"])


@pytest.mark.parametrize("name", POOLS)
def test_maxpool_runs_as_a_window_at_every_rows_choice(name: str) -> None:
    require("opencl")
    caps = backends.get("opencl").caps
    ops, feeds = _block(name)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    fused = kg.fuse(*ops)
    plan = opencl_window(fused.lower(), caps.vector_widths)
    assert plan is not None
    kernel = fused.emit("opencl", tuning="none")
    assert kernel.metadata["schedule"] == ("window" if caps.simd_within_work_item else "item")
    assert_close(_run(kernel, feeds), want)
    for rows in plan.row_choices:
        for local in (1, 8):
            kernel = fused.emit("opencl", tuning="none", schedule="window", window_rows=rows,
                                local_size=local)
            assert "fma(" not in kernel.source  # taps combined by max, not multiplied
            assert_close(_run(kernel, feeds), want)


@pytest.mark.parametrize("width,shape,pads", [
    (4, (1, 3, 9, 19), [0, 0, 0, 0]), (8, (1, 3, 9, 47), [0, 0, 0, 0]),
    (16, (1, 3, 23, 111), [0, 0, 0, 0]),
    (16, (2, 3, 10, 64), [1, 1, 1, 1]),  # the first vector's lane 0 in the padding
    (8, (1, 2, 7, 35), [0, 2, 1, 1]),  # a vector starting two lanes into the padding
])
def test_a_stride2_window_reads_without_tests(width: int, shape: tuple[int, ...],
                                              pads: list[int]) -> None:
    """Every second float as a vector of 4 to 16 lanes reads no float past its last lane's, so
    an unpadded stride-2 window, whose last vector ends at the input's last float, loads each
    tap with no run-time test, and a padded one tests each padded input row once, its vectors
    over a padded column read from the first lane inside and moved over (the test and lane by
    lane fallback at each tap made the 3x3/2 max-pools of SqueezeNet 2-2.8x slower on PoCL,
    ResNet-50's padded one 1.9x)."""
    require("opencl")
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    ops = [kg.max_pool(kg.tensor("x", shape), kernel_shape=[3, 3], strides=[2, 2], pads=pads)]
    avx512 = backends.REGISTRY["opencl"].for_device("cpu-avx512")  # type: ignore[attr-defined]
    kernel = kg.fuse(*ops).emit_kernel(avx512, tuning="none")
    source = kernel.source
    assert kernel.metadata["schedule"] == "window"
    assert f"kg_vload_even{width}(" in source and "an edge" not in source
    if not any(pads):
        assert source.count("if (") == 1  # the work-item's range test alone
    require_vectors_of(source)
    assert_close(kernel(x), evaluate_chain(ops, {"x": x})[ops[-1].name])


@pytest.mark.parametrize("name", ["3x3-s1-p1-prime", "3x3-s2-111", "5x5-s1-p2"])
def test_nan_and_infinities_as_the_item_schedule(name: str) -> None:
    """A NaN in a window makes its maximum NaN; -Inf loses to any number, +Inf wins."""
    require("opencl")
    shape, attrs = POOLS[name]
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 0, 1, 2], x[0, -1, -1, -1], x[-1, 1, 3, 5] = np.nan, -np.inf, np.inf
    fused = kg.fuse(kg.max_pool(kg.tensor("x", shape), **attrs))
    window = fused.emit("opencl", tuning="none", schedule="window")(x)
    item = fused.emit("opencl", tuning="none", schedule="item")(x)
    assert np.isnan(window).sum() >= 1
    np.testing.assert_array_equal(window, item)  # NaN where item has NaN, else equal


def test_gpu_keeps_item_and_tuner_may_choose_it() -> None:
    require("opencl")
    ops, _ = _block("3x3-s1-p1-28")
    loop = kg.fuse(*ops).lower()
    opencl = backends.get("opencl")
    gpu = opencl.for_device("desktop-gpu")
    assert choose(gpu.expand(loop), {}, gpu.caps).kind == "item"
    cpu = opencl.for_device("cpu-avx512")
    assert choose(cpu.expand(loop), {}, cpu.caps).kind == "window"
    options = [c.as_options() for c in opencl.search_space(loop)]
    # 'item' beside the default window on a CPU; on a GPU the default is 'item' itself
    assert options[0] == {}
    assert ({"schedule": "item"} in options) == opencl.caps.simd_within_work_item
    assert any(o.get("schedule") == "window" for o in options)
    gpu_options = [c.as_options() for c in gpu.search_space(loop)]
    assert gpu_options[0] == {} and {"schedule": "item"} not in gpu_options
    assert any(o.get("schedule") == "window" for o in gpu_options)


AVERAGE_POOLS = {  # name: (x shape, AveragePool attributes, a pooling window)
    "2x2-s2-odd": ((1, 3, 11, 13), {"kernel_shape": [2, 2], "strides": [2, 2]}, True),
    "3x3-s1-p1-counted": ((2, 3, 7, 19), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                          "count_include_pad": 1}, True),
    "5x5-s1-prime": ((1, 5, 13, 23), {"kernel_shape": [5, 5]}, True),
    # padded windows count fewer taps at the borders: the count's column conditions are
    # lane masks, its row conditions constants of each row a work-item owns
    "3x3-s1-p1": ((1, 3, 11, 13), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, True),
    "3x3-s2-p1-shufflenet": ((2, 4, 14, 14), {"kernel_shape": [3, 3], "strides": [2, 2],
                                              "pads": [1, 1, 1, 1]}, True),
    "3x3-s2-p1-odd-wide": ((1, 3, 9, 45), {"kernel_shape": [3, 3], "strides": [2, 2],
                                           "pads": [1, 1, 1, 1]}, True),
    "3x2-asym-pads": ((1, 2, 8, 31), {"kernel_shape": [3, 2], "pads": [2, 0, 0, 1]}, True),
    "3x3-dilated-p2": ((1, 2, 12, 29), {"kernel_shape": [3, 3], "dilations": [2, 2],
                                        "pads": [2, 2, 2, 2]}, True),
    "3x3-s2-ceil": ((1, 3, 10, 28), {"kernel_shape": [3, 3], "strides": [2, 2],
                                    "ceil_mode": 1}, True),
    "3x3-s2-ceil-counted": ((1, 3, 10, 28), {"kernel_shape": [3, 3], "strides": [2, 2],
                                            "pads": [1, 1, 1, 1], "ceil_mode": 1,
                                            "count_include_pad": 1}, True),
    # more taps than nn.COUNT_UNROLLED_TAPS: the count is a second reduction, 'item'
    "17x19-p2-reduced": ((1, 2, 19, 23), {"kernel_shape": [17, 19], "pads": [2, 2, 2, 2]},
                         False),
}


@pytest.mark.parametrize("name", AVERAGE_POOLS)
def test_average_pool_is_a_window_with_its_count_as_lane_masks(name: str) -> None:
    """An AveragePool divides its window's sum by the count of taps the window counts: the
    kernel's size where every window counts all of them, else a product of per-axis sums of
    tap conditions on the output index (``nn._window_count``), whose conditions on the
    vector's column become lane masks. Both are pooling windows on a CPU, with a prologue in
    the reads and an epilogue in the stores, at every rows-per-item choice; a window too long
    to count tap by tap keeps a second reduction and the 'item' schedule."""
    require("opencl")
    caps = backends.get("opencl").caps
    shape, attrs, window = AVERAGE_POOLS[name]
    rng = np.random.default_rng(sum(shape))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", shape))
    pool = kg.average_pool(pre, **attrs)
    feeds["r"] = rng.standard_normal(pool.shape).astype(np.float32)
    ops = [pre, pool, kg.add(pool, kg.tensor("r", pool.shape))]
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    fused = kg.fuse(*ops)
    plan = opencl_window(fused.lower(), caps.vector_widths)
    assert (plan is not None) == window
    kernel = fused.emit("opencl", tuning="none")
    assert (kernel.metadata["schedule"] == "window") == (window and caps.simd_within_work_item)
    assert_close(_run(kernel, feeds), want)
    for rows in plan.row_choices if plan is not None else ():
        kernel = fused.emit("opencl", tuning="none", schedule="window", window_rows=rows)
        assert_close(_run(kernel, feeds), want)


def test_global_pool_keeps_its_schedule() -> None:
    """A global pool reads no run of output columns: not a pooling window."""
    require("opencl")
    widths = backends.get("opencl").caps.vector_widths
    x = kg.tensor("x", (1, 3, 11, 13))
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((1, 3, 11, 13)).astype(np.float32)}
    op = kg.global_pool("GlobalMaxPool", x)
    fused = kg.fuse(op)
    assert opencl_window(fused.lower(), widths) is None
    kernel = fused.emit("opencl", tuning="none")
    assert kernel.metadata["schedule"] != "window"
    assert_close(_run(kernel, feeds), evaluate_chain([op], feeds)[op.name])


def test_channel_reductions_long_and_short() -> None:
    """A max with no weights over channels is a window too while its taps stay within
    ``POOL_MAX_TAPS`` (a short straight-line reduction); over more channels it keeps a loop."""
    require("opencl")
    widths = backends.get("opencl").caps.vector_widths
    rng = np.random.default_rng(5)
    for channels, window_form in ((5, True), (POOL_MAX_TAPS + 1, False)):
        shape = (1, channels, 6, 19)
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        op = kg.reduce_max(kg.tensor("x", shape), [1], 1)
        fused = kg.fuse(op)
        assert (opencl_window(fused.lower(), widths) is not None) == window_form
        kernel = fused.emit("opencl", tuning="none")
        assert_close(_run(kernel, feeds), evaluate_chain([op], feeds)[op.name])
