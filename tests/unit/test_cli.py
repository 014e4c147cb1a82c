"""The ``kernelgen`` command: a chain file that is missing or malformed gives one error line
naming the file and what is wrong, exit status 2 and no traceback; ``--version``; help text on
every option; and a small chain still runs end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

import kernelgen as kg
from kernelgen.cli import main
from kernelgen.cli.chain import DEFAULT_CHAIN, ChainFileError, load_chain

GOOD = {"inputs": {"x": {"shape": [3, 5]}, "b": {"shape": [5]}},
        "ops": [{"name": "y", "op": "Add", "inputs": ["x", "b"]},
                {"name": "z", "op": "Softmax", "inputs": ["y"], "attrs": {"axis": -1}}]}


def _with(**changes: object) -> dict:
    return {**GOOD, **changes}


BAD = {
    "not JSON": ("{inputs: ", "not valid JSON"),
    "a list": ("[1, 2]", 'the file: expected an object with "inputs" and "ops"'),
    "no inputs": (_with(inputs={}), '"inputs": expected a non-empty object'),
    "no ops": ({"inputs": GOOD["inputs"]}, '"ops": expected a non-empty list'),
    "ops not a list": (_with(ops={"op": "Relu"}), '"ops": expected a non-empty list'),
    "input without shape": (_with(inputs={"x": [3, 5]}), 'inputs["x"]: expected an object'),
    "bad shape": (_with(inputs={"x": {"shape": [3, -1]}}), 'inputs["x"]'),
    "bad dtype": (_with(inputs={"x": {"shape": [3], "dtype": "float7"}}), 'inputs["x"]'),
    "op entry not an object": (_with(ops=["Relu"]), "ops[0]: expected an object"),
    "unknown op": (_with(ops=[{"op": "Rellu", "inputs": ["x"]}]),
                   "ops[0] (Rellu): unknown ONNX operator type; did you mean Relu"),
    "undefined input": (_with(ops=[{"op": "Relu", "inputs": ["w"]}]),
                        "ops[0] (Relu): input 'w' is not defined before use"),
    "inputs not a list": (_with(ops=[{"op": "Relu", "inputs": "x"}]),
                          'ops[0] (Relu) "inputs": expected a list of names'),
    "unknown attribute": (_with(ops=[{"op": "Softmax", "inputs": ["x"], "attrs": {"axes": 1}}]),
                          "ops[0] (Softmax): "),
    "bad axis": (_with(ops=[{"op": "Softmax", "inputs": ["x"], "attrs": {"axis": 7}}]),
                 "ops[0] (Softmax): "),
    "shape mismatch": (_with(inputs={"x": {"shape": [3, 5]}, "b": {"shape": [4]}},
                             ops=[{"op": "Add", "inputs": ["x", "b"]}]), "ops[0] (Add): "),
    "duplicate name": (_with(ops=[{"name": "x", "op": "Relu", "inputs": ["x"]}]),
                       'ops[0] (Relu) "name": expected a name not used before'),
}


def _write(tmp_path: Path, content: object) -> Path:
    path = tmp_path / "chain.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_chain_file_is_one_line_and_status_2(case: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    content, expected = BAD[case]
    path = _write(tmp_path, content)
    assert main(["run", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"kernelgen: error: {path}: ") and expected in lines[0], err
    with pytest.raises(ChainFileError, match=str(path)):
        load_chain(path)


def test_missing_chain_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "nope.json"
    assert main(["run", str(missing)]) == 2
    assert capsys.readouterr().err == (f"kernelgen: error: {missing}: cannot read the chain "
                                       "file (No such file or directory)\n")
    assert main(["run", str(tmp_path)]) == 2  # a directory
    assert "cannot read the chain file" in capsys.readouterr().err


def test_command_line_status_and_no_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, "{not json")
    result = subprocess.run([sys.executable, "-m", "kernelgen", "run", str(path)],
                            capture_output=True, text=True, timeout=120, env=os.environ)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"kernelgen: error: {path}: not valid JSON (Expecting "
                                     "property name enclosed in double quotes at line 1 column 2)")


def test_version(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"kernelgen {kg.__version__}"


def test_every_option_has_help(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in ["chain an ONNX model", "--force fuse pairs",
                   "--repeat N timed runs per measurement",
                   "--backend {opencl,neon,triton} where the kernels run"]:
        assert option in text, text
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--version" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in ["--fusion {dnnfusion,none,tvm} a planner to time", "--rewrite {no,yes,both}",
                   "--json FILE also write"]:
        assert option in text, text


@pytest.mark.parametrize("repeat", ["0", "-3", "many"])
def test_bad_repeat_is_a_usage_error(repeat: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--repeat", repeat])
    assert exit_.value.code == 2
    assert "--repeat: expected a positive integer" in capsys.readouterr().err


def test_bundled_chains_load() -> None:
    for path in sorted(DEFAULT_CHAIN.parent.glob("*.json")):
        chain = load_chain(path)
        assert chain.ops and chain.inputs and chain.description


def test_small_chain_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    require("opencl")
    path = _write(tmp_path, GOOD)
    assert main(["run", str(path), "--repeat", "1", "--backend", "opencl"]) == 0
    out = capsys.readouterr().out
    assert "max |fused - unfused|" in out and "fastest:" in out
