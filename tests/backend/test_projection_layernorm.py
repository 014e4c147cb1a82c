"""A projection with its bias and residual Add fused with the LayerNormalization over its rows
(a transformer's ``LayerNorm(x W + b + r)``, which the DNNFusion planner's intensive step
merges where measured faster): the projected row is staged once per row
(``lower/staging.py: _stage_row_producer``) and the LayerNorm's mean, variance and outputs
read it, its shift (the row's first element, subtracted before summing) included. Before,
that shift stayed a dot product of its own, hoisted before the row, and OpenCL's row schedule
refused the kernel (each element then recomputed the whole row: 8.6 ms against 0.11 on PoCL
for 128 x 256 x 256). Equal to NumPy on every backend on awkward shapes (one row of one
column, primes, rows longer than two vectors with a ragged end, a batch axis), NaN where
NumPy has it."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, opencl_caps, require, run

import kernelgen as kg
from kernelgen.backends.opencl.columns import few_registers
from kernelgen.ir.expr import Load, Reduce, walk
from kernelgen.lower import lower

# (batch or None, rows, reduction, columns); Triton, which cannot hold a row read at the element
# axis as a block, runs the inlined form (each element recomputes its row), so it takes the
# short ones
SHORT = [(None, 1, 1, 1), (None, 1, 5, 3), (None, 7, 13, 5)]
LONG = [(None, 37, 64, 48), (None, 5, 33, 129), (2, 7, 19, 40)]
CASES = [(b, s) for b in ("interp", "opencl", "neon", "triton")
         for s in (SHORT if b == "triton" else SHORT + LONG)]


def _projection_layernorm(batch: int | None, m: int, k: int, n: int) -> kg.FusedOp:
    lead = (batch,) if batch else ()
    x, r = kg.tensor("x", (*lead, m, k)), kg.tensor("r", (*lead, m, n))
    projected = kg.matmul(x, kg.tensor("w", (k, n)))
    biased = kg.add(projected, kg.tensor("b", (n,)))
    residual = kg.add(biased, r)
    y = kg.layer_normalization(residual, kg.tensor("g", (n,)), kg.tensor("beta", (n,)),
                               axis=-1)
    return kg.fuse(projected, biased, residual, y, force=True)


def _feeds(batch: int | None, m: int, k: int, n: int) -> dict[str, np.ndarray]:
    lead = (batch,) if batch else ()
    rng = np.random.default_rng(m * 10000 + k * 100 + n)
    return {"x": rng.standard_normal((*lead, m, k)).astype(np.float32),
            "w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
            "b": rng.standard_normal(n).astype(np.float32),
            "r": rng.standard_normal((*lead, m, n)).astype(np.float32),
            "g": rng.standard_normal(n).astype(np.float32),
            "beta": rng.standard_normal(n).astype(np.float32)}


def _numpy(f: dict[str, np.ndarray]) -> np.ndarray:
    h = f["x"].astype(np.float64) @ f["w"] + f["b"] + f["r"]
    centred = h - h.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + 1e-5) * f["g"] + \
        f["beta"]


@pytest.mark.parametrize("backend, shape", CASES,
                         ids=[f"{b}-{'x'.join(str(d) for d in s if d)}" for b, s in CASES])
def test_projection_and_layernorm_equal_numpy(backend: str, shape) -> None:
    if backend != "interp":
        require(backend)
    fused = _projection_layernorm(*shape)
    feeds = _feeds(*shape)
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs), tuning="none")
    assert_close(got, _numpy(feeds), "float32", scale=10)


def test_nan_in_a_row_makes_that_row_nan(backend: str) -> None:
    fused = _projection_layernorm(None, 5, 9, 37)
    feeds = _feeds(None, 5, 9, 37)
    feeds["x"][3, 4] = np.nan
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs), tuning="none")
    assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, axis=0)).any()
    assert_close(np.delete(got, 3, axis=0), np.delete(_numpy(feeds), 3, axis=0), "float32",
                 scale=10)


def test_the_projected_row_is_staged_once_and_the_shift_reads_it() -> None:
    loop = lower(_projection_layernorm(None, 7, 13, 40), "projection_layernorm")
    (row,) = loop.staged
    assert row.buffer.shape == (40,)
    # no reduction but the staged row's own reads the operands: the mean's and the
    # variance's sums (hoisted) and the outputs read the row, the shift at its first point
    outside = [n for root in (*loop.hoisted, *(st.value for st in loop.stores))
               for n in walk(root) if isinstance(n, Reduce)]
    assert outside and not any(isinstance(n, Load) and n.buffer in ("x", "w")
                               for r in outside for n in walk(r))
    assert Load(row.buffer.dtype, row.buffer.name, 0) in {
        n for r in loop.hoisted for n in walk(r)}


@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
def test_cpu_backends_run_it_as_rows(backend_name: str) -> None:
    """Two vectors of the row a step by default, where the target has 32 vector registers
    (NEON; OpenCL on AVX-512), one with 16 (AVX2)."""
    require(backend_name)
    kernel = _projection_layernorm(None, 37, 64, 48).emit(backend_name, tuning="none")
    assert kernel.metadata["schedule"] == "row"
    assert kernel.metadata["staged_rows"] == ["stage0"]
    assert kernel.metadata["producer_redundancy"] == 1.0
    few = backend_name == "opencl" and few_registers(opencl_caps())
    assert kernel.metadata["tunables"]["row_vectors"] == (1 if few else 2)


@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
@pytest.mark.parametrize("vectors", [1, 2, 3, 4])
def test_any_vectors_a_step_equal_numpy(backend_name: str, vectors: int) -> None:
    """A row of 129 (8 vectors of 16 and one, or 32 of 4 and one) in steps of ``vectors``
    vectors, the rest one vector at a time and a scalar tail."""
    require(backend_name)
    shape = (None, 5, 33, 129)
    fused = _projection_layernorm(*shape)
    feeds = _feeds(*shape)
    kernel = fused.emit(backend_name, tuning="none", row_vectors=vectors)
    assert kernel.metadata["tunables"]["row_vectors"] == vectors
    assert_close(kernel(*(feeds[v.name] for v in fused.inputs)), _numpy(feeds), "float32",
                 scale=10)


@pytest.mark.parametrize("backend_name", ["opencl", "neon", "triton"])
def test_row_vectors_refused_where_it_does_not_apply(backend_name: str) -> None:
    require(backend_name)
    fused = _projection_layernorm(None, 5, 9, 37)
    with pytest.raises(ValueError, match="row_vectors"):
        fused.emit(backend_name, tuning="none", row_vectors=5 if backend_name != "triton"
                   else 2)
    if backend_name != "triton":  # a kernel that stages no row
        plain = kg.fuse(kg.layer_normalization(kg.tensor("h", (5, 37)), kg.tensor("g", (37,)),
                                               kg.tensor("beta", (37,))))
        with pytest.raises(ValueError, match="row_vectors"):
            plain.emit(backend_name, tuning="none", row_vectors=2,
                       **({"schedule": "group"} if backend_name == "opencl" else {}))
