"""OpenCL's elementwise schedule with several domain points per work-item (``emit/unroll.py``):
Winograd's transforms take the plans that share a tile's loads, every valid plan of awkward
kernels equals the ONNX reference, kernels whose points share nothing keep one point per
work-item, and invalid plans are refused with the kernel named."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import sympy
from conftest import assert_close, require
from reference import evaluate_chain

import kernelgen as kg
from kernelgen import backends
from kernelgen.lower import unroll
from kernelgen.exec import Kernel
from kernelgen.shapes import prod


def _winograd_stages(x_shape: tuple[int, ...], algorithm: str) -> tuple[Kernel, Kernel]:
    """The input and output transforms of a padded 3x3 conv + ReLU on ``x_shape`` run with
    ``algorithm`` (default tiles), after checking the program against ONNX's reference."""
    rng = np.random.default_rng(x_shape[-1])
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "w": (rng.standard_normal((7, x_shape[1], 3, 3)) / 3).astype(np.float32)}
    conv = kg.conv(kg.tensor("x", x_shape), kg.constant("w", feeds["w"]), pads=[1, 1, 1, 1])
    ops = [conv, kg.relu(conv)]
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    program = kg.fuse(*ops).emit("opencl", algorithm=algorithm, tuning="none")
    assert_close(program(feeds["x"], feeds["w"]), want, scale=10)
    return program.kernels[0], program.kernels[-1]


