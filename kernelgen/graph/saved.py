"""A compiled model saved to a directory and loaded back without compiling it again.

    session.save("resnet.kg")                    # save(session, path)
    session = kernelgen.load_model("resnet.kg")  # session.py, a Session around load(path)
    probs, = session.run(None, {"data": x})

The saved form is ``export``'s (``export.py``: kernel sources, constants as ``.npy``, one
``manifest.json`` holding the plan and each kernel's launch metadata) plus a format version,
the device identity it was compiled for, a SHA-256 of every file, and per kernel the rest of
the backend's rendered ``Source`` (its fields but the text: entry point, NDRange, helpers),
which is what ``Backend.runtime`` builds a runtime from. ``save`` writes into a temporary
directory beside the target and renames it into place, so a crash leaves either the old model
or the new one, never half of one.

Loading reads the manifest, checks the files and gives each kernel's saved source to its
backend's runtime: nothing is imported, lowered, fused, planned, rendered or tuned; only the
backend's driver builds the source (``Backend.prebuild`` where it builds in batches, else at
the warm-up run). Where the backend keeps device binaries (OpenCL), they are saved too and
loading hands them to the device first, so not even the device compiler runs (a driver that
refuses them builds the sources instead). The loaded model runs like the original; it has no
operator graph (``graph`` holds only the inputs and outputs), so the fusion report is not
available.

Note: a model saved by another kernelgen version, for another device, or in another format is
refused with an error naming both sides, rather than recompiled: recompiling needs the model's
operators, which the saved form does not hold (only its kernels). Compile the model again.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np

from .. import backends
from ..backends import Backend, Source
from ..dtypes import DType
from ..errors import ModelError
from ..exec import Executable, Kernel, Program
from ..ir.loop import Buffer, LoopKernel
from ..ir.node import Constant, Placeholder, Value
from ..version import __version__
from .executor import CompiledModel
from .export import MANIFEST, Compiled, export
from .ios import Schedule
from .memory import Slot
from .model import Graph
from .plan import BufferSpec, KernelSpec, Launch, Plan

FORMAT = 1  # bump when the saved form's meaning changes


def save(session: Compiled, path: str | Path) -> Path:
    """Write ``session`` under the directory ``path`` (replacing a model saved there before;
    anything else there is refused); returns ``path``."""
    target = Path(path)
    if target.exists() and not (target / MANIFEST).is_file():
        raise FileExistsError(f"'{target}' exists and is not a saved model; not overwriting it")
    be = backends.get(session.plan.backend)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        manifest_path = export(session, staging)
        manifest = json.loads(manifest_path.read_text())
        manifest["format"] = FORMAT
        manifest["device"] = _identity(be)
        for entry, exe in zip(manifest["kernels"], session.model.executables):
            entry["sources"] = [_source_fields(be, k) for k in _stages(exe)]
        manifest["binaries"] = _binaries(be, session.model.executables, staging)
        manifest["placement"] = session.model.placement  # timed at compile: not at each load
        manifest["checksums"] = {str(f.relative_to(staging)): _digest(f)
                                 for f in sorted(staging.rglob("*"))
                                 if f.is_file() and f.name != MANIFEST}
        manifest_path.write_text(json.dumps(manifest, indent=1))
        if target.exists():  # the old model is set aside first, removed once the new one is in
            # (between the two renames it lies whole beside the target, under the '.old' name)
            old = staging.with_name(staging.name + ".old")
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def load(path: str | Path, *, warmup: bool = True) -> tuple[CompiledModel, str]:
    """The compiled model saved under ``path`` (``save``) and its planner's name, ready to run,
    built by the backend's driver from the saved sources (``warmup``: now, by one run on zeros;
    else at the first run). A missing or corrupted file, or a model saved by another kernelgen
    version, for another device or in another format, is a ``ModelError`` naming it."""
    start = time.perf_counter()
    root = Path(path)
    manifest = _manifest(root)
    be = backends.get(manifest["backend"])
    problem = be.problem()
    if problem is not None:
        raise ModelError(f"saved model '{root}' runs on {be.name}: {problem}")
    saved_on, here = manifest.get("device"), _identity(be)
    if saved_on != here:
        raise ModelError(f"saved model '{root}' was compiled for {be.name} device '{saved_on}', "
                         f"this one is '{here}'; compile the model again for this device")
    files = _Files(root, manifest["checksums"])
    constants = {b["name"]: files.array(b["file"], b) for b in manifest["buffers"]
                 if b["role"] == "constant"}
    sources: list[Source] = []
    executables = [_executable(files, entry, be, sources) for entry in manifest["kernels"]]
    unique = list({s.text: s for s in sources}.values())
    binaries = manifest.get("binaries", {})
    for source in unique:
        saved = binaries.get(_text_digest(source.text))
        if saved is not None:  # refused (another driver): the source is built instead
            be.preload(source.text, files.data(saved))
    if be.batch_builds:
        be.prebuild(unique)
    plan = _plan(manifest)
    model = CompiledModel(_signature(manifest, plan, constants), plan, executables, {},
                          constants=constants)
    if warmup:
        saved_placement = manifest.get("placement")
        model.warm_up(saved_placement if isinstance(saved_placement, str) else None)
    model.timings = {"load_s": time.perf_counter() - start}
    return model, manifest["fusion"]


def _binaries(be: Backend, executables: typing.Sequence[Executable], root: Path
              ) -> dict[str, str]:
    """Each kernel source's device binary, where the backend has one, written under
    ``binaries/``: SHA-256 of the source text -> file. Loading hands them to the backend, so
    the device compiler does not run again (ResNet-50 on PoCL: about a minute)."""
    out: dict[str, str] = {}
    for exe in executables:
        for kernel in _stages(exe):
            digest = _text_digest(kernel.source)
            binary = None if digest in out else be.binary(kernel.source)
            if binary is not None:
                relative = f"binaries/{len(out)}.bin"
                (root / "binaries").mkdir(exist_ok=True)
                (root / relative).write_bytes(binary)
                out[digest] = relative
    return out


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _identity(be: Backend) -> str | None:
    try:
        return be.device_identity()
    except Exception:  # noqa: BLE001 - no device here: the saved model names none
        return None


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _stages(exe: Executable) -> list[Kernel]:
    kernels = exe.kernels if isinstance(exe, Program) else (exe,)
    assert all(isinstance(k, Kernel) for k in kernels)
    return list(kernels)  # type: ignore[arg-type]


# Note: a runtime is built from the backend's own ``Source`` (``Backend.runtime``), whose
# subclass differs per backend (an NDRange, a C function's helpers) and which a kernel does not
# keep. Saving renders it again from the kernel's own tunables, which prints the same text (the
# printers decide nothing; checked here), and keeps its fields as JSON; loading rebuilds it as
# the class ``Backend.render`` declares, so this module never names a backend.
def _source_fields(be: Backend, kernel: Kernel) -> dict[str, Any]:
    if isinstance(kernel, _Loaded):  # no loop IR to render from: its source as loaded
        source = kernel.rendered
    else:
        source = be.render(be.choose(kernel.loop, kernel.metadata["tunables"]))
    if source.text != kernel.source:
        raise AssertionError(f"kernel '{kernel.name}': rendering it again with its tunables "
                             f"printed another source; it cannot be saved")
    fields = _encode(source)
    del fields["text"]  # the kernel's file
    return fields


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(kind: Any, data: Any) -> Any:
    """``data`` (``_encode``'s JSON) as a value of the annotated type ``kind``: dataclasses,
    tuples, lists, dicts, ``X | None`` and plain values."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, data)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in data)
        return tuple(_decode(a, v) for a, v in zip(args, data))
    if origin is list:
        return [_decode(args[0], v) for v in data]
    if origin is dict:
        return {k: _decode(args[1], v) for k, v in data.items()}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        # a field added since the save (with its default) is absent from it
        return kind(**{f.name: _decode(hints[f.name], data[f.name])
                       for f in dataclasses.fields(kind) if f.init and f.name in data})
    return data


def _manifest(root: Path) -> dict[str, Any]:
    """The manifest, checked for format and kernelgen version."""
    path = root / MANIFEST
    if not path.is_file():
        raise ModelError(f"'{root}' is not a saved model: '{path}' is missing")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"saved model '{root}': '{path}' is corrupted ({exc})") from exc
    needed = ("format", "kernelgen_version", "backend", "checksums", "buffers", "kernels",
              "launches", "slots", "inputs", "outputs")
    missing = [k for k in needed if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise ModelError(f"saved model '{root}': '{path}' lacks {missing} (not written by "
                         f"Session.save, or corrupted)")
    if manifest["format"] != FORMAT:
        raise ModelError(f"saved model '{root}' has format {manifest['format']}, this kernelgen "
                         f"reads format {FORMAT}; compile the model again")
    if manifest["kernelgen_version"] != __version__:
        raise ModelError(f"saved model '{root}' was compiled by kernelgen "
                         f"{manifest['kernelgen_version']}, this is {__version__}; compile the "
                         f"model again")
    return manifest


class _Files:
    """The saved files, each checked against its checksum before it is used."""

    def __init__(self, root: Path, checksums: dict[str, str]) -> None:
        self.root, self.checksums = root, checksums

    def _checked(self, relative: str) -> Path:
        path = self.root / relative
        if relative not in self.checksums:
            raise ModelError(f"saved model '{self.root}': '{path}' is not in the manifest")
        if not path.is_file():
            raise ModelError(f"saved model '{self.root}': '{path}' is missing")
        if _digest(path) != self.checksums[relative]:
            raise ModelError(f"saved model '{self.root}': '{path}' is corrupted (its checksum "
                             f"differs from the one saved)")
        return path

    def data(self, relative: str) -> bytes:
        return self._checked(relative).read_bytes()

    def text(self, relative: str) -> str:
        return self._checked(relative).read_text()

    def array(self, relative: str, spec: dict[str, Any] | None = None) -> np.ndarray:
        path = self._checked(relative)
        array = np.load(path, allow_pickle=False)
        if spec is not None and (list(array.shape) != spec["shape"]
                                 or array.dtype != np.dtype(DType(spec["dtype"]).numpy)):
            raise ModelError(f"saved model '{self.root}': '{path}' holds {array.dtype} "
                             f"{list(array.shape)}, the plan says {spec['dtype']} {spec['shape']}")
        return array


class _Loaded(Kernel):
    """A kernel loaded from a save: ``rendered`` is the backend's source it runs."""

    rendered: Source


def _shell(meta: dict[str, Any]) -> LoopKernel:
    """A kernel's buffers as its metadata lists them. The loop IR itself is not saved (the
    source is what runs); a loaded kernel's ``loop`` holds its name and buffers only."""
    args = {role: tuple(Buffer(a["name"], tuple(a["shape"]), DType(a["dtype"]))
                        for a in meta["args"] if a["role"] == role)
            for role in ("input", "output")}
    return LoopKernel(meta["name"], args["input"], args["output"], (), ())


def _kernel(files: _Files, relative: str, meta: dict[str, Any], fields: dict[str, Any],
            be: Backend, sources: list[Source]) -> Kernel:
    loop = _shell(meta)
    source = _decode(typing.get_type_hints(type(be).render)["return"],
                     {**fields, "text": files.text(relative)})
    sources.append(source)
    kernel = _Loaded(loop, be.name, source.text, meta, be.runtime(loop, source))
    kernel.rendered = source
    return kernel


def _executable(files: _Files, entry: dict[str, Any], be: Backend,
                sources: list[Source]) -> Executable:
    meta = entry["metadata"]
    if entry["kind"] == "kernel":
        return _kernel(files, entry["files"][0], meta, entry["sources"][0], be, sources)
    stages = [_kernel(files, f, m, fields, be, sources)
              for f, m, fields in zip(entry["files"], meta["stages"], entry["sources"])]
    inputs = [Placeholder(a["name"], tuple(a["shape"]), DType(a["dtype"]))
              for a in meta["args"] if a["role"] == "input"]
    folded = {name: files.array(f) for name, f in entry["folded"].items()}
    program = Program(meta["name"], be.name, inputs, stages, folded, {})
    program.metadata = meta  # as compiled (the shells' loops have no FLOPs to count)
    return program


def _plan(manifest: dict[str, Any]) -> Plan:
    buffers = tuple(BufferSpec(b["id"], b["name"], b["role"], b["dtype"], tuple(b["shape"]),
                               b["nbytes"], b["slot"], b.get("resident", False),
                               b.get("view_of"), b.get("offset", 0))
                    for b in manifest["buffers"])
    kernels = tuple(KernelSpec(k["id"], k["name"], k["kind"], k["uses"],
                               k["metadata"].get("schedule", k["kind"]),
                               k["metadata"].get("algorithm"))
                    for k in manifest["kernels"])
    return Plan(manifest["backend"], buffers,
                tuple(Slot(s["id"], s["dtype"], s["numel"], s["nbytes"])
                      for s in manifest["slots"]),
                kernels,
                tuple(Launch(x["kernel"], tuple(x["ops"]), tuple(x["args"]))
                      for x in manifest["launches"]),
                tuple(i["buffer"] for i in manifest["inputs"]),
                tuple((o["name"], o["buffer"]) for o in manifest["outputs"]),
                manifest["memory"]["intermediates_live_peak"],
                Schedule.from_dict(manifest["schedule"]) if manifest.get("schedule") else None)


def _signature(manifest: dict[str, Any], plan: Plan, constants: dict[str, np.ndarray]) -> Graph:
    """The model's inputs and outputs as a graph without operators."""
    placeholders = {b.id: Placeholder(b.name, b.shape, DType(b.dtype)) for b in plan.buffers
                    if b.role != "constant"}
    values: dict[int, Value] = {b.id: Constant(b.name, b.shape, DType(b.dtype), constants[b.name])
                                for b in plan.buffers if b.role == "constant"}
    values.update(placeholders)
    return Graph(manifest.get("model", "model"), tuple(placeholders[k] for k in plan.inputs),
                 {name: values[k] for name, k in plan.outputs}, (), {})
