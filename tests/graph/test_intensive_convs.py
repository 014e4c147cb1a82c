"""AGO's Conv -> 1x1 Conv in the DNNFusion planner (``graph/intensive.py``): a block around a
convolution and the block of the pointwise convolution reading it merge into one contraction
kernel that computes the convolution inside its operand, only where the measured kernel's tiles
compute each of its elements once and the measurement found it clearly faster. A stub stands
for the measurement in most tests, so that which verdict merges what is fixed; the merged plans
run equal to onnxruntime, and the planner's own measurement is exercised at the end."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import require
from models.model_zoo import mobilenet_v2
from onnx import helper
from onnx_graphs import init, io, model, onnxruntime_run, randn

import kernelgen as kg
from kernelgen.fastrun import FastRunDB, stored_verdict
from kernelgen.fusion import FusionVerdict
from kernelgen.graph.blocks import fusible
from kernelgen.graph.dnnfusion import plan_dnnfusion
from kernelgen.tune import MeasureFusion


def _conv_pointwise(out: int = 6, second_kernel: int = 1, stride: int = 1):
    """x (1, 8, 9, 11) -> Conv 3x3 -> Relu -> Conv ``second_kernel`` (``out`` channels) ->
    Sigmoid."""
    pad = second_kernel // 2
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3], name="c1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[pad] * 4,
                              kernel_shape=[second_kernel] * 2, strides=[stride] * 2,
                              name="c2"),
             helper.make_node("Sigmoid", ["c2"], ["y"], name="y")]
    side = -(-11 // stride), -(-9 // stride)
    inits = [init("w1", randn(12, 8, 3, 3, scale=0.3)), init("b1", randn(12, scale=0.1)),
             init("w2", randn(out, 12, second_kernel, second_kernel, scale=0.3)),
             init("b2", randn(out, scale=0.1))]
    return model(nodes, [io("x", (1, 8, 9, 11))], [io("y", (1, out, side[1], side[0]))],
                 inits)


def _verdict(fused: bool, clear: bool = True, redundancy: float = 1.0) -> FusionVerdict:
    return FusionVerdict("opencl", fused, 1.0 if fused else 2.0, 2.0 if fused else 1.0, (),
                         clear=clear, redundancy=redundancy)


def _decide(verdict: FusionVerdict | None, asked: list | None = None):
    def decide(block):
        if not block.forced:  # a yellow cell met while growing: unmeasured, as planned
            return None
        if asked is not None:
            asked.append(tuple(op.name for op in block.ops))
        return verdict
    return decide


def _block_of(blocks, name: str) -> tuple[str, ...]:
    return next(b.names for b in blocks if name in b.names)


def _stop(blocks, producer: str, consumer: str) -> str:
    return next(s.rule for b in blocks for s in b.stops
                if (s.producer, s.consumer) == (producer, consumer))


def test_a_conv_and_the_pointwise_conv_it_feeds_merge_where_measured_faster() -> None:
    graph = kg.import_onnx(_conv_pointwise())
    plain = plan_dnnfusion(graph)
    assert _block_of(plain, "c1") == ("c1", "r1")  # the red cell keeps them apart ...
    asked: list = []
    merged = plan_dnnfusion(graph, decide=_decide(_verdict(True), asked))
    assert asked == [("c1", "r1", "c2", "y")]  # ... until the measurement says one kernel
    assert [b.names for b in merged] == [("c1", "r1", "c2", "y")]
    assert "AGO's intensive fusion, measured" in merged[0].note
    assert not merged[0].stops


@pytest.mark.parametrize("verdict, why", [
    (None, "nothing was measured"),
    (_verdict(False), "split wins"),
    (_verdict(True, clear=False), "within the runs' spread"),
    (_verdict(True, redundancy=3.0), "element of the convolution 3 times"),
], ids=["unmeasured", "split-faster", "unclear", "computed-three-times"])
def test_the_pair_stays_apart_without_a_clear_win_computing_each_element_once(
        verdict: FusionVerdict | None, why: str) -> None:
    graph = kg.import_onnx(_conv_pointwise())
    blocks = plan_dnnfusion(graph, decide=_decide(verdict))
    assert [b.names for b in blocks] == [b.names for b in plan_dnnfusion(graph)]
    rule = _stop(blocks, "r1", "c2")
    assert "red" in rule and "AGO's intensive fusion" in rule and why in rule


@pytest.mark.parametrize("second_kernel, stride", [(3, 1), (1, 2)], ids=["3x3", "strided"])
def test_only_a_pointwise_consumer_is_tried(second_kernel: int, stride: int) -> None:
    """A 3x3 consumer reads each producer pixel from nine output pixels, a strided one skips
    pixels: neither is a contraction over channels alone, so neither pair is measured."""
    graph = kg.import_onnx(_conv_pointwise(second_kernel=second_kernel, stride=stride))
    asked: list = []
    blocks = plan_dnnfusion(graph, decide=_decide(_verdict(True), asked))
    assert asked == []
    assert _block_of(blocks, "c1") == ("c1", "r1")


@pytest.mark.parametrize("backend", ["opencl", "neon"])
def test_merged_mobilenet_blocks_run_equal_to_onnxruntime(backend: str) -> None:
    """Every depthwise conv -> projection pair of the zoo's MobileNetV2 merged (the stub says
    each wins): one kernel each, computing the depthwise conv inside the projection's tiles."""
    require(backend)
    m = mobilenet_v2(size=16)
    graph = kg.import_onnx(m)
    asked: list = []
    merged = plan_dnnfusion(graph, decide=_decide(_verdict(True), asked))
    pairs = [names for names in asked if names in [b.names for b in merged]]
    assert pairs and len(merged) == len(plan_dnnfusion(graph)) - len(pairs)
    # a merged pair feeding another 1x1 conv stays apart from it: its producer would hold a
    # producer of its own, computed again for every element of the one the tiles compute
    assert all(sum(op.kind == "Conv" for op in b.ops) <= 2 for b in merged)
    # and its stop says that the pair it would join merged first
    nested = [s.rule for b in merged for s in b.stops if "merged first" in s.rule]
    assert nested and all("not be a contraction" in rule for rule in nested)
    planner = functools.partial(plan_dnnfusion, decide=_decide(_verdict(True)))
    session = kg.compile_model(m, backend=backend, fusion=planner)
    feeds = {"image": np.random.default_rng(4).standard_normal((1, 3, 16, 16))
             .astype(np.float32)}
    want = onnxruntime_run(m, feeds)
    for got, ref in zip(session.run(None, feeds), want.values()):
        assert float(np.abs(got - ref).max()) <= 1e-4 * max(float(np.abs(ref).max()), 1e-6)


