"""OpenCL contractions that pack the right operand into panels (``pack``), either by a first
launch (templates/opencl/pack_panels.cl.tmpl) or each column tile's item packing its own panel
before its row tiles (``pack_in_tile``; contraction_tile_pack.cl.tmpl), against NumPy, on
shapes that leave a
partial last row tile and a partial last column tile (both shifted to stay whole), with a
prologue on the packed operand, a transposed operand, broadcast batches and an epilogue; a
conv whose pack is its im2col, including a stride whose patches load lane by lane; the
launch metadata; an AGO block, whose producer a pack would materialise, refused; and
constant operands (weights) packed at the first launch only."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from conftest import assert_close, require
from reference import evaluate_chain

import kernelgen as kg

rng = np.random.default_rng(29)


def _f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("m,k,n,tile", [(1, 1, 16, (8, 32)), (7, 13, 37, (8, 32)),
                                         (53, 31, 67, (6, 64)), (97, 5, 130, (6, 64))])
def test_packed_matmul_with_prologue_and_epilogue(m: int, k: int, n: int,
                                                  tile: tuple[int, int]) -> None:
    """relu(b) packed, a bias row and a sigmoid after; packed and in place agree with NumPy."""
    require("opencl")
    a, b, bias = _f32(m, k), _f32(k, n), _f32(n)
    pre = kg.relu(kg.tensor("b", (k, n)))
    mm = kg.matmul(kg.tensor("a", (m, k)), pre)
    add = kg.add(mm, kg.constant("bias", bias))
    out = kg.sigmoid(add)
    fused = kg.fuse(pre, mm, add, out)
    want = 1 / (1 + np.exp(-(a.astype(np.float64) @ np.maximum(b, 0) + bias)))
    for pack, in_tile in ((True, False), (True, True), (False, None)):
        kernel = fused.emit_kernel("opencl", tuning="none", pack=pack, pack_in_tile=in_tile,
                                   tile=(tile[0], tile[1]))
        if kernel.metadata["schedule"] != "tiled":
            continue  # too narrow for the tiles (n < 4 columns)
        assert kernel.metadata["tunables"]["pack"] is pack
        assert kernel.metadata["tunables"].get("pack_in_tile") is in_tile
        assert ("pack" in kernel.metadata["launch"]) is (pack and not in_tile)
        assert_close(kernel(a, b, bias), want.astype(np.float32), scale=10)


def test_packed_batched_matmul_with_broadcast_batch_and_transposed_operand() -> None:
    """b[2, 1, 19, 23] transposed (a Transpose folded into the pack's loads), broadcast over a
    batch of 3: one panel set per batch point."""
    require("opencl")
    a, bt = _f32(2, 3, 11, 19), _f32(2, 1, 23, 19)
    mm = kg.matmul(kg.tensor("a", a.shape), kg.transpose(kg.tensor("bt", bt.shape),
                                                          [0, 1, 3, 2]))
    fused = kg.fuse(mm.inputs[1], mm)
    for in_tile in (False, True):
        kernel = fused.emit_kernel("opencl", tuning="none", pack=True, pack_in_tile=in_tile)
        assert kernel.metadata["tunables"]["pack_in_tile"] is in_tile
        assert_close(kernel(a, bt), (a.astype(np.float64) @ np.swapaxes(bt, 2, 3)
                                     ).astype(np.float32), scale=10)


@pytest.mark.parametrize("in_tile", [False, True])
@pytest.mark.parametrize("strides", [[1, 1], [3, 1], [2, 2]])
def test_conv_im2col_is_the_pack(strides: list[int], in_tile: bool) -> None:
    """A conv's patches (pads, batch 2, a ReLU prologue) packed by the first launch or by each
    column tile's item, with a stride between rows too. A stride along the row leaves the
    patches no contiguous run, so the tiles take the weights as their vector operand: im2col
    then runs as the patch matrix and a GEMM (two kernels)."""
    require("opencl")
    x, w = _f32(2, 5, 13, 11), _f32(7, 5, 3, 3)
    pre = kg.relu(kg.tensor("x", x.shape))
    conv = kg.conv(pre, kg.constant("w", w), pads=[1, 1, 1, 1], strides=strides)
    fused = kg.fuse(pre, conv)
    kernel = fused.emit("opencl", algorithm="im2col", tuning="none", pack_in_tile=in_tile)
    if strides[1] == 1:
        assert kernel.metadata["right_operand_reads"] == ["x"]
        assert kernel.metadata["tunables"]["pack_in_tile"] is in_tile
    else:
        assert len(kernel.kernels) == 2
    xp = np.pad(np.maximum(x, 0).astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    oh, ow = conv.shape[2:]
    want = np.zeros(conv.shape)
    for i in range(3):
        for j in range(3):
            patch = xp[:, :, i:i + strides[0] * oh:strides[0], j:j + strides[1] * ow:strides[1]]
            want += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j])
    assert_close(kernel(x, w), want.astype(np.float32), scale=20)


def test_pack_launch_metadata() -> None:
    """A host program learns the packing launch, its arguments and its scratch size; an
    in-tile pack needs only the scratch buffer."""
    require("opencl")
    m, k, n = 40, 9, 70
    fused = kg.fuse(kg.matmul(kg.tensor("a", (m, k)), kg.tensor("b", (k, n))))
    tiles_c = -(-n // 32)  # 3 column tiles of 32 (the last shifted left)
    for in_tile in (False, True):
        kernel = fused.emit_kernel("opencl", tuning="none", pack=True, pack_in_tile=in_tile,
                                   tile=(8, 32))
        launch = kernel.metadata["launch"]
        assert launch["scratch_bytes"] == 4 * tiles_c * k * 32
        assert launch["args"] == "the inputs, the outputs, then the scratch buffer"
        if in_tile:
            assert "pack" not in launch and launch["global_size"][0] >= tiles_c
            continue
        pack = launch["pack"]
        assert pack["kernel"] == f"{kernel.name}_pack"
        assert f"void {pack['kernel']}(" in kernel.source
        assert pack["global_size"][:2] == [k, tiles_c]


def test_pack_b_false_wins_over_pack_in_tile() -> None:
    """pack_in_tile says how a packed operand is packed; pack=False (the implicit GEMM
    over a tile stored as packed) reads it in place. pack_in_tile alone packs."""
    require("opencl")
    a, b = _f32(40, 9), _f32(9, 70)
    fused = kg.fuse(kg.matmul(kg.tensor("a", a.shape), kg.tensor("b", b.shape)))
    kernel = fused.emit_kernel("opencl", tuning="none", pack=False, pack_in_tile=True,
                               tile=(8, 32))
    assert kernel.metadata["tunables"]["pack"] is False
    assert "scratch_bytes" not in kernel.metadata["launch"]
    assert_close(kernel(a, b), (a.astype(np.float64) @ b).astype(np.float32), scale=4)
    alone = fused.emit_kernel("opencl", tuning="none", pack_in_tile=True, tile=(8, 32))
    assert alone.metadata["tunables"]["pack_in_tile"] is True
    assert_close(alone(a, b), (a.astype(np.float64) @ b).astype(np.float32), scale=4)


def test_ago_block_packs_its_producer_only_in_the_tile() -> None:
    """conv3x3 + ReLU -> 1x1: the producer, the vector operand, is packed only by each column
    tile's work-item, computed once into its panel; never by a packing kernel (which would
    write it whole, as the blocks apart do)."""
    require("opencl")
    x = kg.tensor("x", (1, 4, 6, 7))
    c1 = kg.conv(x, kg.constant("w1", _f32(5, 4, 3, 3)), pads=[1, 1, 1, 1])
    r = kg.relu(c1)
    c2 = kg.conv(r, kg.constant("w2", _f32(3, 5, 1, 1)))
    fused = kg.fuse(c1, r, c2, force=True)
    kernel = fused.emit_kernel("opencl", tuning="none", pack=True)
    assert kernel.metadata["tunables"]["pack_in_tile"]
    assert kernel.metadata["producer_redundancy"] == 1.0
    xs = _f32(1, 4, 6, 7)
    weights = {w.name: np.asarray(w.value) for w in (c1.inputs[1], c2.inputs[1])}
    want = evaluate_chain([c1, r, c2], {"x": xs, **weights})[c2.name]
    assert_close(kernel(xs), want, scale=float(np.abs(want).max()))
    with pytest.raises(ValueError, match="packed only by each column tile's work-item"):
        fused.emit_kernel("opencl", tuning="none", pack=True, pack_in_tile=False)


def _count_launches(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Every OpenCL launch from here on, counted by entry point."""
    import pyopencl as cl
    counts: collections.Counter[str] = collections.Counter()
    enqueue = cl.enqueue_nd_range_kernel

    def counted(queue: object, kernel: object, *args: object, **kwargs: object) -> object:
        counts[kernel.function_name] += 1  # type: ignore[attr-defined]
        return enqueue(queue, kernel, *args, **kwargs)
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", counted)
    return counts


