"""Whole models through ``kernelgen.compile_model`` on OpenCL against onnxruntime: the
BERT-style encoder layer and the MobileNetV2 stack of ``tests/models/model_zoo.py`` under every
planner (and on NEON C under DNNFusion's), and two of onnx's light models (random weights) under
DNNFusion's on both. Each model is
compiled once per module (building kernels is what costs: about a minute per light model on
PoCL), and the planners' small graphs are checked here too. Behind the ``models_full`` marker,
all nine light models on both backends, each through the Python API, ONNX's backend interface
and ``kernelgen run``.

Tolerances: outputs are compared relative to their largest magnitude (float32 kernels summing
in a different order from onnxruntime's): 1e-4 for the layers, 1e-4 for the light models.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import require
from models.model_zoo import LIGHT_MODELS, bert_layer, light, mobilenet_v2
from onnx_graphs import CASES, onnxruntime_run

import kernelgen as kg
from kernelgen.cli.main import main as cli_main
from kernelgen.graph import onnx_backend
from kernelgen.mapping_types import MappingType

PLANNERS = ("none", "tvm", "dnnfusion")
rng = np.random.default_rng(5)


def _bert() -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    mask = np.ones((2, 13), np.int64)
    mask[1, 9:] = 0
    feeds = {"x": rng.standard_normal((2, 13, 64)).astype(np.float32), "mask": mask}
    return bert_layer(), feeds, {"input_shapes": {"x": (2, 13, 64), "mask": (2, 13)}}


def _mobilenet() -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    return mobilenet_v2(), {"image": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}, {}


def _light(name: str) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    m = light(name)
    weights = {i.name for i in m.graph.initializer}
    x = next(i for i in m.graph.input if i.name not in weights)  # IR 3 lists weights as inputs
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    return m, {x.name: rng.standard_normal(shape).astype(np.float32)}, {}


MODELS = {"bert_layer": _bert, "mobilenet_v2": _mobilenet}
LIGHT = ("squeezenet", "shufflenet")


def _check(session: kg.Session, m: Any, feeds: dict[str, np.ndarray], rtol: float,
           want: dict[str, np.ndarray] | None = None) -> None:
    """``session``'s outputs against onnxruntime's (``want``, when already computed)."""
    want = onnxruntime_run(m, feeds) if want is None else want
    assert [o.name for o in session.get_outputs()] == list(want)
    _agree(session.run(None, feeds), want, rtol)


def _agree(got: list[np.ndarray], want: dict[str, np.ndarray], rtol: float) -> None:
    """Each output within ``rtol`` of the largest magnitude of onnxruntime's."""
    assert len(got) == len(want)
    for array, (name, ref) in zip(got, want.items()):
        assert array.shape == ref.shape, name
        scale = max(float(np.abs(ref).max()), 1e-6)
        err = float(np.abs(array.astype(np.float64) - ref).max())
        assert err <= rtol * scale, f"{name}: max error {err:.3g} against magnitude {scale:.3g}"


@pytest.fixture(scope="module")
def opencl() -> str:
    require("opencl")
    return "opencl"


@pytest.fixture(scope="module", params=[(m, p) for m in MODELS for p in PLANNERS],
                ids=lambda c: f"{c[0]}-{c[1]}")
def layer(request: pytest.FixtureRequest, opencl: str) -> tuple[kg.Session, Any, dict]:
    name, fusion = request.param
    m, feeds, kwargs = MODELS[name]()
    return kg.compile_model(m, backend=opencl, fusion=fusion, **kwargs), m, feeds


def test_layer_agrees_with_onnxruntime(layer: tuple[kg.Session, Any, dict]) -> None:
    session, m, feeds = layer
    _check(session, m, feeds, rtol=1e-4)


