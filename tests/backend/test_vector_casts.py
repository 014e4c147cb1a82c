"""Integer and boolean inputs cast to float32 inside vector code: OpenCL loads their lanes as
one vector and converts it (``convert_floatN``, ``VectorSyntax.load_convert``) where a cast
had kept the whole expression lane by lane. An attention mask (int64, int32 or boolean) in a
GEMM's epilogue and in a softmax row, each against NumPy on shapes that leave partial vectors
and tiles."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, require

import kernelgen as kg
from kernelgen import backends

rng = np.random.default_rng(43)


def _f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _vectors() -> None:
    require("opencl")
    if not backends.get("opencl").caps.vector_widths:
        pytest.skip("the OpenCL device builds no float vectors (scalar template)")


def _penalty(mask: kg.Value) -> list[kg.Op]:
    """``(1 - float(mask)) * -10000``, BERT's padding mask, as its ops (the last is it)."""
    as_float = kg.cast(mask, "float32")
    keep = kg.sub(kg.constant("one", np.array(1.0, np.float32)), as_float)
    return [as_float, keep, kg.mul(keep, kg.constant("big", np.array(-10000.0, np.float32)))]


def _mask(dtype: str, n: int) -> np.ndarray:
    return rng.integers(0, 2, n).astype(dtype)


@pytest.mark.parametrize("dtype,n", [("int64", 47), ("int32", 64), ("bool", 37), ("int64", 128)])
def test_mask_in_a_gemm_epilogue(dtype: str, n: int) -> None:
    """Attention scores ``q k / s`` plus the mask's penalty: the whole epilogue in vectors (it
    had been lane by lane, which made BERT's score kernel twice as slow as its product), with a
    shifted last column tile (47, 37) and row tile (13 rows)."""
    _vectors()
    heads, m, k = 3, 13, 16
    q, kt, mask = _f32(heads, m, k), _f32(heads, k, n), _mask(dtype, n)
    mm = kg.matmul(kg.tensor("q", (heads, m, k)), kg.tensor("kt", (heads, k, n)))
    scaled = kg.div(mm, kg.constant("s", np.array(4.0, np.float32)))
    penalty = _penalty(kg.tensor("mask", (n,), dtype))
    out = kg.add(scaled, penalty[-1])
    kernel = kg.fuse(mm, scaled, *penalty, out, force=True).emit_kernel("opencl",
                                                                        tuning="none")
    assert kernel.metadata["schedule"] == "tiled"
    assert "kg_sums" not in kernel.source and "convert_float" in kernel.source
    want = (q.astype(np.float64) @ kt) / 4 + (1 - mask.astype(np.float64)) * -10000
    assert_close(kernel(q, kt, mask), want, np.float32, scale=k)


@pytest.mark.parametrize("dtype,n", [("int64", 128), ("bool", 131), ("int32", 67)])
def test_mask_in_a_softmax_row(dtype: str, n: int) -> None:
    """``softmax(x + penalty)`` over rows of ``n`` (a partial last vector at 131 and 67): the
    mask converted in the row's vector loop."""
    _vectors()
    rows = 7
    x, mask = _f32(rows, n), _mask(dtype, n)
    penalty = _penalty(kg.tensor("mask", (n,), dtype))
    scores = kg.add(kg.tensor("x", (rows, n)), penalty[-1])
    probs = kg.softmax(scores, axis=-1)
    kernel = kg.fuse(*penalty, scores, probs, force=True).emit_kernel("opencl")
    assert "convert_float" in kernel.source
    z = x.astype(np.float64) + (1 - mask.astype(np.float64)) * -10000
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    assert_close(kernel(x, mask), e / e.sum(axis=-1, keepdims=True), np.float32)