@pytest.mark.parametrize("m,k,n", [(37, 301, 1031), (128, 256, 1024), (41, 1031, 263)])
def test_constant_weights_are_packed_once(monkeypatch: pytest.MonkeyPatch, m: int, k: int,
                                          n: int) -> None:
    """A MatMul by constant weights, packed, packs them in a first kernel at the first launch
    and reads the same panels at every later one: three calls on fresh inputs, one pack, each
    result NumPy's. Weights passed as an input are packed at every launch, and new values
    give new results."""
    require("opencl")
    w, bias = _f32(k, n) / np.float32(np.sqrt(k)), _f32(n)
    mm = kg.matmul(kg.tensor("x", (m, k)), kg.constant("w", w))
    add = kg.add(mm, kg.constant("bias", bias))
    kernel = kg.fuse(mm, add, kg.relu(add)).emit_kernel("opencl", tuning="none", pack=True)
    if kernel.metadata["schedule"] != "tiled":
        pytest.skip("the OpenCL device builds no float vectors (no packing template)")
    assert kernel.metadata["packed_once"] and not kernel.metadata["tunables"]["pack_in_tile"]
    pack = kernel.metadata["launch"]["pack"]
    assert pack["once"] and pack["reads_inputs"] == [1]
    counts = _count_launches(monkeypatch)
    for _ in range(3):
        x = _f32(m, k)
        assert_close(kernel(x), np.maximum(x.astype(np.float64) @ w + bias, 0), np.float32,
                     scale=4)
    assert counts[f"{kernel.name}_pack"] == 1 and counts[kernel.name] == 3

    mm = kg.matmul(kg.tensor("x", (m, k)), kg.tensor("w", (k, n)))
    variable = kg.fuse(mm).emit_kernel("opencl", tuning="none", pack=True)
    assert not variable.metadata["packed_once"]
    counts.clear()
    for _ in range(3):
        x, w = _f32(m, k), _f32(k, n)
        assert_close(variable(x, w), x.astype(np.float64) @ w, np.float32, scale=k)
    in_tile = variable.metadata["tunables"]["pack_in_tile"]
    assert counts[f"{variable.name}_pack"] == (0 if in_tile else 3)


