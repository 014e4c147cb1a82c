"""softmax(Q K * scale + mask) written out by one kernel (attention's weights where a model
outputs them, as BERT's ``probs``): the score row is staged once per query
(``lower/staging.py: _stage_row_producer``), the softmax's max, its sum and every output
element read it, and the sum and the stores share one exp row. Before, each output element
recomputed the whole score row for the max and again for the sum. Equal to NumPy on every
backend on awkward shapes (one query and one key, primes, rows longer than two vectors with a
ragged end), with -inf and NaN where NumPy has them."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, require, run

import kernelgen as kg
from kernelgen.ir.expr import Reduce, walk
from kernelgen.lower import lower
from kernelgen.lower.staging import unstage

# (batch, queries, depth, keys); Triton, which cannot hold a row read at the element axis as a
# block, runs the inlined form (each element recomputes its row's scores: minutes in its
# interpreter on the long rows), so it takes the short ones
SHORT = [(1, 1, 1, 1), (1, 7, 13, 5), (2, 5, 8, 11)]
LONG = [(1, 37, 16, 129), (2, 3, 64, 40)]
CASES = [(b, s) for b in ("interp", "opencl", "neon", "triton")
         for s in (SHORT if b == "triton" else SHORT + LONG)]


def _scores(batch: int, m: int, d: int, n: int, log: bool = False, keys_transposed: bool = False
            ) -> tuple[list[kg.Value], list[kg.Op]]:
    q = kg.tensor("q", (batch, m, d))
    kt = kg.tensor("kt", (batch, n, d)) if keys_transposed else kg.tensor("k", (batch, d, n))
    k = kg.transpose(kt, [0, 2, 1]) if keys_transposed else kt
    scale, mask = kg.tensor("scale", (1,)), kg.tensor("mask", (m, n))
    s = kg.matmul(q, k)
    scaled = kg.mul(s, scale)
    masked = kg.add(scaled, mask)
    p = kg.log_softmax(masked, 2) if log else kg.softmax(masked, 2)
    ops = [s, scaled, masked, p]
    return [q, kt, scale, mask], [k, *ops] if keys_transposed else ops


def _feeds(batch: int, m: int, d: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 1000 + m * 100 + d * 10 + n)
    q = rng.standard_normal((batch, m, d)).astype(np.float32)
    k = rng.standard_normal((batch, d, n)).astype(np.float32)
    mask = np.where(rng.random((m, n)) < 0.2, -1e4, 0.0).astype(np.float32)
    if n > 2:
        mask[0, 1] = -np.inf  # weight 0
    return {"q": q, "k": k, "kt": np.ascontiguousarray(k.transpose(0, 2, 1)),
            "scale": np.array([d ** -0.5], np.float32), "mask": mask}


def _numpy(feeds: dict[str, np.ndarray], log: bool = False) -> np.ndarray:
    s = (feeds["q"].astype(np.float64) @ feeds["k"]) * feeds["scale"][0] + feeds["mask"]
    shifted = s - s.max(axis=2, keepdims=True)
    total = np.exp(shifted).sum(axis=2, keepdims=True)
    return shifted - np.log(total) if log else np.exp(shifted) / total


@pytest.mark.parametrize("backend, shape", CASES,
                         ids=[f"{b}-{'x'.join(map(str, s))}" for b, s in CASES])
def test_softmax_of_scores_equals_numpy(backend: str, shape) -> None:
    if backend != "interp":
        require(backend)
    _, ops = _scores(*shape)
    fused = kg.fuse(*ops, force=True)
    feeds = _feeds(*shape)
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs), tuning="none")
    assert_close(got, _numpy(feeds), "float32", scale=10)


def test_log_softmax_of_transposed_keys_equals_numpy(backend: str) -> None:
    shape = (1, 7, 13, 5) if backend == "triton" else (2, 9, 32, 40)
    _, ops = _scores(*shape, log=True, keys_transposed=True)
    fused = kg.fuse(*ops, force=True)
    feeds = _feeds(*shape)
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs), tuning="none")
    want = _numpy(feeds, log=True)
    finite = np.isfinite(want)  # -inf where the mask is -inf: equal, not close
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    assert_close(got[finite], want[finite], "float32", scale=10)


def test_nan_in_a_query_makes_its_row_nan(backend: str) -> None:
    _, ops = _scores(1, 5, 8, 11)
    fused = kg.fuse(*ops, force=True)
    feeds = _feeds(1, 5, 8, 11)
    feeds["q"][0, 2, 3] = np.nan
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs), tuning="none")
    assert np.isnan(got[0, 2]).all() and not np.isnan(np.delete(got, 2, axis=1)).any()
    assert_close(np.delete(got, 2, axis=1), np.delete(_numpy(feeds), 2, axis=1), "float32",
                 scale=10)


def test_the_score_row_is_staged_once_per_query() -> None:
    _, ops = _scores(2, 5, 8, 11)
    loop = lower(kg.fuse(*ops, force=True), "scores")
    scores, exps = loop.staged
    assert scores.buffer.shape == exps.buffer.shape == (11,)
    assert any(isinstance(n, Reduce) for n in walk(scores.value))  # the dot product
    # per element: a load of the exp row times the sum's reciprocal, no reduction but hoisted
    per_element = [n for st in loop.stores for n in walk(st.value)
                   if isinstance(n, Reduce) and n not in loop.hoisted]
    assert not per_element and loop.element_axes
    assert loop.flops() * 5 < unstage(loop).flops()


@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
def test_cpu_backends_run_it_as_rows(backend_name: str) -> None:
    require(backend_name)
    _, ops = _scores(1, 37, 16, 129)
    kernel = kg.fuse(*ops, force=True).emit(backend_name, tuning="none")
    assert kernel.metadata["schedule"] == "row"
    assert kernel.metadata["staged_rows"] == ["stage0", "stage1"]
    assert kernel.metadata["producer_redundancy"] == 1.0


def _attention_back_in_sequence_order(seq: int, heads: int, depth: int
                                      ) -> tuple[kg.FusedOp, dict[str, np.ndarray], np.ndarray]:
    """softmax(Q Kᵀ s) V for (heads, seq, depth) operands, K transposed in the kernel and
    the output transposed back to (seq, heads, depth), as BERT's are: the output's order puts
    the heads inside the queries."""
    rng = np.random.default_rng(seq * heads + depth)
    feeds = {name: rng.standard_normal((heads, seq, depth)).astype(np.float32)
             for name in ("q", "k", "v")}
    feeds["s"] = np.array([depth ** -0.5], np.float32)
    kt = kg.transpose(kg.tensor("k", feeds["k"].shape), [0, 2, 1])
    scores = kg.matmul(kg.tensor("q", feeds["q"].shape), kt)
    scaled = kg.mul(scores, kg.tensor("s", (1,)))
    p = kg.softmax(scaled, 2)
    o = kg.matmul(p, kg.tensor("v", feeds["v"].shape))
    fused = kg.fuse(kt, scores, scaled, p, o, kg.transpose(o, [1, 0, 2]), force=True)
    s = feeds["q"].astype(np.float64) @ feeds["k"].transpose(0, 2, 1) * feeds["s"][0]
    w = np.exp(s - s.max(axis=2, keepdims=True))
    want = ((w / w.sum(axis=2, keepdims=True)) @ feeds["v"]).transpose(1, 0, 2)
    return fused, feeds, want


@pytest.mark.parametrize("seq, heads, depth", [(16, 3, 8), (13, 2, 5), (1, 4, 3)])
def test_attention_written_back_in_sequence_order(backend: str, seq: int, heads: int,
                                                  depth: int) -> None:
    """The group axes are visited heads outside, queries inside (``_queries_innermost``), so
    a work-item's queries share one head's keys; the output keeps (seq, heads, depth)."""
    fused, feeds, want = _attention_back_in_sequence_order(seq, heads, depth)
    loop = lower(fused, "attention")
    assert [loop.domain[g][1] for g in loop.group] == ([heads, seq] if seq > 1 else [heads])
    (got,) = run(backend, fused, *(feeds[v.name] for v in fused.inputs), tuning="none")
    assert_close(got, want, "float32", scale=10)


@pytest.mark.parametrize("backend_name", ["opencl", "neon"])
def test_queries_of_one_head_per_work_item_for_sequence_order_outputs(backend_name: str
                                                                      ) -> None:
    require(backend_name)
    fused, feeds, want = _attention_back_in_sequence_order(64, 4, 16)
    kernel = fused.emit(backend_name, tuning="none")
    assert kernel.metadata["schedule"] == "row"
    if backend_name == "opencl":
        assert kernel.metadata["tunables"]["panel"]
    assert_close(kernel(*(feeds[v.name] for v in fused.inputs)), want, "float32", scale=10)
