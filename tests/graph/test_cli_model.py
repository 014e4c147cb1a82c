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
from onnx import numpy_helper
from onnx_graphs import CASES

import kernelgen as kg
from kernelgen.cli import main
from kernelgen.graph import fusion_report


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
                 "--inputs", str(npz)]) == 0
    out = capsys.readouterr().out
    assert "4 operators in 1 kernels (dnnfusion) on opencl" in out
    assert out.count("(ok)") == 2 and "latency:" in out and "onnxruntime" in out


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