def test_fusion_cuts_launches_and_memory(layer: tuple[kg.Session, Any, dict]) -> None:
    """Fused plans launch fewer kernels and hold fewer intermediate bytes than one op each."""
    session, _, _ = layer
    ops = len(session.graph.ops)
    mem = session.plan.memory()
    assert mem["intermediates_peak"] <= mem["intermediates_total"]
    assert mem["intermediates_live_peak"] <= mem["intermediates_peak"]
    if session.fusion == "none":
        assert len(session.plan.launches) == ops
    else:
        assert len(session.plan.launches) < ops / 2
        assert session.fusion in session.report()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_layer_on_neon_agrees_with_onnxruntime(name: str) -> None:
    """The layers again as NEON C (SIMDe on x86), under DNNFusion's plan with the rewrites."""
    require("neon")
    m, feeds, kwargs = MODELS[name]()
    session = kg.compile_model(m, backend="neon", fusion="dnnfusion", rewrite=True, **kwargs)
    _check(session, m, feeds, rtol=1e-4)


@pytest.fixture(scope="module", params=[(m, d) for m in LIGHT for d in ("opencl", "neon")],
                ids=lambda c: f"{c[0]}-{c[1]}")
def light_session(request: pytest.FixtureRequest) -> tuple[kg.Session, Any, dict]:
    name, device = request.param
    require(device)
    m, feeds, _ = _light(name)
    return kg.compile_model(m, backend=device, fusion="dnnfusion"), m, feeds


def test_light_model_agrees_with_onnxruntime(light_session: tuple[kg.Session, Any, dict]
                                             ) -> None:
    session, m, feeds = light_session
    _check(session, m, feeds, rtol=1e-4)


@pytest.mark.models_full
@pytest.mark.skipif(not os.environ.get("KERNELGEN_MODELS_FULL"),
                    reason="every light model (about 15 minutes): set KERNELGEN_MODELS_FULL=1")
@pytest.mark.parametrize("device", ["opencl", "neon"])
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_every_light_model(name: str, device: str, tmp_path: Path,
                           capsys: pytest.CaptureFixture) -> None:
    """All nine of onnx's light models (random weights) under DNNFusion's plan, against
    onnxruntime, through the Python API, ONNX's backend interface and ``kernelgen run``:
    ``KERNELGEN_MODELS_FULL=1 .venv/bin/pytest -m models_full tests/graph/test_models.py``."""
    require(device)
    m, feeds, _ = _light(name)
    want = onnxruntime_run(m, feeds)
    _check(kg.compile_model(m, backend=device, fusion="dnnfusion"), m, feeds, 1e-4, want)
    rep = onnx_backend.prepare(m, "CPU", backend=device, fusion="dnnfusion")
    _agree(list(rep.run(list(feeds.values()))), want, rtol=1e-4)
    scale = max(float(np.abs(ref).max()) for ref in want.values())
    path, npz = tmp_path / f"{name}.onnx", tmp_path / "inputs.npz"
    onnx.save(m, str(path))
    np.savez(npz, **feeds)
    capsys.readouterr()
    assert cli_main(["run", str(path), "--backend", device, "--inputs", str(npz), "--repeat",
                     "1", "--schedule", "sequential", "--atol", str(1e-4 * scale)]) == 0
    assert capsys.readouterr().out.count("(ok)") == len(want)


