"""Attention's head splits next to its contractions. A projection whose output is split into
heads and transposed, ``(s, h*d) -> (h, s, d)`` (Q, V): the remap keeps the innermost axis's
runs (``keeps_runs``), so the fusion table takes the Many-to-Many -> Shuffle edge as green
(``run_rule``) and OpenCL's tiled epilogue stores each vector of ``d`` contiguously at its
head's place (``flatten_offset_aligned``) instead of lane by lane. The scores read
``transpose(q)`` and ``transpose(k)`` along the head dimension they reduce
(``reads_runs_along_reduction``): green too. Every shape against NumPy, with partial row
tiles (13, 2 and 1 rows) and a shifted last column tile (80 columns)."""
from __future__ import annotations

import numpy as np
import pytest
import sympy
from conftest import assert_close, require, run

import kernelgen as kg
from kernelgen import backends
from kernelgen.mapping_types import Colour, IndexMap, keeps_runs, out_symbols
from kernelgen.mapping_types.classify import reads_runs_along_reduction

rng = np.random.default_rng(7)


def _projection(seq: int, hidden: int, heads: int, perm: tuple[int, ...] = (0, 2, 1, 3)
                ) -> tuple[kg.FusedOp, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``transpose(reshape(x @ w + b, (1, seq, heads, hidden / heads)), perm)`` fused, its
    inputs x, w, b and NumPy's result."""
    w = rng.standard_normal((hidden, hidden)).astype(np.float32)
    x = rng.standard_normal((1, seq, hidden)).astype(np.float32)
    b = rng.standard_normal(hidden).astype(np.float32)
    mm = kg.matmul(kg.tensor("x", x.shape), kg.tensor("w", w.shape))
    biased = kg.add(mm, kg.tensor("b", b.shape))
    split = kg.reshape(biased, (1, seq, heads, hidden // heads))
    moved = kg.transpose(split, list(perm))
    want = (x.astype(np.float64) @ w + b).reshape(1, seq, heads, hidden // heads)
    return kg.fuse(mm, biased, split, moved), x, w, b, want.transpose(perm)


def _map(perm: tuple[int, ...], shape: tuple[int, ...]) -> IndexMap:
    """A transpose's index map: output axis k reads input axis ``perm[k]``."""
    o = out_symbols(len(shape))
    inverse = [perm.index(axis) for axis in range(len(shape))]
    return IndexMap(tuple(shape[p] for p in perm), shape, tuple(o[k] for k in inverse))


def test_which_remaps_keep_runs() -> None:
    """The innermost axis kept at stride 1 with an extent a multiple of 16: a head split's
    transpose keeps runs; moving the innermost axis (attention's Kᵀ), runs of 28 (a 28x28
    map) and a reshape that merges the innermost axis do not."""
    assert keeps_runs(_map((0, 2, 1, 3), (1, 128, 4, 64)))
    assert keeps_runs(_map((1, 0, 2), (7, 3, 32)))
    assert not keeps_runs(_map((0, 2, 3, 1), (1, 128, 4, 64)))
    assert not keeps_runs(_map((0, 2, 1, 3, 4), (1, 2, 3, 28, 28)))
    o0, o1 = out_symbols(2)
    merge = IndexMap((3, 64), (3, 4, 16), (o0, o1 // 16, o1 % 16))
    assert not keeps_runs(merge)


def test_a_head_split_fuses_green_and_kt_stays_yellow() -> None:
    """Q's and V's layout ``(h, s, d)`` joins the projection as its epilogue without being
    measured; Kᵀ's ``(h, d, s)`` moves the innermost axis, so its cell stays yellow."""
    q, *_ = _projection(5, 64, 4)
    edge = next(e for e in q.edges if e.consumer.startswith("transpose"))
    assert edge.rule.colour is Colour.GREEN and "whole runs" in edge.rule.reason
    kt, *_ = _projection(5, 64, 4, perm=(0, 2, 3, 1))
    edge = next(e for e in kt.edges if e.consumer.startswith("transpose"))
    assert edge.rule.colour is Colour.YELLOW


def _scores(seq: int, heads: int, depth: int, v_too: bool = False
            ) -> tuple[kg.FusedOp, list[np.ndarray], np.ndarray]:
    """``transpose(q) · transpose(k)`` from ``(1, seq, heads, depth)`` projections (then
    ``· transpose(v)`` with ``v_too``), fused, with its inputs and NumPy's result."""
    arrays = [rng.standard_normal((1, seq, heads, depth)).astype(np.float32)
              for _ in range(3 if v_too else 2)]
    ts = [kg.tensor(n, a.shape) for n, a in zip("qkv", arrays)]
    qh, kt = kg.transpose(ts[0], [0, 2, 1, 3]), kg.transpose(ts[1], [0, 2, 3, 1])
    ops = [qh, kt, kg.matmul(qh, kt)]
    want = arrays[0].transpose(0, 2, 1, 3).astype(np.float64) @ arrays[1].transpose(0, 2, 3, 1)
    if v_too:
        vh = kg.transpose(ts[2], [0, 2, 1, 3])
        ops += [vh, kg.matmul(ops[-1], vh)]
        want = want @ arrays[2].transpose(0, 2, 1, 3)
    return kg.fuse(*ops, force=v_too), arrays, want


def test_which_reductions_read_runs() -> None:
    """The scores reduce ``transpose(q)`` and ``transpose(k)`` along d, their stride-1 axis:
    green, fused into the product as its operands. P·V reduces ``transpose(v)`` along the
    sequence, 256 floats apart: yellow."""
    block, _, _ = _scores(8, 4, 64)
    assert [e.rule.colour for e in block.edges] == [Colour.GREEN, Colour.GREEN]
    assert all("along its reduction" in e.rule.reason for e in block.edges)
    block, _, _ = _scores(8, 4, 64, v_too=True)
    edge = next(e for e in block.edges if e.producer == block.ops[3].name)
    assert edge.rule.colour is Colour.YELLOW
    o0, o1 = out_symbols(2)
    r = sympy.Symbol("r0", integer=True)
    assert reads_runs_along_reduction(IndexMap((3, 5), (5, 32), (o1, r), reduce=((r, 32),)))
    assert not reads_runs_along_reduction(IndexMap((3, 5), (32, 5), (r, o1), reduce=((r, 32),)))
    assert not reads_runs_along_reduction(IndexMap((3, 5), (5, 28), (o1, r), reduce=((r, 28),)))


@pytest.mark.parametrize("seq,heads,depth", [(13, 3, 16), (1, 2, 64), (37, 4, 32)])
def test_scores_through_both_transposes_on_every_backend(backend: str, seq: int, heads: int,
                                                         depth: int) -> None:
    block, arrays, want = _scores(seq, heads, depth)
    (got,) = run(backend, block, *arrays)
    assert_close(got, want, np.float32, scale=depth)


@pytest.mark.parametrize("seq,hidden,heads", [(13, 256, 4), (2, 128, 4), (7, 80, 5)])
def test_opencl_stores_each_head_in_vectors(seq: int, hidden: int, heads: int) -> None:
    """The tiled epilogue stores vectors at ``64 s + 8192 (c >> 6) + (c & 63)``-style offsets
    (it had stored lane by lane), the shifted last column tile of 80 columns included."""
    require("opencl")
    if not backends.get("opencl").caps.vector_widths:
        pytest.skip("the OpenCL device builds no float vectors (scalar template)")
    block, x, w, b, want = _projection(seq, hidden, heads)
    kernel = block.emit_kernel("opencl", tuning="none")
    assert kernel.metadata["schedule"] == "tiled"
    assert "kg_sums" not in kernel.source and "vstore" in kernel.source
    assert_close(kernel(x, w, b), want, np.float32, scale=hidden)


@pytest.mark.parametrize("seq,hidden,heads,perm", [
    (13, 80, 5, (0, 2, 1, 3)),  # d = 16: vectors on OpenCL
    (1, 64, 4, (0, 2, 1, 3)),   # one row: OpenCL's 'window' schedule
    (11, 36, 3, (0, 2, 1, 3)),  # d = 12: no multiple of a vector, lane by lane
    (9, 64, 4, (0, 2, 3, 1)),   # Kᵀ: the innermost axis moved
])
def test_head_split_projections_on_every_backend(backend: str, seq: int, hidden: int,
                                                 heads: int, perm: tuple[int, ...]) -> None:
    block, x, w, b, want = _projection(seq, hidden, heads, perm)
    (got,) = run(backend, block, x, w, b)
    assert_close(got, want, np.float32, scale=hidden)
