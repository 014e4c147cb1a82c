"""kernelgen as an ONNX backend (``onnx.backend.base``): ONNX's own node test cases for every op
kernelgen claims, and the interface itself (inputs by position or name, devices, ``run_node``,
models compiled at run time for the shapes and values they are given)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from conftest import SUMMARY, require
from onnx import TensorProto, helper
from onnx_conformance import claimed_cases, run_case, table
from onnx_graphs import init, io, model, onnxruntime_run

import kernelgen as kg
from kernelgen.graph import onnx_backend as backend

# op types claimed in kernelgen.CONSTRUCTORS whose ONNX node cases all use something kernelgen
# refuses, and why: with these the CI test below accepts no passing case
NO_PASSING_CASE = {"Not": "ONNX's Not cases are opset-1 models (kernelgen imports opset 7 on)"}


@pytest.fixture(scope="module")
def opencl() -> str:
    require("opencl")
    return "opencl"


# the op types in this many shares, each a test of its own (the cases took 205 s in one test on
# a Zen 1 CPU, which pytest-xdist could not share between its workers)
SHARES = 4


@pytest.mark.parametrize("share", range(SHARES), ids=lambda k: f"ops-{k + 1}-of-{SHARES}")
def test_onnx_node_cases(opencl: str, share: int,
                         record_property: Callable[[str, object], None]) -> None:
    """Every claimed case either passes or is refused by a kernelgen error naming the node;
    none gives a wrong value or crashes, and every claimed op passes at least one case. The
    table (pass / refused / failed per op type) is printed at the end of the test log, one
    for each share of the op types."""
    cases = claimed_cases()
    ops = sorted({case.model.graph.node[0].op_type for case in cases})[share::SHARES]
    outcomes = [run_case(case, opencl) for case in cases
                if case.model.graph.node[0].op_type in ops]
    record_property(SUMMARY, f"ONNX node test cases on OpenCL, op types {ops[0]} to "
                             f"{ops[-1]} (share {share + 1} of {SHARES})\n" + table(outcomes))
    failed = [f"{o.case} ({o.status}): {o.detail[:300]}" for o in outcomes
              if o.status in ("wrong", "crash")]
    assert not failed, "\n".join(failed)
    passed = Counter(o.op for o in outcomes if o.status == "pass")
    without = sorted({o.op for o in outcomes} - set(passed) - set(NO_PASSING_CASE))
    assert not without, f"claimed op types passing none of ONNX's cases: {without}"
    for o in outcomes:  # a refusal is one of kernelgen's errors and names what it refuses
        assert o.status == "pass" or o.detail.split(":")[0].endswith("Error"), o


def _mlp() -> onnx.ModelProto:
    w = np.linspace(-1, 1, 7 * 5).reshape(7, 5)
    return model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                  helper.make_node("Relu", ["h"], ["r"]),
                  helper.make_node("Add", ["r", "b"], ["y"])],
                 [io("x", [3, 7]), io("b", [5])], [io("y", [3, 5])], [init("w", w)])


def test_prepare_and_run_by_position_and_by_name(opencl: str) -> None:
    m = _mlp()
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    b = np.arange(5, dtype=np.float32)
    want = onnxruntime_run(m, {"x": x, "b": b})["y"]
    rep = backend.prepare(m, "CPU", backend=opencl, fusion="dnnfusion")
    assert rep.session is not None  # fully shaped: compiled in prepare
    for got in (rep.run([x, b]), rep.run({"x": x, "b": b}), backend.run_model(m, [x, b])):
        np.testing.assert_allclose(got.y, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(kg.ArgumentError, match=r"takes 2 input\(s\) \['x', 'b'\], got 1"):
        rep.run([x])


def test_devices() -> None:
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA")
    assert not backend.supports_device("TPU:7")
    with pytest.raises(kg.ArgumentError, match="device 'CUDA' is not supported"):
        backend.prepare(_mlp(), "CUDA")


def test_a_malformed_model_fails_in_prepare() -> None:
    m = model([helper.make_node("Relu", ["x", "nothing"], ["y"])], [io("x", [3])],
              [io("y", [3])])
    with pytest.raises(kg.ModelError):
        backend.prepare(m)


def test_run_node(opencl: str) -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], axis=0)
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], np.float32)
    (got,) = backend.run_node(node, [x], backend=opencl)
    want = np.exp(x - x.max(0)) / np.exp(x - x.max(0)).sum(0)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_shapes_and_values_given_at_run_time(opencl: str) -> None:
    """A Reshape whose shape is a graph input and a data input of symbolic length: compiled
    at run time for each (shape, value) combination, once each."""
    m = model([helper.make_node("Reshape", ["x", "shape"], ["r"]),
               helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=0)],
              [io("x", ["n"]), io("shape", [2], TensorProto.INT64),
               io("axes", [1], TensorProto.INT64)],
              [io("y", ["m"])])
    rep = backend.prepare(m, backend=opencl)
    assert rep.session is None
    x = np.arange(12, dtype=np.float32)
    for shape, axes in (((3, 4), 1), ((3, 4), 0), ((6, 2), 1), ((3, 4), 1)):
        feeds = [x, np.array(shape, np.int64), np.array([axes], np.int64)]
        (got,) = rep.run(feeds)
        np.testing.assert_array_equal(got, x.reshape(shape).sum(axis=axes))
    assert len(rep.sessions) == 3 and rep.value_inputs == {"shape", "axes"}
    (got,) = rep.run([np.arange(8, dtype=np.float32), np.array([2, 4]), np.array([0])])
    np.testing.assert_array_equal(got, np.arange(8).reshape(2, 4).sum(0))
