"""Saving a compiled model and loading it back (``graph/saved.py``): the loaded session gives
the original's outputs bit for bit without compiling anything; a missing or corrupted file, or
a model saved by another version, for another device or in another format, is refused naming
it; a save replaces the old model whole or not at all."""
from __future__ import annotations

import functools
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import require
from onnx_graphs import attention_shapes, conv_relu_add, feed_forward

import kernelgen as kg
from kernelgen import backends
from kernelgen.graph import block_kernels, onnx_import, saved

DRIVER = importlib.import_module("kernelgen.compile")  # kg.compile is the function
# a Conv run as a Winograd program (stages, folded filters) beside plain kernels and a fused
# block, a graph of reshapes, a MatMul and a Softmax, and a MatMul by weights it packs once
CASES = {"winograd": (conv_relu_add, {"fusion": "tvm", "algorithm": "winograd"}),
         "attention": (attention_shapes, {"fusion": "none"}),
         "weights packed once": (feed_forward, {"fusion": "dnnfusion"})}


@pytest.fixture(scope="module", params=("opencl", "neon"))
def device(request: pytest.FixtureRequest) -> str:
    require(request.param)
    return request.param


@pytest.fixture(scope="module")
def compiled(device: str, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, tuple[kg.Session, dict[str, np.ndarray], Path]]:
    """Each case compiled once and saved once per device."""
    out = {}
    for name, (make, options) in CASES.items():
        m, feeds = make()
        s = kg.compile_model(m, backend=device, **options)
        out[name] = (s, feeds, s.save(tmp_path_factory.mktemp(name) / "model.kg"))
    return out


def _forbid(monkeypatch: pytest.MonkeyPatch, target: Any, name: str) -> None:
    @functools.wraps(getattr(target, name))  # its annotations still name its types
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"loading a saved model called {name}")
    monkeypatch.setattr(target, name, refuse)