@pytest.mark.parametrize("out", [6, 100])
def test_the_planner_measures_a_pair_and_stores_how_often_it_computes_the_conv(
        tmp_path, out: int) -> None:
    """``tuning='measure-fusion'``: the merged kernel is timed against the two apart and its
    verdict stored with the tiles' redundancy, 1 on OpenCL: with 6 output channels one row
    tile spans them; with 100, each column tile's work-item computes its conv values once into
    a panel that its row tiles sweep."""
    require("opencl")
    db = FastRunDB(tmp_path / "fastrun.sqlite")
    m = _conv_pointwise(out)
    session = kg.compile_model(m, backend="opencl", fusion="dnnfusion",
                               tuning=MeasureFusion(db))
    graph = kg.import_onnx(m)
    verdict = stored_verdict(fusible(graph, graph.ops, force=True), "opencl", db)
    assert verdict is not None and verdict.redundancy == 1.0
    merged = len(session.blocks) == 1
    assert merged == (verdict.fused and verdict.clear)
    if not merged:
        assert "AGO's intensive fusion measured" in _stop(session.blocks, "r1", "c2")
    feeds = {"x": randn(1, 8, 9, 11)}
    (want,) = onnxruntime_run(m, feeds).values()
    (got,) = session.run(None, feeds)
    assert float(np.abs(got - want).max()) <= 1e-4 * max(float(np.abs(want).max()), 1e-6)
