"""Seed 003's weight rewrites against the unrewritten graph (ONNX reference): Conv-BN and
Gemm-BN folding, and sibling convolutions merged into one wider convolution."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, run
from reference import evaluate_chain

import kernelgen as kg
from kernelgen.graph.rewrite import RewriteError, fold_batchnorm, merge_sibling_convs

rng = np.random.default_rng(7)


def _randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _bn_params(c: int) -> list[kg.Constant]:
    return [kg.constant("gamma", _randn(c)), kg.constant("beta", _randn(c)),
            kg.constant("mean", _randn(c)),
            kg.constant("var", np.abs(_randn(c)) + 0.5)]


def _batch_norm(y: np.ndarray, params: list[kg.Constant], epsilon: float = 1e-5) -> np.ndarray:
    """NumPy's BatchNormalization of ``y`` (channels on axis 1) from the four parameters."""
    gamma, beta, mean, var = (np.asarray(p.value, np.float64).reshape(
        (-1,) + (1,) * (y.ndim - 2)) for p in params)
    return (y - mean) / np.sqrt(var + epsilon) * gamma + beta


def _feeds(ops: list[kg.Op], extra: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    feeds = dict(extra)
    for op in ops:
        for v in op.inputs:
            if isinstance(v, kg.Constant):
                feeds[v.name] = v.value
    return feeds


@pytest.mark.parametrize("bias", [True, False])
def test_conv_bn_folding(backend: str, bias: bool) -> None:
    x = kg.tensor("x", (2, 3, 7, 6))
    w = kg.constant("w", _randn(5, 3, 3, 3))
    b = kg.constant("b", _randn(5)) if bias else None
    c = kg.conv(x, w, b, pads=[1, 1, 1, 1], strides=[2, 1])
    params = _bn_params(5)
    bn = kg.batch_normalization(c, *params, epsilon=1e-3)
    X = _randn(2, 3, 7, 6)
    conv = evaluate_chain([c], _feeds([c], {"x": X}))[c.name]
    want = np.maximum(_batch_norm(conv.astype(np.float64), params, 1e-3), 0)
    folded = fold_batchnorm(bn)
    out = kg.relu(folded)
    fused = kg.fuse(folded, out)  # Conv + BN + ReLU as one kernel over folded weights
    feeds = _feeds([folded], {"x": X})
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs))
    assert_close(got, want, np.float32, scale=20)


def test_gemm_bn_folding(backend: str) -> None:
    x = kg.tensor("x", (4, 6))
    g = kg.gemm(x, kg.constant("w", _randn(6, 5)), kg.constant("c", _randn(5)))
    params = _bn_params(5)
    bn = kg.batch_normalization(g, *params)
    X = _randn(4, 6)
    want = _batch_norm(evaluate_chain([g], _feeds([g], {"x": X}))[g.name].astype(np.float64),
                       params)
    folded = fold_batchnorm(bn)
    fused = kg.fuse(folded)
    feeds = _feeds([folded], {"x": X})
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs))
    assert_close(got, want, np.float32, scale=20)


def test_merge_1x1_beside_3x3(backend: str) -> None:
    x = kg.tensor("x", (1, 4, 6, 7))
    a = kg.conv(x, kg.constant("wa", _randn(3, 4, 1, 1)), kg.constant("ba", _randn(3)))
    b = kg.conv(x, kg.constant("wb", _randn(5, 4, 3, 3)), pads=[1, 1, 1, 1])
    X = _randn(1, 4, 6, 7)
    want = evaluate_chain([a, b], _feeds([a, b], {"x": X}))
    merged, sa, sb = merge_sibling_convs(a, b)
    assert merged.shape == (1, 8, 6, 7)
    feeds = _feeds([merged], {"x": X})
    for piece, original in ((sa, a), (sb, b)):
        fused = kg.fuse(merged, piece, force=True)
        (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs))
        assert_close(got, want[original.name], scale=20)


def test_rewrite_preconditions_are_named() -> None:
    x = kg.tensor("x", (1, 2, 5, 5))
    w_var = kg.tensor("w_var", (3, 2, 3, 3))
    c = kg.conv(x, w_var)
    with pytest.raises(RewriteError, match="'w_var' must be a constant"):
        fold_batchnorm(kg.batch_normalization(c, *_bn_params(3)))
    with pytest.raises(RewriteError, match="not BatchNormalization"):
        fold_batchnorm(c)
    a = kg.conv(x, kg.constant("wa", _randn(3, 2, 1, 1)))
    b = kg.conv(x, kg.constant("wb", _randn(3, 2, 3, 3)), strides=[2, 2])
    with pytest.raises(RewriteError, match="strides differ"):
        merge_sibling_convs(a, b)
