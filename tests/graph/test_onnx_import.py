"""ONNX import: small exporter-style graphs agree with onnxruntime when the imported graph runs
on the IR interpreter (no device needed), and malformed or unsupported models fail with an
error that names the node, its op type and what is wrong."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_graphs import CASES, init, io, model, onnxruntime_run, randn

import kernelgen as kg
from kernelgen.graph import interpret_graph


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_agrees_with_onnxruntime(case: str) -> None:
    m, feeds = CASES[case]()
    graph = kg.import_onnx(m)
    got = interpret_graph(graph, feeds)
    want = onnxruntime_run(m, feeds)
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].shape == array.shape, name
        np.testing.assert_allclose(got[name], array, rtol=1e-5, atol=1e-6, err_msg=name)


def test_shape_arithmetic_is_folded_at_import() -> None:
    """Shape -> Gather -> Unsqueeze -> Concat becomes a constant; only the tensors that depend
    on the input are operators."""
    m, _ = CASES["attention_shapes"]()
    kinds = [op.kind for op in kg.import_onnx(m).ops]
    assert kinds == ["MatMul", "Reshape", "Transpose", "Softmax"]


def test_import_from_path_and_bytes(tmp_path) -> None:
    m, feeds = CASES["conv_relu_add"]()
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    for source in (str(path), path, m.SerializeToString()):
        graph = kg.import_onnx(source)
        assert [v.name for v in graph.inputs] == ["x"] and list(graph.outputs) == ["y", "z"]


def test_symbolic_inputs_take_input_shapes() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [io("x", ("n", 3))], [io("y", ("n", 3))])
    with pytest.raises(kg.ModelError, match=r"'x' axis 0 is symbolic \('n'\); pass input_shapes"):
        kg.import_onnx(m)
    graph = kg.import_onnx(m, input_shapes={"x": (4, 3)})
    assert graph.inputs[0].shape == (4, 3) and graph.outputs["y"].shape == (4, 3)
    with pytest.raises(kg.ModelError, match=r"does not fit its declared shape \['n', 2\]|fit"):
        kg.import_onnx(m, input_shapes={"x": (4, 2)})
    with pytest.raises(kg.ModelError, match=r"names \['q'\], which are not inputs"):
        kg.import_onnx(m, input_shapes={"q": (1,)})


X, Y = io("x", (2, 3)), io("y", (2, 3))
X4 = io("x4", (1, 2, 4, 4))

# (case, model builder, error class, a pattern the message must match)
BAD: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("unknown op", lambda: model([helper.make_node("Relu", ["x"], ["a"], name="r"),
                                  helper.make_node("Hardmax", ["a"], ["y"], name="hm")],
                                 [X], [Y]),
     kg.UnsupportedOpError, r"node 'hm' \(Hardmax\): no kernelgen operator"),
    ("unsupported attribute value",
     lambda: model([helper.make_node("Resize", ["x4", "", "sc"], ["y"], name="rz",
                                     mode="cubic")], [X4], [io("y", (1, 2, 8, 8))],
                   [init("sc", [1, 1, 2, 2])]),
     kg.UnsupportedOpError, r"node 'rz' \(Resize\).*'mode'.*cubic"),
    ("value input from data",
     lambda: model([helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")],
                   [X, io("s", (2,), TensorProto.INT64)], [io("y", (3, 2))]),
     kg.UnsupportedOpError, r"node 'rs' \(Reshape\): input 1 \('shape', tensor 's'\) must be "
                            r"known at import"),
    ("dangling name", lambda: model([helper.make_node("Add", ["x", "nothing"], ["y"],
                                                      name="add1")], [X], [Y]),
     kg.ModelError, r"node 'add1' \(Add\): reads 'nothing', which no graph input"),
    ("cycle", lambda: model([helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                             helper.make_node("Relu", ["a"], ["b"], name="n2"),
                             helper.make_node("Relu", ["a"], ["y"], name="n3")], [X], [Y]),
     kg.ModelError, r"cycle: 'n1' \(Add\) -> 'n2' \(Relu\) -> 'n1'"),
    ("initializer shape", lambda: model([helper.make_node("Add", ["x", "w"], ["y"])],
                                        [X, io("w", (2, 3))], [Y], [init("w", randn(3, 3))]),
     kg.ModelError, r"initializer 'w' has shape \[3, 3\], but the graph input of that name "
                    r"declares \[2, 3\]"),
    ("output nothing produces", lambda: model([helper.make_node("Relu", ["x"], ["a"])], [X],
                                              [Y]),
     kg.ModelError, r"graph output 'y' is produced by no node"),
    ("checker", lambda: model([helper.make_node("Relu", ["x", "x"], ["y"], name="r2")], [X],
                              [Y]),
     kg.ModelError, r"node 'r2' \(Relu\): the model fails the ONNX checker"),
    ("unread output read", lambda: model(
        [helper.make_node("MaxPool", ["x4"], ["y", "idx"], name="mp", kernel_shape=[2, 2]),
         helper.make_node("Cast", ["idx"], ["z"], to=TensorProto.FLOAT)],
        [X4], [io("y", (1, 2, 3, 3)), io("z", (1, 2, 3, 3))]),
     kg.ModelError, r"node 'mp' \(MaxPool\): output 1 \('idx', Indices\) is read"),
    ("old opset", lambda: model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y], opset=5),
     kg.ModelError, r"opset 5 of the default domain is not supported"),
    ("not a model", lambda: b"not a model at all", kg.ModelError, r"is not an ONNX model"),
    ("missing file", lambda: "/nonexistent/model.onnx", kg.ModelError,
     r"cannot read the ONNX model"),
]


@pytest.mark.parametrize("case,make,error,pattern", BAD, ids=[c[0] for c in BAD])
def test_bad_models_name_the_fault(case: str, make: Callable[[], object],
                                   error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern) as info:
        kg.import_onnx(make())  # type: ignore[arg-type]
    assert isinstance(info.value, kg.ModelError)


def test_errors_carry_node_and_op_type() -> None:
    _, make, _, _ = BAD[0]
    with pytest.raises(kg.UnsupportedOpError) as info:
        kg.import_onnx(make())  # type: ignore[arg-type]
    assert (info.value.node, info.value.op_type) == ("hm", "Hardmax")