@pytest.mark.parametrize("x_shape", [(1, 3, 10, 14), (2, 5, 9, 13), (1, 2, 6, 38)])
def test_winograd_transforms_unroll_a_tile(x_shape: tuple[int, ...]) -> None:
    """The input transform unrolls its 4x4 transform positions (16 values from one tile's 16
    loads); the output transform splits each output axis by 2 or 4 (blocks of whole 2x2
    tiles). An odd output side splits too: the copies past its end read their tile (inside M)
    and store nothing, and the result equals the reference. Rows of more than 16 items run in
    work-groups a multiple of 16 wide, the items past the row idle (38 wide: 19 tiles in
    groups of 32). On a CPU an output row of more tiles than a 4-lane vector interleaves each
    tile's two columns into vector stores instead (test_opencl_interleaved.py)."""
    require("opencl")
    first, last = _winograd_stages(x_shape, "winograd")
    assert first.metadata["tunables"]["unroll"][:2] == (4, 4)
    factors = last.metadata["tunables"]["unroll"][-2:]
    assert all(f in (2, 4) for f in factors)
    woven = last.metadata.get("interleaved_stores")
    assert bool(woven) == (backends.get("opencl").caps.simd_within_work_item and
                           -(-x_shape[3] // 2) > 4)  # tiles along the row (padded 3x3)
    if woven:  # each tile's two columns side by side in the stores
        assert woven == 2 == factors[-1] and "kg_run" in last.source
        return
    past_the_end = any(n % f for n, f in zip(x_shape[2:], factors))
    assert (") out0_[" in last.source or ") relu_" in last.source) == past_the_end
    for k in (first, last):
        width = k.metadata["launch"]["local_size"][0]
        assert width % 16 == 0 if x_shape[3] // 2 > 16 else width <= 16


@pytest.mark.parametrize("x_shape", [(1, 3, 8, 12), (2, 2, 9, 13), (1, 2, 6, 20)])
def test_winograd_4x4_transforms_unroll_a_tile(x_shape: tuple[int, ...]) -> None:
    """F(4x4,3x3): the input transform unrolls all 36 positions of a 6x6 tile (the leading run
    of short axes may unroll past MAX_POINTS), specialising each row of Bᵀ's select to its
    constant-coefficient sum; the output transform splits output axes that 4 divides into
    4x4 blocks, and keeps one point per item (the selects taken at run time) otherwise."""
    require("opencl")
    first, last = _winograd_stages(x_shape, "winograd_4x4")
    assert first.metadata["tunables"]["unroll"][:2] == (6, 6)
    assert "==" not in first.source  # no row select left to take at run time
    if x_shape[2] % 4 == 0 and x_shape[3] % 4 == 0:
        assert all(f % 4 == 0 for f in last.metadata["tunables"]["unroll"][-2:])


def _blocks():
    """Kernels with floor divisions (DepthToSpace, a reshape across a transpose), a broadcast
    and a padded strided slice, on odd and prime extents."""
    rng = np.random.default_rng(7)
    x = kg.tensor("x", (2, 12, 3, 5))
    r = kg.relu(x)
    d2s = kg.depth_to_space(r, 2)
    b = kg.tensor("b", (1, 3, 6, 10))
    yield "depth_to_space", [r, d2s, kg.add(d2s, b)], {
        "x": rng.standard_normal((2, 12, 3, 5)).astype(np.float32),
        "b": rng.standard_normal((1, 3, 6, 10)).astype(np.float32)}
    y = kg.tensor("y", (6, 7))
    t = kg.transpose(y, [1, 0])
    r = kg.reshape(t, [3, 14])
    yield "transpose_reshape", [t, r, kg.exp(r)], {
        "y": rng.standard_normal((6, 7)).astype(np.float32)}
    z = kg.tensor("z", (4, 11))
    p = kg.pad(z, [0, 1, 0, 2], 0.5)
    s = kg.slice(p, [0, 0], [4, 14], [0, 1], [1, 2])
    yield "pad_strided_slice", [p, s, kg.mul(s, s)], {
        "z": rng.standard_normal((4, 11)).astype(np.float32)}


def _plans(extents: list[int], loop) -> list[tuple[int, ...]]:
    """Every valid plan: factors dividing their extents, or up to 4 not dividing them where
    the copies past an axis's end read inside their buffers, a few points, some parallel
    work."""
    options = [[f for f in range(1, n + 1) if n % f == 0 or f <= 4] for n in extents]
    return [f for f in itertools.product(*options)
            if prod(f) <= unroll.MAX_POINTS and prod(f) < prod(extents)
            and _valid(loop, f)]


def _valid(loop, factors: tuple[int, ...]) -> bool:
    """Whether ``unroll.check`` accepts the plan."""
    try:
        unroll.check(loop, factors)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name,ops,feeds", list(_blocks()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_every_plan_equals_the_reference(name: str, ops, feeds) -> None:
    require("opencl")
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    fused = kg.fuse(*ops, force=True)
    loop = fused.lower()
    arrays = [feeds[v.name] for v in fused.inputs]
    plans = _plans([n for _, n in loop.domain], loop)
    assert len(plans) > 3, plans
    for plan in plans:
        kernel = fused.emit_kernel("opencl", tuning="none", unroll=plan)
        assert kernel.metadata["tunables"]["unroll"] == plan
        try:
            assert_close(kernel(*arrays), want)
        except AssertionError as wrong:
            raise AssertionError(f"unroll={plan}: {wrong}") from None


def test_points_that_share_nothing_stay_one_per_item() -> None:
    """An add of two tensors: no copy shares a load, so nothing is unrolled."""
    a, b = kg.tensor("a", (3, 7)), kg.tensor("b", (3, 7))
    loop = kg.fuse(kg.add(a, b)).lower()
    assert unroll.plan(loop) == unroll.none(loop)


def test_depth_to_space_splits_by_its_block() -> None:
    """DepthToSpace reads ``x[.., y // 2, x // 2]``: the plan's split by 2 shares nothing more
    (every output reads its own element), so it is not taken; the candidate exists."""
    x = kg.tensor("x", (1, 8, 5, 6))
    loop = kg.fuse(kg.depth_to_space(x, 2)).lower()
    assert any(2 in f for f in unroll._candidates(loop))
    assert unroll.plan(loop) == unroll.none(loop)


@pytest.mark.parametrize("plan,why", [((7,), "one factor per domain axis"),
                                      ((1, 4), "would leave a buffer"),
                                      ((1, 9), "between 1 and"),
                                      ((7, 6), "parallel work")])
def test_invalid_plans_are_refused(plan: tuple[int, ...], why: str) -> None:
    fused = kg.fuse(kg.transpose(kg.tensor("v", (6, 7)), [1, 0]))
    assert [n for _, n in fused.lower().domain] == [7, 6]
    with pytest.raises(ValueError, match=why) as info:
        fused.emit_kernel("opencl", tuning="none", unroll=plan)
    assert fused.name in str(info.value)


def test_a_factor_past_the_end_guards_its_copies() -> None:
    """DepthToSpace sliced to a 5x7 map, split by 2 along both: the copies past the end of
    the last outer points store nothing (guarded), and their loads, at ``x[.., y // 2, x // 2]``
    = the outer points, stay inside. A split whose copies would read past the buffer (a plain
    transpose) is refused (``test_invalid_plans_are_refused``)."""
    x = kg.tensor("x", (1, 8, 3, 5))
    d2s = kg.depth_to_space(x, 2)
    sliced = kg.slice(d2s, [0, 0], [5, 7], [2, 3])
    ops = [d2s, sliced, kg.exp(sliced)]
    fused = kg.fuse(*ops)
    loop = fused.lower()
    assert [n for _, n in loop.domain] == [2, 5, 7]
    plan = unroll.split(loop, (1, 2, 2))
    assert [n for _, n in plan.parallel] == [2, 3, 4]
    assert plan.guards[0] is sympy.true and all(g is not sympy.true for g in plan.guards[1:])
    require("opencl")
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 8, 3, 5)).astype(np.float32)}
    kernel = fused.emit_kernel("opencl", tuning="none", unroll=(1, 2, 2))
    assert kernel.source.count("if (") >= 3  # the range test, then the three guarded copies
    assert_close(kernel(feeds["x"]), evaluate_chain(ops, feeds)[ops[-1].name])