@pytest.mark.parametrize("backend", ["opencl", "neon"])
@pytest.mark.parametrize("heads,seq,depth", [(1, 1, 1), (1, 5, 16), (2, 17, 13), (3, 41, 64)])
def test_nt_products_pack_their_gathered_operand_by_default(backend: str, heads: int, seq: int,
                                                            depth: int) -> None:
    """Q·Kᵀ with K's Transpose fused: K runs along the reduction, not along the output's
    columns, so the tiles would gather it a lane at a time; by default it is packed wherever
    two row tiles or more read it, and read in place where one does. Every form agrees with
    NumPy, with a scale epilogue (a single query and key runs no tiles at all)."""
    require(backend)
    q, k, scale = _f32(heads, seq, depth), _f32(heads, seq, depth), _f32(1)
    kt = kg.transpose(kg.tensor("k", k.shape), (0, 2, 1))
    mm = kg.matmul(kg.tensor("q", q.shape), kt)
    fused = kg.fuse(kt, mm, kg.mul(mm, kg.tensor("s", (1,))), force=True)
    kernel = fused.emit_kernel(backend, tuning="none")
    tunables = kernel.metadata["tunables"]
    if seq > 1 and tunables.get("vector_width"):  # the vector tiles (a device with vectors)
        assert tunables["pack"] is (seq > tunables["tile"][0]), tunables
    want = (q.astype(np.float64) @ k.transpose(0, 2, 1)) * scale
    assert_close(kernel(q, k, scale), want.astype(np.float32), scale=depth)


@pytest.mark.parametrize("m,k,n", [(1, 37, 19), (5, 64, 1000), (37, 301, 131)])
def test_gemm_trans_b_packs_constant_weights_once(m: int, k: int, n: int) -> None:
    """A Gemm with transB=1 by constant weights (a classifier's last layer) reads them along
    the reduction: packed once by default, even for one row of input, equal to NumPy."""
    require("opencl")
    w, bias = _f32(n, k), _f32(n)
    gemm = kg.gemm(kg.tensor("x", (m, k)), kg.constant("w", w), kg.constant("b", bias),
                   transB=1)
    kernel = kg.fuse(gemm).emit_kernel("opencl", tuning="none")
    if kernel.metadata["schedule"] != "tiled":
        pytest.skip("the OpenCL device builds no float vectors (no packing template)")
    assert kernel.metadata["tunables"]["pack"] and kernel.metadata["packed_once"]
    for _ in range(2):
        x = _f32(m, k)
        assert_close(kernel(x), (x.astype(np.float64) @ w.T + bias).astype(np.float32),
                     scale=k)
