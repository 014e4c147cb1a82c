"""Golden emitted sources for every backend: an emitter change shows up as a reviewable diff.

Regenerate after an intended change with
``KERNELGEN_UPDATE_GOLDEN=1 pytest tests/backend/test_golden.py`` and review tests/golden/.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

import kernelgen as kg

GOLDEN = Path(__file__).parent.parent / "golden"


def _named(op: kg.Op, name: str) -> kg.Op:
    op.name = name  # stable buffer names in the source
    return op


def bias_gelu() -> kg.FusedOp:
    x, b = kg.tensor("x", (129, 257)), kg.tensor("b", (257,))
    a = _named(kg.add(x, b), "a")
    return kg.fuse(a, _named(kg.gelu(a), "y"))


def transpose_reshape_exp() -> kg.FusedOp:
    x = kg.tensor("x", (3, 5, 7))
    t = _named(kg.transpose(x, [2, 0, 1]), "t")
    r = _named(kg.reshape(t, [7, 15]), "r")
    return kg.fuse(t, r, _named(kg.exp(r), "y"))


def pad_concat() -> kg.FusedOp:
    x, y = kg.tensor("x", (4, 5)), kg.tensor("y", (4, 3))
    p = _named(kg.pad(x, [0, 1, 0, 2], 0.5), "p")
    return kg.fuse(p, _named(kg.concat([p, y], 1), "c"))


def row_softmax() -> kg.FusedOp:
    x = kg.tensor("x", (64, 1000))
    return kg.fuse(_named(kg.softmax(x, 1), "y"))


def column_sum_group() -> kg.FusedOp:
    x = kg.tensor("x", (4096, 3))
    return kg.fuse(_named(kg.reduce_sum(x, [0], 0), "y"))


def gather_rows() -> kg.FusedOp:
    d, i = kg.tensor("d", (10, 6)), kg.tensor("i", (7,), "int64")
    g = _named(kg.gather(d, i, 0), "g")
    return kg.fuse(g, _named(kg.relu(g), "y"))


def gemm_bias_relu() -> kg.FusedOp:
    a, b, c = kg.tensor("a", (33, 17)), kg.tensor("b", (17, 9)), kg.tensor("c", (9,))
    g = _named(kg.gemm(a, b, c), "g")
    return kg.fuse(g, _named(kg.relu(g), "y"))


CASES: dict[str, Callable[[], kg.FusedOp]] = {
    f.__name__: f for f in (bias_gelu, transpose_reshape_exp, pad_concat, row_softmax,
                            column_sum_group, gather_rows, gemm_bias_relu)}


SUFFIX = {"opencl": "cl", "neon": "c", "triton": "py"}


@pytest.mark.parametrize("backend_name", SUFFIX)
@pytest.mark.parametrize("name", CASES)
def test_golden_source(name: str, backend_name: str) -> None:
    source = CASES[name]().emit(backend_name).source
    path = GOLDEN / backend_name / f"{name}.{SUFFIX[backend_name]}"
    if os.environ.get("KERNELGEN_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    assert path.exists(), f"missing golden file {path}; run with KERNELGEN_UPDATE_GOLDEN=1"
    assert source == path.read_text(), f"emitted source for {name} changed; review and update"


def test_index_width_follows_tensor_size() -> None:
    """int indices while every buffer fits in 2**31 elements, long beyond (source only: 2**32
    floats would need 16 GiB to run)."""
    small = kg.fuse(kg.relu(kg.tensor("x", (2**15, 2**15)))).emit("opencl")
    big = kg.fuse(kg.relu(kg.tensor("x", (2**16, 2**16)))).emit("opencl")
    assert small.metadata["tunables"]["index_type"] == "int"
    assert big.metadata["tunables"]["index_type"] == "long"
    assert "const long o0 = (long)get_global_id(0);" in big.source
