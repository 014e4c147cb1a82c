"""The fusion report on small graphs, its counts checked against what the ONNX graph itself
says (node counts, edges, tensor sizes from ONNX shape inference) and against what each
planner is known to do there; nothing is compiled."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_graphs import CASES, init, io, model, randn

import kernelgen as kg
from kernelgen.graph import fusion_report
from kernelgen.graph.report import COMPUTE_INTENSIVE, onnxruntime_node_count


def _onnx_facts(m: onnx.ModelProto) -> dict:
    """Counts read from the ONNX graph alone: nodes, compute-intensive nodes, the edges between
    nodes, and the bytes of every node output that is not a graph output."""
    inferred = onnx.shape_inference.infer_shapes(m)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.output)}
    outputs = {o.name for o in m.graph.output}
    producer = {out: n for n in m.graph.node for out in n.output}
    edges = {(producer[i].output[0], n.output[0]) for n in m.graph.node for i in n.input
             if i in producer}
    inner = [n.output[0] for n in m.graph.node if n.output[0] not in outputs]
    return {"nodes": len(m.graph.node),
            "heavy": sum(n.op_type in COMPUTE_INTENSIVE for n in m.graph.node),
            "edges": edges, "inner": len(inner),
            "inner_bytes": sum(4 * int(np.prod(shapes[name])) for name in inner)}


def test_counts_match_the_onnx_graph() -> None:
    m, _ = CASES["conv_relu_add"]()
    facts = _onnx_facts(m)
    report = fusion_report(kg.import_onnx(m), model=m)
    assert report.layers.kernels == facts["nodes"] == 4
    assert report.layers.compute_intensive == facts["heavy"] == 1
    assert report.layers.memory_intensive == 3
    assert report.layers.intermediates == facts["inner"] == 2
    assert report.layers.intermediate_bytes == facts["inner_bytes"] == 2 * 4 * 4 * 7 * 5
    assert report.onnx_nodes == 4

    none = report["none"]
    assert none.counts.kernels == facts["nodes"]
    assert {(e.producer, e.consumer) for e in none.unfused} == facts["edges"]
    assert none.counts.intermediate_bytes == facts["inner_bytes"]
    assert all("'none' planner" in e.rule for e in none.unfused)

    # Conv -> Relu -> Add -> Sigmoid: green edges only, both outputs written by one kernel
    dnn = report["dnnfusion"]
    assert (dnn.counts.kernels, dnn.counts.compute_intensive, dnn.counts.memory_intensive,
            dnn.counts.intermediate_bytes, dnn.unfused) == (1, 1, 0, 0, ())
    (block,) = dnn.blocks
    assert [(op.kind, op.mapping_type) for op in block.ops][1:] == [
        ("Relu", "One-to-One"), ("Add", "One-to-One"), ("Sigmoid", "One-to-One")]
    assert block.writes == ("y", "z") and block.forced == ()

    # TVM fuses the Conv's epilogue but stops at the graph output 'y'
    tvm = report["tvm"]
    assert tvm.counts.kernels == 2 and tvm.counts.intermediate_bytes == 0
    (edge,) = tvm.unfused
    assert (edge.producer, edge.consumer, edge.bytes) == ("y", "z", 4 * 4 * 7 * 5)
    assert "graph output" in edge.rule


def test_every_unfused_edge_has_the_planners_rule() -> None:
    for make in CASES.values():
        m, _ = make()
        graph = kg.import_onnx(m)
        report = fusion_report(graph)
        edges = {(op.name, c.name) for op in graph.ops for c in graph.consumers(op)}
        for p in report.planners:
            assert sum(len(b.ops) for b in p.blocks) == len(graph.ops)
            assert p.counts.kernels == p.counts.compute_intensive + p.counts.memory_intensive
            for e in p.unfused:
                assert (e.producer, e.consumer) in edges
                assert "no rule recorded" not in e.rule, (p.planner, e)
            fused_edges = len(edges) - len(p.unfused)
            assert fused_edges >= 0
        assert report["none"].counts.intermediate_bytes == report.layers.intermediate_bytes


def _two_convs() -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Conv", ["a", "w2"], ["y"], kernel_shape=[1, 1])]
    inits = [init("w1", randn(4, 3, 3, 3)), init("w2", randn(2, 4, 1, 1))]
    return model(nodes, [io("x", (1, 3, 6, 6))], [io("y", (1, 2, 6, 6))], inits)


def test_two_contractions_name_their_rules() -> None:
    m = _two_convs()
    report = fusion_report(kg.import_onnx(m))
    for name, words in (("dnnfusion", "red"), ("tvm", "two anchors")):
        (edge,) = report[name].unfused
        assert (edge.producer, edge.consumer) == ("a", "y")
        assert words in edge.rule and edge.bytes == 4 * 4 * 6 * 6
        assert report[name].counts.compute_intensive == 2


def test_onnxruntime_count_removes_identities() -> None:
    """onnxruntime drops Identity nodes: 4 nodes in, 2 out."""
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Identity", ["b"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["y"])]
    m = model(nodes, [io("x", (2, 3))], [io("y", (2, 3))])
    assert onnxruntime_node_count(m) == 2
    report = fusion_report(kg.import_onnx(m), planners=["none"], model=m)
    assert (report.onnx_nodes, report.onnxruntime_nodes) == (4, 2)
    assert [p.planner for p in report.planners] == ["none"]


def test_text_and_json() -> None:
    m, _ = CASES["attention_shapes"]()
    report = fusion_report(kg.import_onnx(m), model=m)
    data = json.loads(json.dumps(report.to_dict()))
    assert [p["planner"] for p in data["planners"]] == ["none", "tvm", "dnnfusion"]
    assert data["planners"][2]["counts"]["kernels"] == report["dnnfusion"].counts.kernels
    assert data["onnxruntime_nodes"] == report.onnxruntime_nodes
    text = str(report)
    for p in report.planners:
        assert f"planner '{p.planner}'" in text
        for e in p.unfused:
            assert f"{e.producer} -> {e.consumer} ({e.bytes:,} bytes): {e.rule}" in text
    short = report.format(details=["tvm"])
    assert "planner 'tvm'" in short and "planner 'none'" not in short
    assert "dnnfusion" in short  # still in the counts table
    with pytest.raises(KeyError, match="no planner 'ios'"):
        report["ios"]
