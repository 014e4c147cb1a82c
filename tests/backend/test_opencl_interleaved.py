"""Interleaved vector stores (``backends/opencl/interleaved.py``): on a CPU, an elementwise
kernel whose output row walks ``f`` interleaved copies of its inputs' rows (Winograd's output
transform, nearest-neighbour upsampling, depth-to-space) computes each copy as a vector along
the row's outer part and interleaves them into vector stores. Against ONNX's reference on
awkward shapes (odd and prime sides, a row of one vector and one more point, a chunk shifted
back, rows past the end of an unrolled axis) with a prologue and an epilogue; where it does
not apply; a GPU, or an ``unroll`` asked for, keeps one point (or ``unroll``'s several) a
work-item."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, require, require_vectors_of
from reference import evaluate_chain

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl import interleaved
from kernelgen.backends.opencl.schedule import choose


def _cpu() -> bool:
    return backends.get("opencl").caps.simd_within_work_item


def _check(ops: list[kg.Op], feeds: dict[str, np.ndarray], factor: int,
           target: object = "opencl") -> kg.Kernel:
    fused = kg.fuse(*ops)
    kernel = fused.emit(target, tuning="none")
    require_vectors_of(kernel.source)
    args = [feeds[a["name"]] for a in kernel.metadata["args"] if a["role"] == "input"]
    assert_close(kernel(*args), evaluate_chain(ops, feeds)[ops[-1].name])
    assert kernel.metadata.get("interleaved_stores") == factor
    return kernel


# (x shape, block): rows of 2 x 7 (under two 8-lane vectors: 4 lanes), 2 x 17, 3 x 19, 2 x 32
D2S = [((1, 8, 3, 7), 2), ((2, 4, 5, 17), 2), ((1, 18, 2, 19), 3), ((1, 4, 3, 32), 2)]


@pytest.mark.parametrize("shape,block", D2S)
def test_depth_to_space_interleaves_its_planes(shape: tuple[int, ...], block: int) -> None:
    require("opencl")
    rng = np.random.default_rng(sum(shape))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", shape))
    d2s = kg.depth_to_space(pre, block)
    kernel = _check([pre, d2s, kg.sigmoid(d2s)], feeds, block if _cpu() else None)
    if _cpu():
        assert "kg_run" in kernel.source  # the lane-by-lane path of a shifted or short chunk


@pytest.mark.parametrize("c,hw", [(3, 5), (2, 11), (4, 16)])
def test_nearest_upsampling_with_concat(c: int, hw: int) -> None:
    """concat(resize_nearest(x, 2), skip): the upsampled half stores each input twice, the
    skip half is read in place; both in one kernel."""
    require("opencl")
    rng = np.random.default_rng(c * hw)
    feeds = {"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32),
             "s": rng.standard_normal((1, c, 2 * hw, 2 * hw)).astype(np.float32)}
    up = kg.resize(kg.tensor("x", (1, c, hw, hw)), scales=[1.0, 1.0, 2.0, 2.0], mode="nearest")
    _check([up, kg.concat([up, kg.tensor("s", (1, c, 2 * hw, 2 * hw))], axis=1)], feeds,
           2 if _cpu() else None)


@pytest.mark.parametrize("x_shape", [(1, 3, 11, 31), (2, 2, 9, 21), (1, 5, 12, 64)])
def test_winograd_output_transform_interleaves_tile_columns(x_shape: tuple[int, ...]) -> None:
    """A padded 3x3 conv + bias + ReLU through Winograd F(2x2): 16, 11 and 32 tiles a row
    (the last chunk shifted back, odd sides past the end)."""
    require("opencl")
    rng = np.random.default_rng(x_shape[-1])
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "w": (rng.standard_normal((6, x_shape[1], 3, 3)) / 3).astype(np.float32),
             "b": rng.standard_normal(6).astype(np.float32)}
    conv = kg.conv(kg.tensor("x", x_shape), kg.constant("w", feeds["w"]),
                   kg.constant("b", feeds["b"]), pads=[1, 1, 1, 1])
    ops = [conv, kg.relu(conv)]
    program = kg.fuse(*ops).emit("opencl", algorithm="winograd", tuning="none")
    assert_close(program(feeds["x"]), evaluate_chain(ops, feeds)[ops[-1].name], scale=10)
    assert program.kernels[-1].metadata.get("interleaved_stores") == (2 if _cpu() else None)


def test_where_it_does_not_apply() -> None:
    """Rows already contiguous (an add, a padded copy), a row of at most 4 tiles (one 4-lane
    vector would cover it: measured slower), a GPU, and an ``unroll`` asked for."""
    require("opencl")
    caps = backends.get("opencl").caps
    add = kg.fuse(kg.add(kg.tensor("a", (3, 37)), kg.tensor("b", (3, 37)))).lower()
    pad = kg.fuse(kg.pad(kg.tensor("x", (5, 13)), [0, 1, 0, 2])).lower()
    short = kg.fuse(kg.depth_to_space(kg.tensor("x", (1, 4, 3, 4)), 2)).lower()
    for loop in (add, pad, short):
        assert interleaved.plan(loop, caps) is None
    d2s = kg.fuse(kg.depth_to_space(kg.tensor("x", (1, 8, 3, 17)), 2))
    loop = d2s.lower()
    gpu = backends.get("opencl").for_device("desktop-gpu")
    assert not isinstance(choose(gpu.expand(loop), {}, gpu.caps).plan, interleaved.Interleaved)
    cpu = backends.get("opencl").for_device("cpu-avx512")
    assert isinstance(choose(cpu.expand(loop), {}, cpu.caps).plan, interleaved.Interleaved)
    given = d2s.emit("opencl", tuning="none", unroll=(1, 1, 2))
    assert "interleaved_stores" not in given.metadata


def test_the_interleave_option() -> None:
    """A kernel's tunables reproduce it (a saved model's schedules are chosen again from
    them); ``interleave=False`` keeps ``unroll``'s plan; asking for it where it does not apply,
    with another unroll, or on another schedule is refused, naming the kernel."""
    require("opencl")
    if not _cpu():
        pytest.skip("interleaved stores are chosen on a CPU device only; this one is a GPU")
    fused = kg.fuse(kg.depth_to_space(kg.tensor("x", (1, 8, 3, 17)), 2))
    kernel = fused.emit("opencl", tuning="none")
    tunables = kernel.metadata["tunables"]
    assert tunables["interleave"] is True
    assert fused.emit("opencl", tuning="none", **tunables).source == kernel.source
    off = fused.emit("opencl", tuning="none", interleave=False)
    assert "interleaved_stores" not in off.metadata and "kg_run" not in off.source
    add = kg.fuse(kg.add(kg.tensor("a", (3, 37)), kg.tensor("b", (3, 37))))
    with pytest.raises(ValueError, match="kernel 'fused_add': interleave needs"):
        add.emit("opencl", tuning="none", interleave=True)
    with pytest.raises(ValueError, match="split the axes by"):
        fused.emit("opencl", tuning="none", interleave=True, unroll=(1, 1, 1))
    softmax = kg.fuse(kg.softmax(kg.tensor("x", (4, 40)), axis=1))
    with pytest.raises(ValueError, match="interleave applies to the 'elementwise' schedule"):
        softmax.emit("opencl", tuning="none", interleave=True)
