"""The operators added for whole models (LRN, Dropout), alone and fused, on every backend
against independent references on awkward shapes.

LRN's reference is the ONNX definition written out in NumPy, checked against onnxruntime:
onnx 1.23's reference evaluator loops over the batch axis where it means the channels
(``onnx/reference/ops/op_lrn.py``), so it is no arbiter for LRN.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import assert_close, prebuild, run
from onnx import TensorProto, helper
from reference import lrn_reference

import kernelgen as kg
from kernelgen.mapping_types import MappingType

rng = np.random.default_rng(77)

# (shape, size, alpha, beta, bias): even and odd windows, windows wider than the channels,
# one channel, rank 3 and 5, the light models' AlexNet setting
LRN_CASES = [((2, 7, 3, 5), 5, 1e-4, 0.75, 1.0), ((2, 7, 3, 5), 2, 0.3, 0.6, 1.5),
             ((1, 13, 1, 1), 4, 0.5, 0.9, 2.0), ((1, 3, 2, 2), 9, 0.2, 0.75, 1.0),
             ((3, 1, 5, 1), 3, 0.4, 0.5, 1.0), ((2, 5, 17), 3, 0.3, 0.75, 1.2),
             ((1, 6, 2, 3, 2), 5, 0.3, 0.8, 1.0), ((1, 2, 1, 1), 1, 0.5, 1.0, 1.0)]


def _lrn(case: tuple) -> kg.Op:
    shape, size, alpha, beta, bias = case
    return kg.lrn(kg.tensor("x", shape), size, alpha=alpha, beta=beta, bias=bias)


@pytest.fixture(scope="module", autouse=True)
def _neon_batch(request: pytest.FixtureRequest) -> None:
    prebuild(request, lambda: [kg.fuse(_lrn(c)) for c in LRN_CASES])


@pytest.mark.parametrize("case", LRN_CASES, ids=lambda c: f"{c[0]}-size{c[1]}")
def test_lrn(backend: str, case: tuple) -> None:
    op = _lrn(case)
    x = (rng.standard_normal(case[0]) * 2).astype(np.float32)
    (got,) = run(backend, kg.fuse(op), x)
    assert op.mapping_type is MappingType.MANY_TO_MANY or case[1] == 1
    assert_close(got, lrn_reference(x, *case[1:]), scale=10)


def test_lrn_reference_agrees_with_onnxruntime() -> None:
    """The NumPy reference is onnxruntime's LRN (so a test against it is a test against a
    runtime as well as the definition); onnxruntime takes odd window sizes on 4-D inputs
    only."""
    for shape, size, alpha, beta, bias in [c for c in LRN_CASES if c[1] % 2 and len(c[0]) == 4]:
        node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta,
                                bias=bias)
        graph = helper.make_graph([node], "lrn", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, list(shape))], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, list(shape))])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        x = rng.standard_normal(shape).astype(np.float32)
        (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
        np.testing.assert_allclose(lrn_reference(x, size, alpha, beta, bias), want,
                                   rtol=1e-5, atol=1e-6)


def test_lrn_fused_after_relu(backend: str) -> None:
    """AlexNet's Conv -> Relu -> LRN tail: the Relu inlined into the window's loads."""
    x = kg.tensor("x", (1, 11, 4, 3))
    r = kg.relu(x)
    n = kg.lrn(r, 5, alpha=0.01, beta=0.75, bias=2.0)
    X = rng.standard_normal((1, 11, 4, 3)).astype(np.float32)
    (got,) = run(backend, kg.fuse(r, n), X)
    assert_close(got, lrn_reference(np.maximum(X, 0), 5, 0.01, 0.75, 2.0), scale=10)


def test_lrn_refuses_bad_input() -> None:
    with pytest.raises(kg.ShapeError, match="LRN"):
        kg.lrn(kg.tensor("v", (3, 4)), 3)
    with pytest.raises(kg.AttributeError_, match="size"):
        kg.lrn(kg.tensor("x", (1, 3, 2, 2)), 0)
    with pytest.raises(kg.DtypeError, match="LRN"):
        kg.lrn(kg.tensor("i", (1, 3, 2, 2), "int32"), 3)


@pytest.mark.parametrize("shape,dtype", [((7,), "float32"), ((2, 1, 3), "float16"),
                                         ((3, 5), "int64")])
def test_dropout_is_the_identity_at_inference(backend: str, shape: tuple, dtype: str) -> None:
    op = kg.dropout(kg.tensor("x", shape, dtype), ratio=0.3)
    assert op.kind == "Dropout" and op.attrs == {"ratio": 0.3}
    assert op.mapping_type is MappingType.ONE_TO_ONE
    x = (rng.standard_normal(shape) * 5).astype(dtype)
    (got,) = run(backend, kg.fuse(op), x)
    np.testing.assert_array_equal(got, x)


def test_dropout_refuses_training() -> None:
    x = kg.tensor("x", (3,))
    with pytest.raises(kg.AttributeError_, match="training_mode"):
        kg.dropout(x, training_mode=1)
    with pytest.raises(kg.AttributeError_, match="ratio"):
        kg.dropout(x, ratio=1.5)


def test_new_operators_are_in_the_onnx_table() -> None:
    assert kg.CONSTRUCTORS["LRN"] is kg.lrn
    assert kg.CONSTRUCTORS["Dropout"] is kg.dropout
