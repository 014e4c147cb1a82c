"""The kernel object every backend's kernels come in: source, JSON-serialisable metadata, and a
call. Each backend supplies a runtime with one small interface (``backends.base.Runtime``), so
this module and ``measure`` never ask which backend they hold. ``Executable`` is what
``kernelgen.compile`` returns: a ``Kernel`` or a ``Program`` of several, called alike."""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from ..backends import Runtime
from ..ir.loop import LoopKernel
from ..version import __version__
from .arguments import bind_inputs, bind_outputs, finish
from .bounds import check_indices


class Executable(Protocol):
    """What ``compile`` returns, one kernel or several, used alike: called on NumPy arrays (the
    block's inputs in ``fused.inputs`` order, or by name; ``out=``), launched on device buffers
    (``launch``), with ``source`` and JSON ``metadata``. Safe to call from several threads."""

    backend: str
    metadata: dict[str, Any]

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    def __call__(self, *arrays: Any, out: Any = None, **named: Any) -> Any: ...
    def launch(self, *handles: Any, wait: bool = True) -> None: ...
    def bound_launch(self, *handles: Any) -> Callable[[], None]: ...


class Kernel:
    """A generated kernel. ``kernel(*arrays)`` runs it on NumPy arrays and returns the output
    array (a tuple when the kernel has several outputs). ``metadata`` holds what a host program
    needs to launch ``source`` itself: argument order, dtypes, shapes, launch geometry.
    ``constants`` are the values of inputs built with ``kg.constant``: a call need not pass
    them, and the runtime keeps them on its device."""

    def __init__(self, loop: LoopKernel, backend: str, source: str, metadata: dict[str, Any],
                 runtime: Runtime, constants: Mapping[str, np.ndarray] | None = None) -> None:
        self.loop = loop
        self.backend = backend
        self.source = source
        self.metadata = metadata
        self.runtime = runtime
        self.constants = dict(constants or {})

    @property
    def name(self) -> str:
        return self.loop.name

    def __repr__(self) -> str:
        return f"<Kernel {self.name} on {self.backend}, schedule {self.metadata['schedule']}>"

    def __call__(self, *inputs: Any, out: Any = None, **named: Any
                 ) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run on NumPy arrays: the block's inputs in the order they were built (``fused.inputs``,
        ``metadata["args"]``), by position or by name (``kernel(data=d, indices=i)``); inputs
        that are constants may be left out. ``out`` may pass preallocated output arrays (one,
        or a tuple); it is returned."""
        callee = f"kernel '{self.name}'"
        arrays = bind_inputs(callee, self.loop.inputs, inputs, named, self.constants)
        check_indices(self.name, self.loop, arrays)
        written, returned = bind_outputs(callee, self.loop.outputs, out, arrays)
        keep = [self.constants.get(b.name) is a for b, a in zip(self.loop.inputs, arrays)]
        self.runtime.run(arrays, written, keep)
        return finish(written, returned)

    def launch(self, *handles: Any, wait: bool = True) -> None:
        """Run on device buffers (inputs then outputs, from ``runtime.device_array`` /
        ``device_empty``) without host copies. Benchmarks time this. Gather indices are not
        checked here (they are on the device): an index out of range reads a clamped one."""
        self.runtime.launch(handles)
        if wait:
            self.runtime.sync()

    def bound_launch(self, *handles: Any) -> Callable[[], None]:
        """``launch(*handles, wait=False)`` as a function, the arguments bound once
        (``Runtime.bound``): what a compiled model calls every run."""
        return self.runtime.bound(handles)


def metadata(loop: LoopKernel, backend: str, launch: dict[str, Any] | None,
             extra: dict[str, Any]) -> dict[str, Any]:
    """The metadata schema, the same for every backend (JSON-serialisable)."""
    args = [{"name": b.name, "role": role, "dtype": str(b.dtype), "shape": list(b.shape)}
            for role, bufs in (("input", loop.inputs), ("output", loop.outputs)) for b in bufs]
    meta = {
        "name": loop.name, "backend": backend, "kernelgen_version": __version__, "args": args,
        "launch": launch, "bytes_moved": loop.bytes_moved(), "flops": loop.flops(),
        "domain": [n for _, n in loop.domain], **extra,
    }
    json.dumps(meta)  # the schema promises JSON; fail here rather than in a caller
    return meta
