"""The extended computation graph: per operator its mapping type, index maps, removable output,
math properties, FLOPs and bytes, each checked against a count made by hand (2·M·N·K for a
MatMul, one operation per element for an elementwise operator, each input read once and the
output written once), and its printed table."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx_graphs import CASES

import kernelgen as kg
from kernelgen.graph import ECG, Graph
from kernelgen.ir.node import Op
from kernelgen.mapping_types import MappingType

OTO, OTM, MTM = MappingType.ONE_TO_ONE, MappingType.ONE_TO_MANY, MappingType.MANY_TO_MANY
F32 = 4


def _named(op: Op, name: str) -> Op:
    op.name = name  # as the ONNX importer names operators after their outputs
    return op


def _graph() -> Graph:
    """x + b -> Relu -> (ReduceSum, MatMul -> Transpose -> Exp); MatMul's value is also an
    output, so only Add, Relu and Transpose are removable."""
    x = kg.tensor("x", (2, 3))
    b = kg.constant("b", np.ones(3, np.float32))
    w = kg.constant("w", np.ones((3, 4), np.float32))
    r = _named(kg.relu(_named(kg.add(x, b), "a")), "r")
    s = _named(kg.reduce_sum(r, axes=[1], keepdims=0), "s")
    m = _named(kg.matmul(r, w), "m")
    e = _named(kg.exp(_named(kg.transpose(m, perm=[1, 0]), "t")), "e")
    return Graph.build([x], {"s": s, "e": e, "m": m}, name="small")


def test_per_node_facts() -> None:
    ecg = ECG(_graph())
    assert [n.name for n in ecg] == ["a", "r", "s", "m", "t", "e"] and len(ecg) == 6
    a, r, s, m, t, e = ecg.nodes
    # mapping types: the operator's, and one per input
    assert [n.mapping_type for n in ecg] == [OTO, OTO, MTM, MTM, MappingType.SHUFFLE, OTO]
    assert a.input_types == (OTO, OTM)  # x elementwise, b broadcast
    assert m.input_types == (MTM, MTM)
    # removable: every output that is not a graph output ('m' is one, though it is consumed)
    assert [n.removable for n in ecg] == [True, True, False, False, True, False]
    assert (r.consumers, m.consumers, e.consumers) == (("s", "m"), ("t",), ())
    assert (a.inputs, m.inputs) == (("x", "b"), ("r", "w"))
    # FLOPs: one per element for Add, Relu, Exp; a sum reads every element once (2 rows of
    # 3); MatMul 2*M*N*K; a transpose moves data only
    assert [n.flops for n in ecg] == [6, 6, 2 * 3, 2 * 2 * 4 * 3, 0, 8]
    # bytes: inputs read once, output written once
    assert a.bytes == F32 * (6 + 3 + 6) and r.bytes == F32 * (6 + 6)
    assert s.bytes == F32 * (6 + 2) and m.bytes == F32 * (6 + 12 + 8)
    assert t.bytes == e.bytes == F32 * (8 + 8)
    assert [n.output_bytes for n in ecg] == [F32 * 6, F32 * 6, F32 * 2, F32 * 8, F32 * 8, F32 * 8]
    # index maps, output index -> input index
    assert t.index_maps == ("in[o1, o0]",)
    assert a.index_maps == ("in[o0, o1]", "in[o1]")
    assert "sum" in s.index_maps[0] and "sum" in m.index_maps[1]
    # math properties (DNNFusion Table 4's raw material)
    assert a.properties.associative and a.properties.commutative
    assert not r.properties.commutative


def test_totals_and_lookup() -> None:
    ecg = ECG(_graph())
    totals = ecg.totals()
    assert totals == {"flops": 6 + 6 + 6 + 48 + 0 + 8,
                      "bytes": sum(n.bytes for n in ecg),
                      "removable_bytes": F32 * (6 + 6 + 8)}
    assert ecg["t"].kind == "Transpose"
    with pytest.raises(KeyError, match="no operator named 'nope' in graph 'small'"):
        ecg["nope"]


def test_printed_table() -> None:
    ecg = ECG(_graph())
    lines = str(ecg).splitlines()
    assert lines[0].split()[:4] == ["name", "kind", "shape", "mapping"]
    assert len(lines) == 1 + len(ecg) + 1
    row = lines[1 + 3]  # m
    assert row.split()[:6] == ["m", "MatMul", "2x4", "Many-to-Many", "no", "-"]
    assert "48" in row and "r in[o0," in row and "w in[" in row
    assert "assoc,comm" in lines[1]  # Add
    assert lines[-1] == ("6 operators, 74 FLOPs, 372 bytes run one by one, 80 bytes of "
                         "removable intermediates")


def test_conv_from_onnx() -> None:
    """Conv's FLOPs are 2·IC·KH·KW per output plus the bias add; its data read is a window."""
    m, _ = CASES["conv_relu_add"]()
    ecg = ECG(kg.import_onnx(m))
    conv = ecg["c"]
    out = 1 * 4 * 7 * 5
    assert conv.flops == 2 * 4 * 3 * 3 * out + out
    assert conv.bytes == F32 * (out + 4 * 4 * 3 * 3 + 4 + out)
    assert conv.input_types[0] is MTM and conv.input_types[2] is OTM  # data window, bias
    assert [n.removable for n in ecg] == [True, True, False, False]
    assert ecg.totals()["removable_bytes"] == 2 * F32 * out


def test_json() -> None:
    ecg = ECG(_graph())
    data = json.loads(json.dumps(ecg.to_dict()))
    assert data["graph"] == "small" and data["totals"] == ecg.totals()
    m = data["nodes"][3]
    assert (m["name"], m["mapping_type"], m["input_types"], m["flops"], m["removable"]) == (
        "m", "Many-to-Many", ["Many-to-Many", "Many-to-Many"], 48, False)
    assert data["nodes"][0]["properties"] == {"associative": True, "commutative": True,
                                              "distributes_over": []}
