"""OpenCL's vector loads through a padded window (guarded vector loads): depthwise and grouped
convolutions as row-less contractions, a group-1 conv as an implicit GEMM, and AGO's fused
producer as the vector operand, against ONNX's reference. Rows at least 16 wide make the kernels
take whole float16 vectors, so every load path runs: the interior (one vector load), an edge
inside the buffer (a vector load with the lanes outside the window zeroed) and an edge at the
buffer's start or end (lane by lane); where a run of columns wraps over the output rows
(``columns.vector_plan``'s ``wrap``), each vector inside the buffer masks its lanes."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_close, require
from reference import evaluate_chain

from kernelgen import backends
from kernelgen.backends import Config
from kernelgen.backends.opencl.columns import register_tiles
from kernelgen.tune import tune
import kernelgen as kg
from kernelgen.fastrun import FastRunDB

WINDOWS = {  # name: (x shape, w shape, conv attributes)
    "depthwise-3x3": ((2, 6, 9, 37), (6, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 6}),
    "depthwise-5x5-dilated-asym": ((1, 3, 8, 41), (3, 1, 5, 5),
                                   {"pads": [4, 3, 4, 5], "dilations": [2, 2], "group": 3}),
    "grouped-multiplier": ((1, 6, 5, 19), (12, 2, 3, 3), {"pads": [0, 2, 1, 1], "group": 3}),
    "dense-3x3": ((2, 5, 7, 23), (6, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
}


def _conv_block(x_shape, w_shape, attrs):
    """relu -> Conv -> sigmoid: a prologue inside the vector loads, an epilogue in the store."""
    rng = np.random.default_rng(sum(x_shape))
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "w": (rng.standard_normal(w_shape) / 3).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", x_shape))
    conv = kg.conv(pre, kg.constant("w", feeds["w"]), **attrs)
    return [pre, conv, kg.sigmoid(conv)], feeds


@pytest.mark.parametrize("tile_n", [None, 16, 48])
@pytest.mark.parametrize("name", WINDOWS)
def test_padded_windows_load_as_vectors(name: str, tile_n: int | None) -> None:
    """The 'tiled' schedule (a depthwise conv's default is 'window': test_opencl_window.py)."""
    require("opencl")
    ops, feeds = _conv_block(*WINDOWS[name])
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    options = {"schedule": "tiled"} if tile_n is None else \
        {"tile": (4, tile_n)}
    kernel = kg.fuse(*ops).emit("opencl", tuning="none", algorithm="implicit_gemm"
                                if name == "dense-3x3" else "direct", **options)
    assert kernel.metadata["schedule"] == "tiled"
    # a row's edge, or the map's where the run wraps over the output rows (masked lanes)
    assert f"vload{tile_width()}" in kernel.source and (
        "an edge" in kernel.source or "the map's edge" in kernel.source)
    if WINDOWS[name][2].get("group", 1) > 1:  # no rows: every output axis is batch or column
        assert kernel.metadata["tunables"]["tile"][0] == 1
    assert_close(kernel(feeds["x"], feeds["w"]), want)


def tile_width() -> int:
    """The widest float vector this device's register tiles use: 16 with AVX-512's registers,
    one register's lanes with 16 registers (8 on AVX2, 4 for pip's PoCL on CPUs its LLVM does
    not know)."""
    return register_tiles(backends.get("opencl").caps).widths[0]


def _ago_block(width: int):
    rng = np.random.default_rng(width)
    feeds = {"x": rng.standard_normal((1, 5, 6, width)).astype(np.float32),
             "w1": (rng.standard_normal((7, 5, 3, 3)) / 3).astype(np.float32),
             "w2": (rng.standard_normal((9, 7, 1, 1)) / 3).astype(np.float32)}
    c1 = kg.conv(kg.tensor("x", feeds["x"].shape), kg.tensor("w1", (7, 5, 3, 3)),
                 pads=[1, 1, 1, 1])
    r = kg.relu(c1)
    return [c1, r, kg.conv(r, kg.tensor("w2", (9, 7, 1, 1)))], feeds


def test_ago_producer_as_the_vector_operand() -> None:
    """The fused conv3x3 + ReLU is computed as vectors of pixels, each once (all 9 consumer
    rows in one tile), and feeds the 1x1 conv; narrower row tiles sweep a panel of it that
    each column tile computes once, or recompute it where told not to pack."""
    require("opencl")
    ops, feeds = _ago_block(29)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    fused = kg.fuse(*ops, force=True)
    kernel = fused.emit("opencl", tuning="none")
    assert "vacc" in kernel.source  # the producer's vector accumulator
    assert kernel.metadata["producer_redundancy"] == 1.0
    panel = fused.emit("opencl", tile=(4, 16))
    assert panel.metadata["producer_redundancy"] == 1.0
    assert panel.metadata["tunables"]["pack_in_tile"]
    narrow = fused.emit("opencl", tile=(4, 16), pack=False)
    assert narrow.metadata["producer_redundancy"] == 3.0  # ceil(9 rows / 4)
    for k in (kernel, panel, narrow):
        assert_close(k(feeds["x"], feeds["w1"], feeds["w2"]), want, scale=10)


def test_tuner_rejects_tilings_that_recompute_the_producer(tmp_path) -> None:
    require("opencl")
    ops, _ = _ago_block(17)
    loop = kg.fuse(*ops, force=True).lower()
    configs = [Config.of(), Config.of(tile=(4, 16), pack=False), Config.of(tile=(4, 16))]
    result = tune(loop, "opencl", configs=configs, db=FastRunDB(tmp_path / "db"),
                  repeat=2, budget_s=math.inf)  # every status checked: no time budget
    status = [c.status for c in result.candidates]
    assert status[0] == "ok" and status[2] == "ok"  # the narrow tiles over a panel
    assert status[1] == "rejected: computes the fused producer 3 times"
    assert result.best in (configs[0], configs[2])


def test_wide_indices_build_lane_masks_lane_by_lane() -> None:
    """Past 2**31 elements indices are long, and OpenCL C does not mix an int lane-number
    vector with long scalars: the padding's lane mask is then built lane by lane. Source and
    build only (the input alone would need 8 GiB)."""
    require("opencl")
    import pyopencl as cl

    from kernelgen.backends.opencl.runtime import device

    pre = kg.relu(kg.tensor("x", (1, 2, 32768, 32769)))  # padding as a Select: a lane mask
    conv = kg.conv(pre, kg.constant("w", np.ones((2, 1, 3, 3), np.float32)),
                   pads=[1, 1, 1, 1], group=2)
    kernel = kg.fuse(pre, conv).emit("opencl", tuning="none")
    assert kernel.metadata["tunables"]["index_type"] == "long"
    assert f"vload{tile_width()}" in kernel.source and "? -1 : 0;" in kernel.source
    cl.Program(device().context, kernel.source).build()
