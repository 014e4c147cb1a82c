"""OpenCL's 'columns' schedule: on a CPU, output elements that each reduce on their own (LRN's
window over channels, a reduction along a strided axis, a MaxPool too long for the 'window'
schedule) run a chunk of the last axis a work-item, each reduction a lane of a vector
accumulator. Against LRN's definition in NumPy (``reference.lrn_reference``: ONNX's reference
evaluator gets LRN wrong), ONNX's reference (MaxPool) and NumPy (reductions) on awkward
shapes: one channel, primes, a last axis shorter than a chunk, chunks ending in a partial
vector and in lanes past any whole vector; with a prologue and an epilogue; NaN and infinities
as the 'item' schedule gives them; where it does not apply; a GPU keeps 'item'; the tuner may
choose either."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, require, require_vectors_of
from reference import evaluate_chain, lrn_reference

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl.element_columns import COLUMNS_VECTORS, opencl_columns
from kernelgen.backends.opencl.schedule import choose
from kernelgen.ops.reduce import reduce_op

LRNS = {  # name: (x shape, LRN attributes)
    "inception-like": ((1, 13, 11, 11), {"size": 5, "alpha": 1e-4, "beta": 0.75}),
    "one-channel": ((2, 1, 7, 13), {"size": 5, "alpha": 0.5, "beta": 0.75, "bias": 2.0}),
    "size-3-prime": ((3, 7, 5, 19), {"size": 3, "alpha": 0.3, "beta": 0.5}),
    "even-size": ((1, 6, 17, 3), {"size": 4, "alpha": 0.2, "beta": 1.5, "bias": 0.5}),
    "wider-than-channels": ((1, 3, 2, 67), {"size": 7, "alpha": 0.1, "beta": 0.6}),
}


def _lrn_block(name: str) -> tuple[list[kg.Op], dict[str, np.ndarray], np.ndarray]:
    """relu -> LRN -> * a second input (a prologue in the reads, an epilogue in the stores),
    its inputs and its expected output."""
    shape, attrs = LRNS[name]
    rng = np.random.default_rng(sum(shape))
    feeds = {"x": 3 * rng.standard_normal(shape).astype(np.float32),
             "s": rng.standard_normal(shape).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", shape))
    lrn = kg.lrn(pre, **attrs)
    full = {"alpha": 1e-4, "beta": 0.75, "bias": 1.0, **attrs}
    want = lrn_reference(np.maximum(feeds["x"], 0), full["size"], full["alpha"], full["beta"],
                         full["bias"]) * feeds["s"]
    return [pre, lrn, kg.mul(lrn, kg.tensor("s", shape))], feeds, want


def _run(kernel: kg.Kernel, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return kernel(*[feeds[a["name"]] for a in kernel.metadata["args"] if a["role"] == "input"])


def _cpu() -> bool:
    return backends.get("opencl").caps.simd_within_work_item


@pytest.mark.parametrize("name", LRNS)
def test_lrn_runs_as_columns(name: str) -> None:
    require("opencl")
    ops, feeds, want = _lrn_block(name)
    fused = kg.fuse(*ops)
    kernel = fused.emit("opencl", tuning="none")
    assert kernel.metadata["schedule"] == ("columns" if _cpu() else "item")
    assert_close(_run(kernel, feeds), want)
    forced = fused.emit("opencl", tuning="none", schedule="columns", local_size=3)
    assert "vacc" in forced.source  # the window's sums are vector accumulators
    assert_close(_run(forced, feeds), want)


@pytest.mark.parametrize("kind", ["ReduceMean", "ReduceMax", "ReduceSumSquare"])
@pytest.mark.parametrize("shape", [(2, 5, 7, 41), (1, 37, 3, 3), (3, 2, 1, 131)])
def test_channel_reductions_run_as_columns(kind: str, shape: tuple[int, ...]) -> None:
    """A reduction over axis 1 of NCHW: each output pixel reduces the channels along a
    strided axis, the pixels contiguous. 131 pixels: two chunks, the second a partial one."""
    require("opencl")
    rng = np.random.default_rng(len(kind) + sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    fused = kg.fuse(reduce_op(kind, kg.tensor("x", shape), [1]))
    want = {"ReduceMean": np.mean, "ReduceMax": np.max,
            "ReduceSumSquare": lambda a, axis, keepdims: np.sum(a * a, axis, keepdims=keepdims)
            }[kind](x, axis=1, keepdims=True)
    kernel = fused.emit("opencl", tuning="none", schedule="columns")
    assert_close(kernel(x), want)
    if _cpu() and shape[-1] * shape[-2] >= 2 * 16:
        assert fused.emit("opencl", tuning="none").metadata["schedule"] == "columns"


# asymmetric pads at stride 2 only: at stride 1, onnx 1.23's reference evaluator pads H by the
# first two numbers of ``pads`` (its output was 18x52 where ONNX's definition gives 19x51)
@pytest.mark.parametrize("strides,pads", [([1, 1], [4, 4, 4, 4]), ([2, 2], [4, 3, 4, 3])])
def test_long_max_pool_runs_as_columns(strides: list[int], pads: list[int]) -> None:
    """A MaxPool of more taps than a pooling window takes (``window.POOL_MAX_TAPS``): each
    output's own max, its padded taps tested along the vector's lanes (read whole inside,
    masked or lane by lane at the edges), every second float at stride 2."""
    require("opencl")
    shape = (2, 2, 19, 53)
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", shape))
    pool = kg.max_pool(pre, [9, 9], pads=pads, strides=strides)
    want = evaluate_chain([pre, pool], feeds)[pool.name]
    fused = kg.fuse(pre, pool)
    kernel = fused.emit("opencl", tuning="none")
    assert kernel.metadata["schedule"] == ("columns" if _cpu() else "item")
    assert_close(_run(kernel, feeds), want)


def test_nan_and_infinities_as_the_item_schedule() -> None:
    """A NaN among the channels makes their maximum (and LRN's sum) NaN; +Inf wins a max."""
    require("opencl")
    shape = (2, 6, 3, 29)
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 2, 1, 3], x[1, 5, 2, 28], x[0, 0, 0, 70 % 29] = np.nan, np.inf, -np.inf
    for op in (reduce_op("ReduceMax", kg.tensor("x", shape), [1]),
               kg.lrn(kg.tensor("x", shape), size=3)):
        fused = kg.fuse(op)
        columns = fused.emit("opencl", tuning="none", schedule="columns")(x)
        item = fused.emit("opencl", tuning="none", schedule="item")(x)
        assert np.isnan(columns).sum() >= 1
        np.testing.assert_allclose(columns, item, rtol=1e-6)  # NaN and Inf where item has them


