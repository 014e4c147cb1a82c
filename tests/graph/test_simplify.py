"""Math-property rewriting: every rule, applied where it may be, gives the values of the
unrewritten graph (IR interpreter) on random inputs holding NaN, +Inf and -Inf, with NaN and Inf
in the same places; it is refused where its NaN/Inf or FLOPs condition fails; a whole ONNX model
rewritten agrees with onnxruntime; the rewriter reaches a fixpoint and leaves its input alone."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from onnx import helper
from onnx_graphs import init, io, model, onnxruntime_run, randn, rng

import kernelgen as kg
from kernelgen.graph import Graph, interpret_graph
from kernelgen.graph.simplify import RULES, Simplified, simplify
from kernelgen.ir.node import Value

F32 = np.float32


def _const(name: str, value: object) -> Value:
    return kg.constant(name, np.asarray(value, F32))


def _feeds(graph: Graph) -> dict[str, np.ndarray]:
    """Normal values with NaN, +Inf and -Inf planted in every input (where it has room)."""
    feeds = {}
    for v in graph.inputs:
        a = rng.standard_normal(v.shape).astype(F32)
        flat = a.reshape(-1)
        for k, special in enumerate((np.nan, np.inf, -np.inf)):
            if k * 5 < flat.size:
                flat[k * 5] = special
        feeds[v.name] = a
    return feeds


def _same_values(before: Graph, after: Graph, rtol: float = 1e-5) -> None:
    feeds = _feeds(before)
    want, got = interpret_graph(before, feeds), interpret_graph(after, feeds)
    assert list(want) == list(got)
    for name in want:
        w, g = want[name], got[name]
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{name}: NaN")
        np.testing.assert_array_equal(np.isinf(g) & (g > 0), np.isinf(w) & (w > 0),
                                      err_msg=f"{name}: +Inf")
        np.testing.assert_array_equal(np.isinf(g) & (g < 0), np.isinf(w) & (w < 0),
                                      err_msg=f"{name}: -Inf")
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6, err_msg=name)


def _check(build: Callable[[Value], Value], rule: str, shape: tuple[int, ...] = (2, 3, 4),
           ops_after: int | None = None) -> Simplified:
    x = kg.tensor("x", shape)
    graph = Graph.build([x], {"y": build(x)})
    result = simplify(graph, {rule: RULES[rule]})
    assert rule in result.counts(), (rule, str(graph))
    for a in result.applied:
        assert a.flops_after <= a.flops_before
    if ops_after is not None:
        assert len(result.graph.ops) == ops_after, str(result.graph)
    _same_values(graph, result.graph)
    return result


POSITIVE: dict[str, tuple[str, Callable[[Value], Value], int]] = {
    "identity": ("identity", lambda x: kg.relu(kg.dropout(kg.identity(x))), 1),
    "noop reshape": ("noop_reshape", lambda x: kg.exp(kg.reshape(x, [2, 3, 4])), 1),
    "identity transpose": ("noop_reshape", lambda x: kg.exp(kg.transpose(x, [0, 1, 2])), 1),
    "reshape chain": ("reshape_chain", lambda x: kg.exp(kg.flatten(kg.reshape(x, [6, 4]),
                                                                   axis=1)), 2),
    "reshape chain back": ("reshape_chain", lambda x: kg.exp(kg.reshape(kg.reshape(
        x, [24]), [2, 3, 4])), 1),
    "transpose chain": ("transpose_chain", lambda x: kg.exp(kg.transpose(kg.transpose(
        x, [1, 0, 2]), [2, 0, 1])), 2),
    "transpose inverse": ("transpose_chain", lambda x: kg.exp(kg.transpose(kg.transpose(
        x, [1, 2, 0]), [2, 0, 1])), 1),
    "mul one": ("neutral", lambda x: kg.exp(kg.mul(_const("one", np.ones(4)), x)), 1),
    "div one": ("neutral", lambda x: kg.exp(kg.div(x, _const("one", [1.0]))), 1),
    "add zero": ("neutral", lambda x: kg.exp(kg.add(x, _const("zero", np.zeros((3, 1))))), 1),
    "sub zero": ("neutral", lambda x: kg.exp(kg.sub(x, _const("zero", [0.0]))), 1),
    "double negation": ("double_negation", lambda x: kg.exp(kg.neg(kg.neg(x))), 1),
    "relu relu": ("idempotent", lambda x: kg.relu(kg.relu(x)), 1),
    "assoc mul": ("associate_constants", lambda x: kg.mul(_const("c2", [[2.0], [3.0], [-1.0]]),
                                                          kg.mul(x, _const("c1", [0.5] * 4))), 1),
    "assoc add": ("associate_constants", lambda x: kg.add(kg.add(_const("c1", [1.0]), x),
                                                          _const("c2", np.arange(4.0))), 1),
    "distribute": ("distribute", lambda x: _distribute(x, _const("a", np.arange(4.0) - 1)), 3),
}


def _distribute(x: Value, a: Value) -> Value:
    """a*x + exp(x)*a, one constant ``a`` read twice."""
    return kg.add(kg.mul(a, x), kg.mul(kg.exp(x), a))


@pytest.mark.parametrize("case", sorted(POSITIVE))
def test_rule_keeps_values(case: str) -> None:
    rule, build, ops_after = POSITIVE[case]
    _check(build, rule, ops_after=ops_after)


NEGATIVE: dict[str, tuple[str, Callable[[Value], Value]]] = {
    "mul by two": ("neutral", lambda x: kg.mul(x, _const("two", [2.0]))),
    "add zero broadcasts": ("neutral", lambda x: kg.add(x, _const("z", np.zeros((5, 1, 1, 1))))),
    "assoc overflow": ("associate_constants", lambda x: kg.mul(kg.mul(x, _const("c1", [1e30])),
                                                               _const("c2", [1e30]))),
    "assoc underflow": ("associate_constants", lambda x: kg.mul(kg.mul(x, _const("c1", [1e-30])),
                                                                _const("c2", [1e-30]))),
    "distribute variable": ("distribute", lambda x: kg.add(kg.mul(x, kg.exp(x)),
                                                           kg.mul(x, kg.neg(x)))),
}


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_rule_refused(case: str) -> None:
    rule, build = NEGATIVE[case]
    x = kg.tensor("x", (2, 3, 4))
    graph = Graph.build([x], {"y": build(x)})
    result = simplify(graph, {rule: RULES[rule]})
    assert result.applied == () and result.graph is graph


def test_distribute_refuses_an_infinite_constant() -> None:
    """a = [Inf, 1]: a*b + a*c at b = 0, c = 1 is NaN, a*(b+c) would be Inf."""
    a = _const("a", [np.inf, 1.0])
    x, y = kg.tensor("x", (2,)), kg.tensor("z", (2,))
    graph = Graph.build([x, y], {"out": kg.add(kg.mul(a, x), kg.mul(a, y))})
    assert simplify(graph, {"distribute": RULES["distribute"]}).applied == ()


def test_distribute_is_refused_when_it_adds_flops() -> None:
    """a*b and a*c are outputs too: the rewrite would keep both and turn the sum's one pass
    into two (m -> 2m)."""
    a = _const("a", [2.0] * 4)
    x = kg.tensor("x", (3, 4))
    ab, ac = kg.mul(a, x), kg.mul(kg.exp(x), a)
    graph = Graph.build([x], {"ab": ab, "ac": ac, "y": kg.add(ab, ac)})
    assert simplify(graph, {"distribute": RULES["distribute"]}).applied == ()
    # with one of them an output the FLOPs stay level (2m -> 2m), so the rewrite is kept
    graph = Graph.build([x], {"ab": ab, "y": kg.add(ab, ac)})
    result = simplify(graph, {"distribute": RULES["distribute"]})
    assert [(a.flops_before, a.flops_after) for a in result.applied] == [(24, 24)]
    _same_values(graph, result.graph)


def test_constant_fold() -> None:
    """A transposed weight is folded into a constant; a broadcast that would grow the data is
    not folded."""
    w = _const("w", rng.standard_normal((5, 4)))
    x = kg.tensor("x", (3, 4))
    y = kg.matmul(x, kg.transpose(w, [1, 0]))
    big = kg.expand(_const("s", [1.5]), [3, 5, 40])
    graph = Graph.build([x], {"y": y, "big": big})
    result = simplify(graph, {"constant_fold": RULES["constant_fold"]})
    assert result.counts() == {"constant_fold": 1}
    assert [op.kind for op in result.graph.ops] == ["MatMul", "Expand"]
    folded = result.graph.ops[0].inputs[1]
    np.testing.assert_array_equal(folded.value, np.asarray(w.value).T)  # type: ignore[attr-defined]
    _same_values(graph, result.graph)


def _conv_bn(var: np.ndarray, extra_output: bool = False) -> Graph:
    x = kg.tensor("x", (1, 3, 6, 5))
    c = kg.conv(x, _const("w", rng.standard_normal((4, 3, 3, 3)) * 0.3),
                _const("b", rng.standard_normal(4)), pads=[1, 1, 1, 1])
    bn = kg.batch_normalization(c, _const("g", rng.uniform(0.5, 1.5, 4)),
                                _const("beta", rng.standard_normal(4)),
                                _const("m", rng.standard_normal(4)), _const("v", var))
    outputs = {"y": kg.relu(bn), **({"c": c} if extra_output else {})}
    return Graph.build([x], outputs)


def test_fold_bn() -> None:
    graph = _conv_bn(rng.uniform(0.5, 1.5, 4).astype(F32))
    result = simplify(graph)
    assert result.counts() == {"fold_bn": 1}
    assert [op.kind for op in result.graph.ops] == ["Conv", "Relu"]
    _same_values(graph, result.graph, rtol=1e-4)
    # refused: a negative variance scales by NaN; the Conv's value is also an output
    assert simplify(_conv_bn(np.full(4, -1.0, F32))).applied == ()
    assert simplify(_conv_bn(rng.uniform(0.5, 1.5, 4).astype(F32), True)).applied == ()


def test_fixpoint_and_purity() -> None:
    """Rules feed each other across rounds; the input graph is left as it was."""
    x = kg.tensor("x", (2, 3, 4))
    c = _const("c", [3.0] * 4)
    y = kg.mul(kg.identity(kg.mul(kg.neg(kg.neg(x)), c)), _const("h", [0.5]))
    graph = Graph.build([x], {"y": kg.reshape(kg.flatten(y), [2, 3, 4])})
    before = str(graph)
    result = simplify(graph)
    assert str(graph) == before
    assert [op.kind for op in result.graph.ops] == ["Mul"]
    assert result.rounds >= 2 and simplify(result.graph).applied == ()
    _same_values(graph, result.graph)
    # x*2*0.5 is x*1, then x: an output that is the input itself
    half = Graph.build([x], {"y": kg.mul(kg.mul(x, _const("two", [2.0])), _const("h", [0.5]))})
    assert simplify(half).graph.outputs["y"] is x


def test_onnx_model_against_onnxruntime() -> None:
    """Conv -> BatchNormalization -> Identity -> Reshape (same shape) -> Dropout -> Mul by 1 ->
    Relu, imported, rewritten to Conv -> Relu, agrees with onnxruntime."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "bb", "m", "v"], ["bn"]),
             helper.make_node("Identity", ["bn"], ["i"]),
             helper.make_node("Reshape", ["i", "shape"], ["r"]),
             helper.make_node("Dropout", ["r"], ["d"]),
             helper.make_node("Mul", ["d", "one"], ["m1"]),
             helper.make_node("Relu", ["m1"], ["y"])]
    inits = [init("w", randn(4, 3, 3, 3, scale=0.3)), init("b", randn(4, scale=0.1)),
             init("g", rng.uniform(0.5, 1.5, 4)), init("bb", randn(4, scale=0.1)),
             init("m", randn(4, scale=0.1)), init("v", rng.uniform(0.5, 1.5, 4)),
             init("shape", [1, 4, 5, 6], np.int64), init("one", [1.0])]
    m = model(nodes, [io("x", (1, 3, 5, 6))], [io("y", (1, 4, 5, 6))], inits)
    graph = kg.import_onnx(m)
    result = simplify(graph)
    assert [op.kind for op in result.graph.ops] == ["Conv", "Relu"]
    feeds = {"x": randn(1, 3, 5, 6)}
    np.testing.assert_allclose(interpret_graph(result.graph, feeds)["y"],
                               onnxruntime_run(m, feeds)["y"], rtol=1e-4, atol=1e-5)


def test_fold_bn_into_gemm() -> None:
    x = kg.tensor("x", (3, 5))
    g = kg.gemm(x, _const("w", rng.standard_normal((5, 4))), _const("c", rng.standard_normal(4)))
    bn = kg.batch_normalization(g, _const("g", rng.uniform(0.5, 1.5, 4)),
                                _const("beta", rng.standard_normal(4)),
                                _const("m", rng.standard_normal(4)),
                                _const("v", rng.uniform(0.5, 1.5, 4)))
    graph = Graph.build([x], {"y": bn})
    result = simplify(graph)
    assert result.counts() == {"fold_bn": 1}
    assert [op.kind for op in result.graph.ops] == ["Gemm"]
    assert result.graph.outputs["y"].name.endswith("/fold_bn")
    _same_values(graph, result.graph, rtol=1e-4)
