"""AGO's intensive fusion in the DNNFusion planner (``graph/intensive.py``): in the BERT layer's
attention, the scores' block and the Softmax's block (and, where nothing outside reads the
weights, P V's) merge into one kernel only where it stages each score row once and a
measurement found it clearly faster, and so do a projection's block (bias and residual Add)
and the LayerNormalization over its rows; a stub stands for the measurement here, so that which
verdict merges what is fixed, and the merged plans run equal to onnxruntime. The planner's
own measurement (``tuning='measure-fusion'``) is exercised on a small layer at the end."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from conftest import require
from models.model_zoo import bert_layer
from onnx_graphs import onnxruntime_run

import kernelgen as kg
from kernelgen.fastrun import FastRunDB
from kernelgen.fusion import FusionVerdict
from kernelgen.graph.dnnfusion import plan_dnnfusion
from kernelgen.graph.report import fusion_report
from kernelgen.tune import MeasureFusion

SHAPES = {"x": (2, 13, 64), "mask": (2, 13)}
ATTENTION = frozenset({"probs"})  # the stub's pairs: those merging the Softmax's block


def _verdict(fused: bool, clear: bool = True) -> FusionVerdict:
    return FusionVerdict("opencl", fused, 1.0 if fused else 2.0, 2.0 if fused else 1.0, (),
                         clear=clear)


def _decide(fused: bool, clear: bool = True, asked: list | None = None,
            only: frozenset[str] | None = None):
    """A stub measurement: ``fused`` for every forced block (``only``: those holding one of
    these operators; the others unmeasured)."""
    def decide(block):
        if not block.forced:  # a yellow cell met while growing: left unmeasured, as planned
            return None
        if only is not None and not only & {op.name for op in block.ops}:
            return None
        if asked is not None:
            asked.append(tuple(op.name for op in block.ops))
        return _verdict(fused, clear)
    return decide


def _layer(probs_output: bool = True) -> Any:
    m = bert_layer()
    if not probs_output:
        del m.graph.output[1]
    return m


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    mask = np.ones((2, 13), np.int64)
    mask[1, 9:] = 0
    return {"x": rng.standard_normal((2, 13, 64)).astype(np.float32), "mask": mask}


def _block_of(blocks, name: str) -> tuple[str, ...]:
    return next(b.names for b in blocks if name in b.names)


def test_scores_and_softmax_merge_where_measured_faster() -> None:
    graph = kg.import_onnx(_layer(), SHAPES)
    plain = plan_dnnfusion(graph)
    asked: list = []
    merged = plan_dnnfusion(graph, decide=_decide(True, asked=asked, only=ATTENTION))
    assert len(merged) == len(plain) - 1
    assert _block_of(merged, "probs") == _block_of(plain, "qk") + ("probs",)
    # the weights are a model output, so P V cannot join (two output shapes): its stop says so
    assert _block_of(merged, "ctx_heads") == ("ctx_heads", "ctx_t")
    stop = next(s for b in merged for s in b.stops
                if (s.producer, s.consumer) == ("probs", "ctx_heads"))
    assert "cannot make one kernel of them" in stop.rule and "must share a shape" in stop.rule
    assert any("probs" in names for names in asked)
    report = fusion_report(graph, ("dnnfusion",), planned={"dnnfusion": merged})
    assert "red edge fused by force" in report.format()


def test_a_projection_and_its_layernorm_merge_where_measured_faster() -> None:
    """The output projection (bias, residual) and the FFN's down projection (bias, residual),
    each with the LayerNormalization over its rows: one kernel that stages each projected row
    once, its mean, variance and outputs reading it. The FFN's up projection stays apart
    from the first LayerNorm, whose output the second residual Add also reads."""
    graph = kg.import_onnx(_layer(), SHAPES)
    plain = plan_dnnfusion(graph)
    merged = plan_dnnfusion(graph, decide=_decide(True, only=frozenset({"h1", "y"})))
    assert len(merged) == len(plain) - 2
    assert _block_of(merged, "h1") == _block_of(plain, "o_mm") + ("h1",)
    assert _block_of(merged, "y") == _block_of(plain, "down_mm") + ("y",)
    assert _block_of(merged, "up_mm") == _block_of(plain, "up_mm")
    stop = next(s for b in plan_dnnfusion(graph, decide=_decide(True, only=ATTENTION))
                for s in b.stops if (s.producer, s.consumer) == ("res1", "h1"))
    assert "AGO's intensive fusion pays only where measured" in stop.rule


def _gemm_layernorm() -> Any:
    """LayerNorm(Gemm(x, Wᵀ, b) + r) over rows of 37, Gemm's weights transposed (transB)."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(a, n) for a, n in (
        ((rng.standard_normal((37, 19)) / 4).astype(np.float32), "w"),
        (rng.standard_normal(37).astype(np.float32), "b"),
        (rng.standard_normal(37).astype(np.float32), "g"),
        (rng.standard_normal(37).astype(np.float32), "beta"))]
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["proj"], name="proj", transB=1),
             helper.make_node("Add", ["proj", "r"], ["res"], name="res"),
             helper.make_node("LayerNormalization", ["res", "g", "beta"], ["y"], name="y",
                              axis=-1)]
    graph = helper.make_graph(nodes, "gemm_layernorm", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, (11, 19)),
        helper.make_tensor_value_info("r", TensorProto.FLOAT, (11, 37))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (11, 37))], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("backend", ["opencl", "neon"])