def test_where_it_does_not_apply() -> None:
    """A last axis shorter than two 4-lane vectors, a reduction along the contiguous axis
    ('row'), a softmax over channels (its sums key the pixels, not each element): no plan, and
    asking for 'columns' names the kernel."""
    require("opencl")
    caps = backends.get("opencl").caps
    short = kg.fuse(kg.lrn(kg.tensor("x", (1, 8, 1, 7)), size=3))
    along_rows = kg.fuse(reduce_op("ReduceSum", kg.tensor("x", (5, 300)), [1]))
    softmax = kg.fuse(kg.softmax(kg.tensor("x", (1, 21, 9, 9)), axis=1))
    for fused in (short, along_rows, softmax):
        assert opencl_columns(fused.lower(), caps) is None
        with pytest.raises(ValueError) as refused:
            fused.emit("opencl", tuning="none", schedule="columns")
        assert "'columns'" in str(refused.value) and "kernel 'fused_" in str(refused.value)


def test_gpu_keeps_item_and_tuner_may_choose_either() -> None:
    require("opencl")
    ops, _, _ = _lrn_block("inception-like")
    loop = kg.fuse(*ops).lower()
    opencl = backends.get("opencl")
    gpu, cpu = opencl.for_device("desktop-gpu"), opencl.for_device("cpu-avx512")
    assert choose(gpu.expand(loop), {}, gpu.caps).kind == "item"
    sched = choose(cpu.expand(loop), {}, cpu.caps)
    assert sched.kind == "columns" and sched.vector_width == 16
    options = [c.as_options() for c in cpu.search_space(loop)]
    assert options[0] == {"local_size": 256} and {"schedule": "item", "local_size": 256} in options
    assert any(o.get("schedule") == "columns" for o in options)
    assert not any(c.as_options().get("schedule") == "columns" for c in gpu.search_space(loop))


@pytest.mark.parametrize("pixels", [(11, 11), (1, 64), (2, 17), (2, 15)])
def test_chunks_of_whole_vectors_and_a_tail(pixels: tuple[int, int]) -> None:
    """Generated for a declared AVX-512 CPU (16 lanes), run here: each work-item's chunk is
    ``COLUMNS_VECTORS`` vectors; 121 pixels take a chunk of 64 and one of 57 (three vectors,
    then 9 lanes one by one), 64 one whole chunk, 34 two vectors and 2 lanes, 30 (under two
    vectors of 16) 8-lane vectors."""
    require("opencl")
    shape = (2, 5, *pixels)
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    fused = kg.fuse(kg.lrn(kg.tensor("x", shape), size=3, alpha=0.5))
    kernel = fused.emit(backends.get("opencl").for_device("cpu-avx512"), tuning="none")
    n = pixels[0] * pixels[1]
    width = 16 if n >= 32 else 8
    assert kernel.metadata["schedule"] == "columns"
    assert f"float{width} vacc" in kernel.source
    assert f"kg_chunk * {width * COLUMNS_VECTORS}" in kernel.source
    assert ("kg_stop" in kernel.source) == bool(n % (width * COLUMNS_VECTORS))
    require_vectors_of(kernel.source)
    assert_close(kernel(x), lrn_reference(x, 3, 0.5, 0.75, 1.0))
