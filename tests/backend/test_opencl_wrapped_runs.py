"""Padded convolutions whose vector columns run over the whole output map on OpenCL
(``columns.vector_plan``'s ``wrap``): a 'same' convolution (stride 1, output rows as long as
the input's) reads its patches contiguously along the flat output position, so a tile of
columns may wrap from one output row into the next, each lane testing its own row and column
against the padding (``flatten_axes(..., wrap=True)``, ``split_lanes``, a masked vector read).
Against ONNX's reference on maps no vector divides, with a prologue and an epilogue fused, and
on the code paths: the masked read inside the buffer, lane by lane at the map's first and last
rows, int and long indices; where the rows themselves tile without waste, they stay the run."""
from __future__ import annotations

import numpy as np
import pytest
import sympy
from conftest import assert_close, require
from reference import evaluate_chain

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.c.vectorizable import split_guard, split_lanes
from kernelgen.ir.expr import Load, walk
from kernelgen.ir.substitute import flatten_axes
from kernelgen.mapping_types import FloorDiv, FloorMod

WRAPPED = "the map's edge"  # the comment of the masked read's lane-by-lane branch

# name: (x shape, w shape, conv attributes). With 8-lane registers (AVX2) as with 16 (AVX-512),
# a run over each whole map computes fewer column vectors than runs along its rows do, so each
# map takes the wrapped run on either CPU (``columns._vectors``); 2 rows of 9 had computed 4
# vectors of 8 either way on AVX2, and kept their rows there.
CONVS = {
    "3x3-55x55": ((1, 16, 55, 55), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3x3-batch-primes": ((2, 5, 27, 27), (7, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    "5x5-13x13": ((1, 3, 13, 13), (11, 3, 5, 5), {"pads": [2, 2, 2, 2]}),
    "3x3-dilated": ((1, 4, 7, 7), (5, 4, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    "3x3-asymmetric-pads": ((1, 3, 8, 11), (5, 3, 3, 3), {"pads": [0, 1, 2, 1]}),
    "3x3-two-rows": ((1, 6, 2, 5), (4, 6, 3, 3), {"pads": [1, 1, 1, 1]}),
}


def _conv_block(x_shape, w_shape, attrs):
    """relu -> Conv (+ bias) -> sigmoid: a prologue inside the masked reads, an epilogue in
    the stores."""
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "w": (rng.standard_normal(w_shape) / 3).astype(np.float32),
             "b": rng.standard_normal(w_shape[0]).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", x_shape))
    conv = kg.conv(pre, kg.constant("w", feeds["w"]), kg.constant("b", feeds["b"]), **attrs)
    return [pre, conv, kg.sigmoid(conv)], feeds


@pytest.mark.parametrize("algorithm", ["im2col", "implicit_gemm"])
@pytest.mark.parametrize("name", CONVS)
def test_wrapped_runs_equal_the_reference(name: str, algorithm: str) -> None:
    require("opencl")
    ops, feeds = _conv_block(*CONVS[name])
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    kernel = kg.fuse(*ops).emit("opencl", algorithm=algorithm, tuning="none")
    assert WRAPPED in kernel.source, kernel.metadata["tunables"]
    assert_close(kernel(feeds["x"]), want)


@pytest.mark.parametrize("target", ["cpu-avx2", "cpu-avx512"])
@pytest.mark.parametrize("name", CONVS)
def test_every_map_wraps_on_either_cpu(name: str, target: str) -> None:
    """The maps above take the wrapped run generated for a CPU with 8-lane registers and for
    one with 16 (source only), so the test above checks it on whichever CPU runs it."""
    ops, _ = _conv_block(*CONVS[name])
    be = backends.REGISTRY["opencl"].for_device(target)  # type: ignore[attr-defined]
    assert WRAPPED in kg.fuse(*ops).emit(be, algorithm="implicit_gemm", tuning="none").source


def test_wrapped_runs_with_long_indices() -> None:
    """Past 2**31 elements indices are long, and OpenCL C does not mix an int lane-number
    vector with long scalars: each lane's tests then fill a mask array lane by lane. Source
    and build only (the input alone would need 8 GiB)."""
    require("opencl")
    import pyopencl as cl

    from kernelgen.backends.opencl.runtime import device

    conv = kg.conv(kg.tensor("x", (1, 2, 32768, 32769)),
                   kg.constant("w", np.ones((3, 2, 3, 3), np.float32)), pads=[1, 1, 1, 1])
    kernel = kg.fuse(conv).emit("opencl", algorithm="implicit_gemm", tuning="none")
    assert kernel.metadata["tunables"]["index_type"] == "long"
    assert WRAPPED in kernel.source and "? -1 : 0;" in kernel.source
    cl.Program(device().context, kernel.source).build()


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 3, 9, 64), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # rows of whole tiles
    ((1, 3, 9, 23), (5, 3, 3, 3), {}),  # no padding: output rows shorter than the input's
    ((1, 3, 9, 23), (5, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
])
def test_runs_that_need_no_wrapping_keep_the_rows(x_shape, w_shape, attrs) -> None:
    require("opencl")
    ops, feeds = _conv_block(x_shape, w_shape, attrs)
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    kernel = kg.fuse(*ops).emit("opencl", algorithm="implicit_gemm", tuning="none")
    assert WRAPPED not in kernel.source
    assert_close(kernel(feeds["x"]), want)


def test_wrapped_guards_test_each_lane() -> None:
    """``flatten_axes(..., wrap=True)`` writes a guard on merged axes as each axis's floor and
    remainder of the flat position, which ``split_lanes`` takes and ``split_guard`` (one
    interval of lanes) does not; a product of index symbols is refused by both."""
    h, r, flat = sympy.symbols("h r kg_col", integer=True)
    ops, _ = _conv_block(*CONVS["3x3-two-rows"])
    loop = kg.fuse(*ops).lower()
    (oh, n_oh), (ow, n_ow) = loop.domain[-2:]
    (store,) = loop.stores
    merged = flatten_axes(store.value, [(oh, n_oh), (ow, n_ow)], flat, wrap=True)
    assert merged is not None
    assert flatten_axes(store.value, [(oh, n_oh), (ow, n_ow)], flat) is None
    guards = {n.guard for n in walk(merged) if isinstance(n, Load) and
              flat in n.guard.free_symbols}
    assert guards and all(g.atoms(FloorDiv) and g.atoms(FloorMod) for g in guards)
    for g in guards:
        assert split_guard(g, flat) is None
        uniform, tests = split_lanes(g, flat)  # type: ignore[misc]
        assert tests and all(flat in t.free_symbols for t in tests)
    guard = sympy.And(FloorDiv(flat, 9) + r >= 1, FloorMod(flat, 9) + r < 10, r >= 0)
    assert split_lanes(guard, flat) == (r >= 0, (FloorDiv(flat, 9) + r >= 1,
                                                 FloorMod(flat, 9) + r < 10))
    assert split_lanes(sympy.And(flat * r >= 1), flat) is None
    assert split_lanes(sympy.And(FloorDiv(flat, 9) * h >= 1), flat) is None
