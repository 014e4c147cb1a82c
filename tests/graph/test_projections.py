"""Sibling projections merged into one MatMul (``graph/projections.py``): the merged graph
gives the unmerged graph's values (IR interpreter, NaN and Inf in the input) for every head
permutation, with and without biases, at awkward sizes; siblings that do not share an input,
a head depth, or whose intermediate values are read elsewhere are left alone; a merged
projection compiles to one kernel that DNNFusion's planner joins with its head split."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import require

import kernelgen as kg
from kernelgen.graph import Graph, interpret_graph
from kernelgen.graph.projections import merge_projections
from kernelgen.graph.simplify import simplify
from kernelgen.ir.node import Value

rng = np.random.default_rng(11)


def _projection(x: Value, name: str, heads: int, depth: int, perm: list[int],
                bias: bool = True) -> Value:
    w = kg.constant(f"w{name}", rng.standard_normal((x.shape[-1], heads * depth))
                    .astype(np.float32))
    y = kg.matmul(x, w)
    if bias:
        y = kg.add(y, kg.constant(f"b{name}", rng.standard_normal(heads * depth)
                                  .astype(np.float32)))
    return kg.transpose(kg.reshape(y, [*x.shape[:-1], heads, depth]), perm)


def _same_values(before: Graph, after: Graph) -> None:
    feeds = {}
    for v in before.inputs:
        a = rng.standard_normal(v.shape).astype(np.float32)
        a.reshape(-1)[[0, 7]] = (np.nan, np.inf)  # a NaN row and an Inf row of x
        feeds[v.name] = a
    want, got = interpret_graph(before, feeds), interpret_graph(after, feeds)
    assert list(want) == list(got)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5,
                                   equal_nan=True, err_msg=name)


def _matmuls(graph: Graph) -> int:
    return sum(op.kind == "MatMul" for op in graph.ops)


@pytest.mark.parametrize("perms", [
    ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]),  # attention's Q, Kᵀ, V
    ([0, 2, 1, 3], [0, 1, 2, 3], [3, 1, 0, 2]),  # no head move, any permutation
])
def test_merged_projections_give_the_same_values(perms: tuple[list[int], ...]) -> None:
    x = kg.tensor("x", (2, 7, 11))
    heads = (3, 1, 2)
    outs = {f"y{k}": _projection(x, str(k), h, 5, p, bias=k != 1)
            for k, (h, p) in enumerate(zip(heads, perms))}
    graph = Graph.build([x], outs)
    merged, done = merge_projections(graph)
    assert [names for names, _ in done] == ["+".join(op.name for op in graph.ops
                                                     if op.kind == "MatMul")]
    assert done[0][1] == 2 * 2 * 7 * 11 * 5 * sum(heads)
    assert _matmuls(merged) == 1
    _same_values(graph, merged)


def test_a_projection_of_a_matrix_merges_too() -> None:
    """x of rank 2 (tokens, hidden): the heads go in front of the tokens."""
    x = kg.tensor("x", (13, 8))
    graph = Graph.build([x], [_projection(x, "q", 2, 4, [1, 0, 2]),
                              _projection(x, "k", 2, 4, [1, 2, 0])])
    merged, done = merge_projections(graph)
    assert len(done) == 1 and _matmuls(merged) == 1
    _same_values(graph, merged)


def test_gemm_projections_merge_too() -> None:
    """Projections of a matrix by Gemm (``torch.nn.Linear`` on 2-D input exports transB=1 and
    the bias as C), one without its bias, beside a MatMul; a Gemm with C and an Add after it
    too is left alone (adding its two biases first could round differently)."""
    x = kg.tensor("x", (9, 6))

    def gemm_heads(name: str, bias: bool, perm: list[int]) -> Value:
        w = kg.constant(f"w{name}", rng.standard_normal((8, 6)).astype(np.float32))
        c = [kg.constant(f"c{name}", rng.standard_normal(8).astype(np.float32))] if bias else []
        return kg.transpose(kg.reshape(kg.gemm(x, w, *c, transB=1), [9, 2, 4]), perm)
    graph = Graph.build([x], [gemm_heads("q", True, [1, 0, 2]), gemm_heads("k", False, [1, 2, 0]),
                              _projection(x, "v", 2, 4, [1, 0, 2])])
    merged, done = merge_projections(graph)
    assert len(done) == 1 and _matmuls(merged) == 1
    assert not any(op.kind == "Gemm" for op in merged.ops)
    _same_values(graph, merged)
    w = kg.constant("w", rng.standard_normal((6, 8)).astype(np.float32))
    both = kg.add(kg.gemm(x, w, kg.constant("c", np.ones(8, np.float32))),
                  kg.constant("b", np.ones(8, np.float32)))
    graph = Graph.build([x], [kg.transpose(kg.reshape(both, [9, 2, 4]), [1, 0, 2]),
                              _projection(x, "v", 2, 4, [1, 0, 2])])
    assert merge_projections(graph)[1] == []


def test_projections_that_cannot_merge_are_left_alone() -> None:
    x, z = kg.tensor("x", (1, 5, 8)), kg.tensor("z", (1, 5, 8))
    cases = {
        "different inputs": [_projection(x, "q", 2, 4, [0, 2, 1, 3]),
                             _projection(z, "k", 2, 4, [0, 2, 1, 3])],
        "different depths": [_projection(x, "q", 2, 4, [0, 2, 1, 3]),
                             _projection(x, "k", 4, 2, [0, 2, 1, 3])],
        "one projection": [_projection(x, "q", 2, 4, [0, 2, 1, 3])],
    }
    for why, outs in cases.items():
        inputs = [x, z] if why == "different inputs" else [x]
        graph = Graph.build(inputs, outs)
        assert merge_projections(graph) == (graph, []), why
    # a MatMul whose value is also read elsewhere (here: an output) stays as it is
    q = _projection(x, "q", 2, 4, [0, 2, 1, 3])
    mm = q.inputs[0].inputs[0].inputs[0]
    graph = Graph.build([x], [q, _projection(x, "k", 2, 4, [0, 2, 1, 3]), mm])
    assert merge_projections(graph)[1] == []
    # weights that are not constants
    w = kg.tensor("w", (8, 8))
    split = [kg.transpose(kg.reshape(kg.matmul(x, v), [1, 5, 2, 4]), [0, 2, 1, 3])
             for v in (w, w)]
    graph = Graph.build([x, w], split)
    assert merge_projections(graph)[1] == []


def test_simplify_merges_projections_after_its_rules() -> None:
    """The default rewrites run the pass (and their rules again); a rules table given alone
    does not."""
    x = kg.tensor("x", (1, 6, 8))
    graph = Graph.build([x], [_projection(x, name, 2, 4, [0, 2, 1, 3]) for name in "qkv"])
    result = simplify(graph)
    assert result.counts() == {"merge_projections": 1}
    assert _matmuls(result.graph) == 1
    assert simplify(graph, {}).applied == ()


@pytest.mark.parametrize("backend", ["opencl", "neon"])
def test_merged_projections_compile_to_one_kernel(backend: str) -> None:
    """Q, K and V (d = 16, 3 heads over 5 tokens) as one contraction whose head split joins
    it: one kernel writes every head; each of the three outputs matches NumPy."""
    require(backend)
    x = kg.tensor("x", (1, 5, 40))
    perms = ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3])
    graph = Graph.build([x], {n: _projection(x, n, 3, 16, p) for n, p in zip("qkv", perms)})
    session = kg.compile_model(graph, backend=backend, fusion="dnnfusion", rewrite=True)
    assert [a.rule for a in session.rewrites] == ["merge_projections"]
    kinds = [[op.kind for op in b.ops] for b in session.blocks]
    assert ["MatMul", "Add", "Reshape", "Transpose"] in kinds
    feeds = {"x": rng.standard_normal((1, 5, 40)).astype(np.float32)}
    want = interpret_graph(graph, feeds)
    for (name, ref), got in itertools.zip_longest(want.items(), session.run(None, feeds)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=name)
