"""A compiled model written out as files, enough for another compiler or a host program in
another language to run it without Python: ``export(session, directory)``.

    DIR/manifest.json                   what follows, as one JSON object
    DIR/kernels/k3_fused_conv_relu.cl   each kernel's source (a program: one file per stage;
                                        kernels of one source, such as the stages of programs
                                        that blocks of one structure share, name one file)
    DIR/constants/b7_conv1.weight.npy   each constant buffer a launch reads from the device
    DIR/constants/k3_w_winograd.npy     constants a program folded into its own form

The manifest holds the model's inputs and outputs (name, buffer, shape, dtype), every buffer
(role, shape, dtype, bytes; an intermediate's slot in the liveness-shared memory, or the buffer
it is a contiguous view of and the element offset; a constant's file), the slots, the kernels
(source files and the metadata a host needs to launch them: argument order, shapes, launch
geometry; a program's stages in launch order) and the launches
in order, each a kernel and the buffers it takes (its inputs, then its outputs), and the
schedule when there is one: stages of launch indices, a stage's groups free to run at once.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .. import backends
from ..exec import Executable, Program
from ..version import __version__
from .executor import CompiledModel
from .model import Graph
from .plan import Plan

MANIFEST = "manifest.json"


class Compiled(Protocol):
    """What ``export`` writes: a ``Session`` (``session.py``, which imports this module)."""

    graph: Graph
    model: CompiledModel
    fusion: str

    @property
    def plan(self) -> Plan: ...


def export(session: Compiled, directory: str | Path) -> Path:
    """Write ``session``'s kernels, constants and plan under ``directory`` (created if need
    be); returns the manifest's path."""
    root = Path(directory)
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    (root / "constants").mkdir(exist_ok=True)
    plan = session.plan
    suffix = "." + backends.get(plan.backend).suffix.lstrip(".")
    constants = session.model.constants
    buffers = []
    for b in plan.buffers:
        entry: dict[str, Any] = {"id": b.id, "name": b.name, "role": b.role, "dtype": b.dtype,
                                 "shape": list(b.shape), "nbytes": b.nbytes, "slot": b.slot}
        if b.role == "constant":
            entry["resident"] = b.resident
            entry["file"] = _save(root, f"b{b.id}_{b.name}", constants[b.name])
        if b.view_of is not None:  # the elements of buffer view_of from offset on
            entry["view_of"], entry["offset"] = b.view_of, b.offset
        buffers.append(entry)
    written: dict[str, str] = {}  # source -> its file, each source written once
    kernels = [_kernel(root, k, exe, suffix, plan.kernels[k].uses, written)
               for k, exe in enumerate(session.model.executables)]
    manifest = {
        "kernelgen_version": __version__, "model": session.graph.name, "backend": plan.backend,
        "fusion": session.fusion,
        "inputs": [{"name": plan.buffers[k].name, "buffer": k} for k in plan.inputs],
        "outputs": [{"name": name, "buffer": k} for name, k in plan.outputs],
        "buffers": buffers,
        "slots": [{"id": s.id, "dtype": s.dtype, "numel": s.numel, "nbytes": s.nbytes}
                  for s in plan.slots],
        "kernels": kernels,
        "launches": [{"kernel": launch.kernel, "ops": list(launch.ops),
                      "args": list(launch.args)} for launch in plan.launches],
        "memory": plan.memory(),
        # stages of launch indices: groups in one stage may run concurrently (``ios.py``)
        "schedule": plan.schedule.to_dict() if plan.schedule is not None else None,
    }
    path = root / MANIFEST
    path.write_text(json.dumps(manifest, indent=1))
    return path


def _kernel(root: Path, k: int, exe: Executable, suffix: str, uses: int,
            written: dict[str, str]) -> dict[str, Any]:
    """One executable's files and manifest entry; ``written`` the sources written so far."""
    entry: dict[str, Any] = {"id": k, "name": exe.name, "uses": uses}
    if isinstance(exe, Program):
        entry["kind"] = "program"
        entry["files"] = [_write(root, f"k{k}_s{i}_{stage.name}{suffix}", stage.source,
                                  written)
                          for i, stage in enumerate(exe.kernels)]
        entry["folded"] = {name: _save(root, f"k{k}_{name}", value)
                           for name, value in sorted(exe.folded.items())}
    else:
        entry["kind"] = "kernel"
        entry["files"] = [_write(root, f"k{k}_{exe.name}{suffix}", exe.source, written)]
    entry["metadata"] = exe.metadata
    return entry


def _safe(name: str) -> str:
    """A file name from a tensor or kernel name ('sm/Flatten' -> 'sm_Flatten')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _write(root: Path, name: str, text: str, written: dict[str, str]) -> str:
    """The file holding ``text``: written under ``name`` unless an earlier kernel's is."""
    if text not in written:
        written[text] = f"kernels/{_safe(name)}"
        (root / written[text]).write_text(text)
    return written[text]


def _save(root: Path, stem: str, value: Any) -> str:
    relative = f"constants/{_safe(stem)}.npy"
    np.save(root / relative, np.asarray(value), allow_pickle=False)
    return relative
