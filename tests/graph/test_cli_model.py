"""The ``kernelgen`` command on ONNX models: ``plan`` (the fusion report, text and JSON; nothing
compiled), ``emit`` (sources, launches, buffers, constants and a manifest that agree with each
other; nothing built), ``run`` (checked against onnxruntime, timed), and one-line errors with
status 2 for a bad model, input file or option. A chain file still runs as before
(tests/unit/test_cli.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require
from onnx import helper, numpy_helper
from models.model_zoo import mobilenet_v2
from onnx_graphs import CASES, init, io, model, randn, rng

import kernelgen as kg
from kernelgen.cli import main
from kernelgen.cli.model import DEFAULT_MODEL
from kernelgen.graph import fusion_report
from kernelgen.graph.export import export


@pytest.fixture
def conv_model(tmp_path: Path) -> tuple[Path, onnx.ModelProto, dict[str, np.ndarray]]:
    m, feeds = CASES["conv_relu_add"]()
    path = tmp_path / "conv_relu_add.onnx"
    onnx.save(m, str(path))
    return path, m, feeds


def test_plan_text(conv_model: tuple, capsys: pytest.CaptureFixture) -> None:
    path, _, _ = conv_model
    assert main(["plan", str(path), "--fusion", "tvm"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime's optimised graph" in out
    for planner in ("none", "tvm", "dnnfusion"):
        assert f"  {planner} " in out  # a row of the counts table
    assert "planner 'tvm': 2 block(s)" in out and "planner 'none'" not in out
    assert "y -> z (560 bytes): 'y' is a graph output" in out


def test_plan_json(conv_model: tuple, capsys: pytest.CaptureFixture) -> None:
    path, m, _ = conv_model
    assert main(["plan", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(fusion_report(kg.import_onnx(m), model=m).to_dict()))
    assert [p["counts"]["kernels"] for p in data["planners"]] == [4, 2, 1]


def test_emit_writes_a_consistent_manifest(conv_model: tuple, tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    require("opencl")
    path, m, _ = conv_model
    out = tmp_path / "out"
    assert main(["emit", str(path), "-o", str(out), "--backend", "opencl",
                 "--fusion", "none"]) == 0
    assert "wrote 4 kernels" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["backend"], manifest["fusion"]) == ("opencl", "none")
    buffers = manifest["buffers"]
    assert [b["id"] for b in buffers] == list(range(len(buffers)))
    assert [(i["name"], buffers[i["buffer"]]["role"]) for i in manifest["inputs"]] == [
        ("x", "input")]
    assert [o["name"] for o in manifest["outputs"]] == ["y", "z"]
    weights = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    constants = [b for b in buffers if b["role"] == "constant"]
    assert sorted(b["name"] for b in constants) == ["b", "w"]
    for b in constants:
        np.testing.assert_array_equal(np.load(out / b["file"]), weights[b["name"]])
    # intermediates 'c' and 'r' live in slots; every launch passes buffers of the shapes
    # its kernel's metadata declares, in its argument order
    assert sorted(b["name"] for b in buffers if b["role"] == "intermediate") == ["c", "r"]
    assert all(b["slot"] is not None for b in buffers if b["role"] == "intermediate")
    assert [launch["ops"] for launch in manifest["launches"]] == [["c"], ["r"], ["y"], ["z"]]
    for launch in manifest["launches"]:
        kernel = manifest["kernels"][launch["kernel"]]
        declared = kernel["metadata"]["args"]
        assert [list(buffers[a]["shape"]) for a in launch["args"]] == [
            a["shape"] for a in declared]
        for file in kernel["files"]:
            assert file.endswith(".cl")
            assert "__kernel" in (out / file).read_text()


def test_run_checks_against_onnxruntime(conv_model: tuple, tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    require("opencl")
    path, _, feeds = conv_model
    npz = tmp_path / "inputs.npz"
    np.savez(npz, **feeds)
    assert main(["run", str(path), "--backend", "opencl", "--repeat", "2",
                 "--inputs", str(npz), "--profile", "3"]) == 0
    out = capsys.readouterr().out
    assert "4 operators in 1 kernels (dnnfusion) on opencl" in out
    assert out.count("(ok)") == 2 and "latency:" in out and "onnxruntime" in out
    # --profile: the one launch, with its four operators by kind
    assert "Conv(" in out and "Relu(" in out and "1 launches:" in out


def test_bench_times_each_planner_beside_onnxruntime(conv_model: tuple, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    require("opencl")
    path, _, _ = conv_model
    out_json = tmp_path / "bench.json"
    assert main(["bench", str(path), "--backend", "opencl", "--fusion", "none", "--fusion",
                 "dnnfusion", "--rewrite", "no", "--repeat", "2", "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "onnxruntime (all optimisations, 2 threads)" in text
    result = json.loads(out_json.read_text())
    rows = {r["fusion"]: r for r in result["rows"]}
    assert sorted(rows) == ["dnnfusion", "none"] and not any(r["rewrite"] for r in rows.values())
    assert rows["none"]["kernels"] == 4 and rows["dnnfusion"]["kernels"] == 1
    assert rows["dnnfusion"]["intermediates_total"] == 0 < rows["none"]["intermediates_total"]
    for r in rows.values():
        assert r["max_error"] < 1e-5 and r["latency_ms"] > 0 and r["compile_s"] > 0


def test_run_defaults_to_the_bundled_model(capsys: pytest.CaptureFixture) -> None:
    """``kernelgen run`` alone (the README's first command) runs the bundled MobileNetV2
    stack, which is what tests/models/model_zoo.py writes, and it matches onnxruntime."""
    assert DEFAULT_MODEL.read_bytes() == mobilenet_v2().SerializeToString()
    require("opencl")
    assert main(["run", "--backend", "opencl", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert f"model {DEFAULT_MODEL}: 40 operators in" in out and "(ok)" in out


BAD_RUNS = {
    "missing model": (["run", "nope.onnx"], "cannot read the ONNX model"),
    "bad shape option": (["plan", "{model}", "--shape", "x=1,a"], "--shape 'x=1,a'"),
    "npz missing input": (["run", "{model}", "--inputs", "{npz}"], "missing ['x']"),
    "npz wrong shape": (["run", "{model}", "--inputs", "{npz_shape}"],
                        "input 'x' is float32[1, 4, 7, 6], the model takes float32[1, 4, 7, 5]"),
}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_errors_are_one_line_and_status_2(case: str, conv_model: tuple, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    path, _, _ = conv_model
    np.savez(tmp_path / "other.npz", y=np.zeros(3, np.float32))
    np.savez(tmp_path / "shape.npz", x=np.zeros((1, 4, 7, 6), np.float32))
    argv, expected = BAD_RUNS[case]
    argv = [a.format(model=path, npz=tmp_path / "other.npz", npz_shape=tmp_path / "shape.npz")
            for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelgen: error: ")
    assert expected in lines[0], lines[0]


def _conv_bn_model(tmp_path: Path) -> Path:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "bb", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["y"])]
    inits = [init("w", randn(4, 3, 3, 3, scale=0.3)), init("g", rng.uniform(0.5, 1.5, 4)),
             init("bb", randn(4, scale=0.1)), init("m", randn(4, scale=0.1)),
             init("v", rng.uniform(0.5, 1.5, 4))]
    path = tmp_path / "conv_bn.onnx"
    onnx.save(model(nodes, [io("x", (1, 3, 5, 6))], [io("y", (1, 4, 5, 6))], inits), str(path))
    return path


def test_plan_with_rewrites(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _conv_bn_model(tmp_path)
    assert main(["plan", str(path), "--rewrite", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [a["rule"] for a in data["rewrites"]] == ["fold_bn"]
    assert data["layers"]["kernels"] == 2 and data["onnx_nodes"] == 3
    assert main(["plan", str(path), "--rewrite"]) == 0
    assert capsys.readouterr().out.startswith("rewrites: fold_bn x1\n")


def test_run_with_rewrites(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    require("opencl")
    path = _conv_bn_model(tmp_path)
    assert main(["run", str(path), "--rewrite", "--backend", "opencl", "--repeat", "1",
                 "--fusion", "none"]) == 0
    out = capsys.readouterr().out
    assert "2 operators in 2 kernels (none)" in out and "rewrites: fold_bn x1" in out
    assert "(ok)" in out


def test_export_a_program(tmp_path: Path) -> None:
    """A Winograd convolution is a program: one source file per stage, in launch order, and
    its transformed filter (folded at compile time) saved beside the constants it replaces."""
    require("opencl")
    m, _ = CASES["conv_relu_add"]()
    session = kg.compile_model(m, backend="opencl", fusion="none", algorithm="winograd",
                               warmup=False)
    manifest = json.loads(export(session, tmp_path).read_text())
    program = manifest["kernels"][0]
    assert program["kind"] == "program" and len(program["files"]) >= 2
    assert [s["name"] for s in program["metadata"]["stages"]] == [
        Path(f).stem.split("_", 2)[2] for f in program["files"]]
    (folded,) = program["folded"].values()
    assert np.load(tmp_path / folded).ndim >= 2
    assert {b["name"]: b["resident"] for b in manifest["buffers"] if b["role"] == "constant"} \
        == {"w": False, "b": True}  # the raw filter is not read on the device