@pytest.mark.parametrize("fusion", ["tvm", "dnnfusion"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_planners_on_small_graphs(opencl: str, case: str, fusion: str) -> None:
    m, feeds = CASES[case]()
    session = kg.compile_model(m, backend=opencl, fusion=fusion)
    _check(session, m, feeds, rtol=1e-5)
    assert len(session.blocks) <= len(session.graph.ops)


def test_dnnfusion_fuses_conv_with_its_epilogue() -> None:
    """Conv -> Relu -> Add -> Sigmoid is one block (green edges), with both outputs written."""
    m, _ = CASES["conv_relu_add"]()
    graph = kg.import_onnx(m)
    (block,) = kg.graph.plan_dnnfusion(graph)
    assert [op.kind for op in block.ops] == ["Conv", "Relu", "Add", "Sigmoid"]


@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_dnnfusion_keeps_sibling_contractions_apart(name: str) -> None:
    """SqueezeNet's expand convolutions meet in a Concat, ResNet's branches in an Add; no
    edge joins the two convolutions, but one block holding both lost their templates (the
    planner gave Inception v1 such blocks and it ran 100x slower). At most one Many-to-Many
    operator per block, and the refusal is reported."""
    graph = kg.import_onnx(light(name))
    blocks = kg.graph.plan_dnnfusion(graph)
    for block in blocks:
        heavy = [op.kind for op in block.ops if op.mapping_type is MappingType.MANY_TO_MANY]
        assert len(heavy) <= 1, (block.note, heavy)
    # SqueezeNet's Concats are assembled in place, so no block holds one with a convolution
    rule = {"squeezenet": "assembled in place", "resnet50": "both Many-to-Many"}[name]
    assert any(rule in stop.rule for block in blocks for stop in block.stops)


def _branches(batch: int, size: int = 5) -> tuple[Any, list[Any], dict[str, np.ndarray],
                                                 np.ndarray]:
    """Two convolutions and an elementwise branch of one input, joined by a Concat over
    channels (6 + 6 + 8 channels of size x size), then Tanh."""
    from kernelgen.graph import Graph

    r = np.random.default_rng(5)
    w1, w2 = (r.standard_normal((6, 8, 3, 3)).astype(np.float32) * 0.3 for _ in range(2))
    x = kg.tensor("x", (batch, 8, size, size))
    a = kg.relu(kg.conv(x, kg.constant("w1", w1), pads=[1, 1, 1, 1]))
    b = kg.sigmoid(kg.conv(x, kg.constant("w2", w2), pads=[1, 1, 1, 1]))
    y = kg.tanh(kg.concat([a, b, kg.neg(x)], axis=1))
    graph = Graph.build([x], [y], "branches")
    xv = r.standard_normal(x.shape).astype(np.float32)

    def conv(w: np.ndarray) -> np.ndarray:
        p = np.pad(xv, ((0, 0), (0, 0), (1, 1), (1, 1)))
        return sum(np.einsum("oc,nchw->nohw", w[:, :, i, j], p[:, :, i:i + size, j:j + size])
                   for i in range(3) for j in range(3))
    want = np.tanh(np.concatenate([np.maximum(conv(w1), 0), 1 / (1 + np.exp(-conv(w2))),
                                   -xv], axis=1))
    return graph, [a, b], {"x": xv}, want


@pytest.mark.parametrize("fusion", ["tvm", "dnnfusion"])
def test_no_contraction_fused_into_a_larger_output(fusion: str) -> None:
    """A Conv fused into the Concat after it made its template tile the Concat's whole output,
    mostly guarded zeros of the other branches' channels: 141 of Inception v1's 234 ms on
    OpenCL. At batch 2 the Concat's parts are not contiguous (it is not assembled in place),
    and neither planner puts a contraction in a block whose output is larger than its own;
    the refusal is reported."""
    from kernelgen.graph.blocks import fusible

    graph, _, _, _ = _branches(batch=2)
    blocks = kg.graph.planners.PLANNERS[fusion](graph)
    assert not any(block.view for block in blocks)
    for block in blocks:
        size = np.prod(fusible(graph, block.ops, force=True).shape)
        assert all(op.numel == size for op in block.ops if op.kind == "Conv"), block.note
    rule = {"tvm": "is injective", "dnnfusion": "larger output"}[fusion]
    assert any(rule in stop.rule for block in blocks for stop in block.stops)


@pytest.mark.parametrize("size", [5, 8])
@pytest.mark.parametrize("fusion", ["tvm", "dnnfusion"])
@pytest.mark.parametrize("backend", ["opencl", "neon"])
def test_concat_assembled_in_place(backend: str, fusion: str, size: int) -> None:
    """At batch 1 a channel Concat's parts are contiguous: the planners leave it a view block
    and each branch's kernel writes its part of the output (a view at its offset, where the
    device can address it: at 5x5 the parts start at 150 and 300 floats, off OpenCL's
    128-byte alignment, so there the Concat is a copy kernel). The results equal NumPy's."""
    require(backend)
    from kernelgen.backends import get
    from kernelgen.graph.executor import compile_plan

    graph, branches, feeds, want = _branches(batch=1, size=size)
    blocks = kg.graph.planners.PLANNERS[fusion](graph)
    (concat,) = [b for b in blocks if b.view]
    assert [op.kind for op in concat.ops] == ["Concat"]
    assert any("assembled in place" in stop.rule for stop in concat.stops)
    compiled = compile_plan(graph, blocks, backend)
    views = {b.name: b.offset for b in compiled.plan.buffers if b.view_of is not None}
    aligned = get(backend).view_alignment()
    part = 6 * size * size
    in_place = part * 4 % aligned == 0
    assert views == ({branches[0].name: 0, branches[1].name: part,
                      concat.ops[0].inputs[2].name: 2 * part} if in_place else {})
    assert len(compiled.plan.launches) == len(blocks) - (1 if in_place else 0)
    (got,) = compiled.run(feeds).values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dnnfusion_keeps_expensive_operand_chains_out_of_contractions() -> None:
    """BERT's GELU (Div, Erf, Add, Mul, Mul) feeds the second feed-forward MatMul; fused in as
    its operand chain it was recomputed for every tile of output columns (the layer ran 4x
    slower than TVM's plan). The whole GELU is now the first MatMul's epilogue: its two Muls
    read the bias Add and the Add after the Erf, elementwise operators between the MatMul and
    them, and the Mul reading both waits until the Add after the Erf has joined. A chain with
    no contraction before it (a graph input's) is refused by its cost."""
    graph = kg.import_onnx(bert_layer(), {"x": (2, 13, 64), "mask": (2, 13)})
    blocks = kg.graph.plan_dnnfusion(graph)
    by_name = {op.name: [o.name for o in b.ops] for b in blocks for op in b.ops}
    assert by_name["up_mm"] == ["up_mm", "up", "up_scaled", "up_erf", "erf1", "gelu_x", "gelu"]
    assert by_name["down_mm"] == ["down_mm", "down", "res2"]
    assert any(stop.producer == "gelu" and stop.consumer == "down_mm"
               and "goes to its producer up_mm (MatMul) as its epilogue" in stop.rule
               for block in blocks for stop in block.stops)

    x = kg.tensor("x", (4, 8))
    gelu = kg.mul(kg.erf(x), x)
    y = kg.matmul(gelu, kg.constant("w", np.ones((8, 5), np.float32)))
    from kernelgen.graph import Graph
    split = kg.graph.plan_dnnfusion(Graph.build([x], [y], "input_chain"))
    assert [[op.kind for op in b.ops] for b in split] == [["Erf", "Mul"], ["MatMul"]]
    assert any("would recompute its fused operand chain" in stop.rule
               for block in split for stop in block.stops)


@pytest.mark.parametrize("out_channels,fused", [(128, False), (8, True)])
def test_dnnfusion_weighs_a_prologue_by_its_recomputation(out_channels: int,
                                                          fused: bool) -> None:
    """DenseNet's pre-activation: a scale, shift and ReLU (3 operations an element) before a
    1x1 conv. Its template computes the chain again for every tile of output channels: 16
    tiles of 128 channels cost 48 operations an element, more than ``PROLOGUE_LIMIT``
    (DenseNet-121 ran 1.3x slower than TVM's plan so); one tile of 8 costs 3 and fuses."""
    from kernelgen.graph import Graph
    x = kg.tensor("x", (1, 16, 5, 7))
    scale = kg.constant("s", np.full((16, 1, 1), 0.5, np.float32))
    shift = kg.constant("t", np.full((16, 1, 1), 0.1, np.float32))
    act = kg.relu(kg.add(kg.mul(x, scale), shift))
    y = kg.conv(act, kg.constant("w", np.ones((out_channels, 16, 1, 1), np.float32)))
    blocks = kg.graph.plan_dnnfusion(Graph.build([x], [y], "preactivation"))
    assert len(blocks) == (1 if fused else 2)
    if not fused:
        assert any("once for each of its 16 tile(s) along the other operand's axis" in stop.rule
                   for block in blocks for stop in block.stops)


def test_bert_head_splits_join_their_contractions() -> None:
    """V's split into heads, ``(s, h*d) -> (h, s, d)`` with d = 16, keeps the projection's
    innermost runs (``keeps_runs``): it joins the projection's block without a measurement, as
    does the context product's transpose back. The scores reduce Q's and Kᵀ's heads along d,
    their stride-1 axis (``reads_runs_along_reduction``): both transposes join the scores'
    block as its operands, Q's before the projection's epilogue can take it."""
    graph = kg.import_onnx(bert_layer(), {"x": (2, 13, 64), "mask": (2, 13)})
    by_name = {op.name: [o.name for o in b.ops] for b in kg.graph.plan_dnnfusion(graph)
               for op in b.ops}
    assert by_name["v_mm"] == ["v_mm", "v_proj", "v_split", "v_heads"]
    assert by_name["ctx_heads"] == ["ctx_heads", "ctx_t"]
    assert by_name["q_mm"] == ["q_mm", "q_proj", "q_split"]
    assert by_name["qk"][:3] == ["q_heads", "k_heads", "qk"]


def test_rewritten_bert_merges_its_projections(opencl: str) -> None:
    """Q's, K's and V's projections as one MatMul (``merge_projections``), whose head split
    joins it; each head range joins the contraction that reads it, Kᵀ's Transpose of a Slice
    too (``_reads_runs`` composes the chain): two kernels fewer than the layer as imported."""
    m, feeds, kwargs = _bert()
    session = kg.compile_model(m, backend=opencl, fusion="dnnfusion", rewrite=True, **kwargs)
    _check(session, m, feeds, rtol=1e-4)
    assert [a.op for a in session.rewrites if a.rule == "merge_projections"] == \
        ["q_mm+k_mm+v_mm"]
    plain = kg.graph.plan_dnnfusion(kg.import_onnx(m, kwargs["input_shapes"]))
    assert len(session.blocks) == len(plain) - 2
    kinds = [[op.kind for op in b.ops] for b in session.blocks]
    assert ["MatMul", "Add", "Reshape", "Transpose"] in kinds
    assert any(k[:4] == ["Slice", "Slice", "Transpose", "MatMul"] and "Softmax" not in k
               for k in kinds), kinds


def test_dnnfusion_gives_an_elementwise_chain_to_the_contraction_before_it() -> None:
    """Inception's ReLUs between two convolutions (and between a convolution and a max-pool)
    went into the consumer's prologue, recomputed in every Winograd tile or window that
    reads them; the plan ran 23 % slower than TVM's, which makes them the producer's
    epilogue. Now each ReLU ends its convolution's block, and the refusal says why; a
    convolution whose output is also read elsewhere keeps no epilogue it cannot own."""
    graph = kg.import_onnx(light("inception_v1"))
    blocks = kg.graph.plan_dnnfusion(graph)
    for block in blocks:
        kinds = [op.kind for op in block.ops]
        if "Conv" in kinds or "MaxPool" in kinds:
            assert kinds[0] != "Relu", kinds
    assert any("as its epilogue, computed once an element" in stop.rule
               for block in blocks for stop in block.stops)

    x = kg.tensor("x", (1, 4, 6, 6))
    w = kg.constant("w", np.ones((4, 4, 3, 3), np.float32))
    c = kg.conv(x, w, pads=[1, 1, 1, 1])
    r = kg.relu(c)
    y = kg.conv(r, w, pads=[1, 1, 1, 1])
    from kernelgen.graph import Graph
    shared = kg.graph.plan_dnnfusion(Graph.build([x], [y, kg.sigmoid(c)], "shared"))
    assert ["Relu", "Conv"] in [[op.kind for op in b.ops] for b in shared]


def test_dnnfusion_reports_red_edges() -> None:
    """Two contractions never share a block, and the note names the rule that kept them
    apart."""
    m, _ = _mobilenet()[:2]
    graph = kg.import_onnx(m)
    blocks = kg.graph.plan_dnnfusion(graph)
    for block in blocks:
        assert sum(op.kind == "Conv" for op in block.ops) <= 1
    assert any("red" in block.note for block in blocks)


def test_rewritten_mobilenet_agrees_with_onnxruntime(opencl: str) -> None:
    """Every BatchNormalization folded into its Conv (13 of them), then DNNFusion's plan: the
    same outputs, fewer operators and no more kernels than without rewriting."""
    m, feeds, _ = _mobilenet()
    session = kg.compile_model(m, backend=opencl, fusion="dnnfusion", rewrite=True)
    _check(session, m, feeds, rtol=1e-4)
    assert {a.rule for a in session.rewrites} == {"fold_bn"} and len(session.rewrites) == 13
    assert not any(op.kind == "BatchNormalization" for op in session.graph.ops)
    plain = kg.graph.plan_dnnfusion(kg.import_onnx(m))
    assert len(session.blocks) <= len(plain)
    assert "rewrites: fold_bn x13" in session.report()