@pytest.mark.parametrize("case", sorted(CASES))
def test_loaded_runs_as_the_original_without_compiling(
        compiled: dict[str, Any], case: str, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    original, feeds, path = compiled[case]
    for module, name in ((DRIVER, "compile"), (DRIVER, "compile_loop"),
                         (block_kernels, "compile"), (block_kernels, "lower"),
                         (block_kernels, "fuse"),
                         (onnx_import, "import_onnx"), (type(backends.get(device)), "choose"),
                         (type(backends.get(device)), "render")):
        _forbid(monkeypatch, module, name)
    loaded = kg.load_model(path)
    assert loaded.backend == device and loaded.fusion == original.fusion
    assert loaded.get_inputs() == original.get_inputs()
    assert loaded.get_outputs() == original.get_outputs()
    assert loaded.plan == original.plan
    assert [e.source for e in loaded.model.executables] == original.model.sources()
    want = original.run(None, feeds)
    for _ in range(2):
        for got, ref in zip(loaded.run(None, feeds), want):
            np.testing.assert_array_equal(got, ref)
    assert "loaded" in loaded.report()
    with pytest.raises(kg.ArgumentError, match="loaded from a save"):
        loaded.fusion_report()


def test_a_saved_model_loads_and_runs_without_onnx(compiled: dict[str, Any],
                                                   tmp_path: Path) -> None:
    """A process that loads and runs a saved model never imports onnx (1.4 s of the import
    on the machines measured here): with onnx made unimportable, it still matches the session
    it was saved from."""
    original, feeds, path = compiled["winograd"]
    np.savez(tmp_path / "feeds.npz", **feeds)
    code = ("import sys; sys.modules['onnx'] = None\n"  # any import of onnx now fails
            "import numpy as np, kernelgen as kg\n"
            f"loaded = kg.load_model({str(path)!r})\n"
            f"feeds = dict(np.load({str(tmp_path / 'feeds.npz')!r}))\n"
            f"np.save({str(tmp_path / 'out.npy')!r}, loaded.run(None, feeds)[0])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), original.run(None, feeds)[0])


def test_a_loaded_model_keeps_the_placement_timed_at_compile(
        compiled: dict[str, Any], device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where PoCL's workers are placed was timed when the model compiled (a ResNet-50 spent
    1.8 s of its 3 s load timing it again); the saved choice is applied when it is loaded."""
    if device != "opencl":
        pytest.skip("only the OpenCL runtime places worker threads")
    from kernelgen.backends.opencl import placement
    original, feeds, path = compiled["winograd"]
    choose, given = placement.choose, []

    def recorded(*args: Any, **kwargs: Any) -> str | None:
        given.append(kwargs.get("given"))
        return choose(*args, **kwargs)
    monkeypatch.setattr(placement, "choose", recorded)
    monkeypatch.delenv(placement.PLACEMENT_ENV, raising=False)
    loaded = kg.load_model(path)
    assert given == [original.model.placement]
    assert loaded.model.placement == original.model.placement
    np.testing.assert_array_equal(loaded.run(None, feeds)[0], original.run(None, feeds)[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_saved_binaries_skip_the_device_compiler(compiled: dict[str, Any], case: str,
                                                 device: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenCL programs are saved as device binaries too: loaded into a process that built
    nothing, no program is compiled from source, and the outputs are the original's. NEON C
    keeps no binaries in the save (its libraries are cached by their source)."""
    original, feeds, path = compiled[case]
    binaries = json.loads((path / "manifest.json").read_text())["binaries"]
    if device != "opencl":
        assert binaries == {}
        return
    assert binaries and all((path / f).is_file() for f in binaries.values())
    import pyopencl

    from kernelgen.backends.opencl import runtime
    monkeypatch.setattr(runtime, "_programs", {})  # as in a new process
    from_source = []
    real = pyopencl.Program

    def program(context: Any, *args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], str):
            from_source.append(args[0])
        return real(context, *args)
    monkeypatch.setattr(pyopencl, "Program", program)
    loaded = kg.load_model(path)
    for got, ref in zip(loaded.run(None, feeds), original.run(None, feeds)):
        np.testing.assert_array_equal(got, ref)
    assert from_source == []


def test_a_program_keeps_its_folded_constants(compiled: dict[str, Any]) -> None:
    loaded = kg.load_model(compiled["winograd"][2])
    programs = [e for e in loaded.model.executables if isinstance(e, kg.Program)]
    assert programs and all(p.folded for p in programs)


def _copy(compiled: dict[str, Any], tmp_path: Path) -> Path:
    return kg.load_model(compiled["attention"][2]).save(tmp_path / "copy.kg")


def _edit(path: Path, **changes: Any) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_corrupted_or_missing_files_are_named(compiled: dict[str, Any], tmp_path: Path) -> None:
    path = _copy(compiled, tmp_path)
    kernel = next((path / "kernels").iterdir())
    kernel.write_text(kernel.read_text() + "\n// edited\n")
    with pytest.raises(kg.ModelError, match=f"{kernel.name}' is corrupted"):
        kg.load_model(path)
    path = _copy(compiled, tmp_path / "b")
    constant = next((path / "constants").iterdir())
    constant.unlink()
    with pytest.raises(kg.ModelError, match=f"{constant.name}' is missing"):
        kg.load_model(path)
    (path / "manifest.json").write_text("{ not json")
    with pytest.raises(kg.ModelError, match="manifest.json' is corrupted"):
        kg.load_model(path)
    with pytest.raises(kg.ModelError, match="manifest.json' is missing"):
        kg.load_model(tmp_path / "nothing")


@pytest.mark.parametrize("field, value, message", [
    ("kernelgen_version", "0.0.1", "compiled by kernelgen 0.0.1"),
    ("device", "another device", "for .* device 'another device'"),
    ("format", saved.FORMAT + 1, f"has format {saved.FORMAT + 1}")])
def test_another_version_device_or_format_is_refused(
        compiled: dict[str, Any], tmp_path: Path, field: str, value: Any, message: str) -> None:
    path = _copy(compiled, tmp_path)
    _edit(path, **{field: value})
    with pytest.raises(kg.ModelError, match=message):
        kg.load_model(path)


def test_save_is_all_or_nothing(compiled: dict[str, Any], tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    original, feeds, _ = compiled["attention"]
    path = original.save(tmp_path / "m.kg")
    before = sorted(p.name for p in tmp_path.iterdir())

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk full")
    monkeypatch.setattr(saved, "_digest", crash)  # after the files are written
    with pytest.raises(OSError, match="disk full"):
        original.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no staging left behind
    monkeypatch.undo()
    kg.load_model(path)  # the old model is whole
    original.save(path)  # replaced in place
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    (tmp_path / "data").mkdir()
    with pytest.raises(FileExistsError, match="not a saved model"):
        original.save(tmp_path / "data")


def test_a_field_added_since_the_save_takes_its_default() -> None:
    """A launch saved before ``pack_once`` existed loads with its default (packed at every
    launch), not a KeyError."""
    from kernelgen.backends.opencl.language import Launch
    data = {"global_size": [4, 2], "local_size": None, "pack": None, "scratch": 0}
    assert saved._decode(Launch, data) == Launch((4, 2), None)