def test_a_gemm_and_its_layernorm_merge_and_run_equal_to_onnxruntime(backend: str) -> None:
    require(backend)
    m = _gemm_layernorm()
    planner = functools.partial(plan_dnnfusion, decide=_decide(True))
    session = kg.compile_model(m, backend=backend, fusion=planner)
    assert [b.names for b in session.blocks] == [("proj", "res", "y")]
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((11, 19)).astype(np.float32),
             "r": rng.standard_normal((11, 37)).astype(np.float32)}
    (got,), (want,) = session.run(None, feeds), onnxruntime_run(m, feeds).values()
    assert float(np.abs(got - want).max()) <= 1e-4 * float(np.abs(want).max())


@pytest.mark.parametrize("verdict, why", [
    (None, "nothing was measured"),
    (_verdict(False), "split wins"),
    (_verdict(True, clear=False), "within the runs' spread"),
], ids=["unmeasured", "split-faster", "unclear"])
def test_the_pair_stays_apart_without_a_clear_win(verdict, why: str) -> None:
    graph = kg.import_onnx(_layer(), SHAPES)
    blocks = plan_dnnfusion(graph, decide=lambda block: verdict if block.forced else None)
    assert [b.names for b in blocks] == [b.names for b in plan_dnnfusion(graph)]
    stop = next(s for b in blocks for s in b.stops
                if (s.producer, s.consumer) == ("masked", "probs"))
    assert "AGO's intensive fusion" in stop.rule and why in stop.rule


def test_the_whole_attention_merges_where_the_weights_stay_inside() -> None:
    graph = kg.import_onnx(_layer(probs_output=False), SHAPES)
    plain = plan_dnnfusion(graph)
    merged = plan_dnnfusion(graph, decide=_decide(True, only=ATTENTION))
    assert len(merged) == len(plain) - 2
    assert _block_of(merged, "ctx_heads") == \
        _block_of(plain, "qk") + ("probs", "ctx_heads", "ctx_t")
    # the projections' MatMuls stay apart from the contractions they feed: no staged row
    assert _block_of(merged, "v_mm") == _block_of(plain, "v_mm")


@pytest.mark.parametrize("backend, probs_output", [
    ("opencl", True), ("opencl", False), ("neon", True)],
    ids=["opencl-probs-output", "opencl-probs-inside", "neon-probs-output"])
def test_merged_plans_run_equal_to_onnxruntime(backend: str, probs_output: bool) -> None:
    """Every pair merged: the attention's, and both projections with their LayerNorms."""
    require(backend)
    m = _layer(probs_output)
    planner = functools.partial(plan_dnnfusion, decide=_decide(True))
    session = kg.compile_model(m, backend=backend, fusion=planner, input_shapes=SHAPES)
    assert len(session.blocks) == len(plan_dnnfusion(kg.import_onnx(m, SHAPES))) - \
        (1 if probs_output else 2) - 2
    assert {"o_mm", "h1"} <= set(_block_of(session.blocks, "h1"))
    assert {"down_mm", "y"} <= set(_block_of(session.blocks, "y"))
    feeds = _feeds()
    want = onnxruntime_run(m, feeds)
    for got, (name, ref) in zip(session.run(None, feeds), want.items()):
        scale = max(float(np.abs(ref).max()), 1e-6)
        assert float(np.abs(got - ref).max()) <= 1e-4 * scale, name


def test_the_planner_measures_a_pair_and_stores_its_verdict(tmp_path) -> None:
    """``tuning='measure-fusion'``: the pair is timed fused against split once, stored, and
    read back by the next plan (the same blocks, nothing measured again)."""
    require("opencl")
    db = FastRunDB(tmp_path / "fastrun.sqlite")
    m = bert_layer(batch=1, seq=5, hidden=16, heads=2)
    shapes = {"x": (1, 5, 16), "mask": (1, 5)}
    first = kg.compile_model(m, backend="opencl", fusion="dnnfusion", input_shapes=shapes,
                             tuning=MeasureFusion(db))
    stop_or_note = [s.rule for b in first.blocks for s in b.stops
                    if (s.producer, s.consumer) == ("masked", "probs")] + \
        [b.note for b in first.blocks if "probs" in b.names]
    assert any("AGO's intensive fusion" in text and "measured" in text for text in stop_or_note)
    entries = len(db)
    again = kg.compile_model(m, backend="opencl", fusion="dnnfusion", input_shapes=shapes,
                             tuning=MeasureFusion(db))
    assert len(db) == entries
    assert [b.names for b in again.blocks] == [b.names for b in first.blocks]
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 5, 16)).astype(np.float32),
             "mask": np.array([[1, 1, 1, 0, 1]], np.int64)}
    want = onnxruntime_run(m, feeds)
    for got, ref in zip(again.run(None, feeds), want.values()):
        assert float(np.abs(got - ref).max()) <= 1e-4 * max(float(np.abs(ref).max()), 1e-6)
