"""The kernel object every backend's kernels come in: source, JSON-serialisable metadata, and a
call. Each backend supplies a runtime with one small interface (``backends.base.Runtime``), so
this module and ``measure`` never ask which backend they hold. ``Executable`` is what
``kernelgen.compile`` returns: a ``Kernel`` or a ``Program`` of several, called alike."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..backends import Runtime
from ..errors import ArgumentError
from ..ir.loop import Buffer, LoopKernel
from ..version import __version__


class Executable(Protocol):
    """What ``compile`` returns, one kernel or several: called on NumPy arrays (the block's
    inputs, in ``fused.inputs`` order), with ``source`` and JSON ``metadata``."""

    backend: str
    metadata: dict[str, Any]

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    def __call__(self, *arrays: Any) -> Any: ...


class Kernel:
    """A generated kernel. ``kernel(*arrays)`` runs it on NumPy arrays and returns the output
    array (a tuple when the kernel has several outputs). ``metadata`` holds what a host program
    needs to launch ``source`` itself: argument order, dtypes, shapes, launch geometry."""

    def __init__(self, loop: LoopKernel, backend: str, source: str, metadata: dict[str, Any],
                 runtime: Runtime) -> None:
        self.loop = loop
        self.backend = backend
        self.source = source
        self.metadata = metadata
        self.runtime = runtime

    @property
    def name(self) -> str:
        return self.loop.name

    def __repr__(self) -> str:
        return f"<Kernel {self.name} on {self.backend}, schedule {self.metadata['schedule']}>"

    def _check_inputs(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        params = self.loop.inputs
        if len(arrays) != len(params):
            names = ", ".join(b.name for b in params)
            raise ArgumentError(f"kernel '{self.name}' takes {len(params)} inputs ({names}), "
                                f"got {len(arrays)}")
        checked = []
        for buf, arr in zip(params, arrays):
            arr = np.asarray(arr)
            _check_array(self.name, buf, arr, "input")
            checked.append(np.ascontiguousarray(arr))
        return checked

    def _outputs(self, out: Any) -> list[np.ndarray]:
        if out is None:
            return [np.empty(b.shape, b.dtype.numpy) for b in self.loop.outputs]
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(self.loop.outputs):
            raise ArgumentError(f"kernel '{self.name}' has {len(self.loop.outputs)} outputs, "
                                f"got {len(outs)} arrays in out=")
        for buf, arr in zip(self.loop.outputs, outs):
            _check_array(self.name, buf, arr, "output")
            if not arr.flags.c_contiguous:
                raise ArgumentError(f"kernel '{self.name}': output '{buf.name}' must be "
                                    f"C-contiguous")
        return outs

    def __call__(self, *inputs: Any, out: Any = None) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run on NumPy arrays; ``out`` may pass preallocated output arrays."""
        arrays = self._check_inputs(inputs)
        outs = self._outputs(out)
        self.runtime.run(arrays, outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def launch(self, *handles: Any, wait: bool = True) -> None:
        """Run on device buffers (inputs then outputs, from ``runtime.device_array`` /
        ``device_empty``) without host copies. Benchmarks time this."""
        self.runtime.launch(handles)
        if wait:
            self.runtime.sync()


def _check_array(kernel: str, buf: Buffer, arr: np.ndarray, role: str) -> None:
    if arr.shape != buf.shape:
        raise ArgumentError(f"kernel '{kernel}': {role} '{buf.name}' expected shape {buf.shape}, "
                            f"got {arr.shape}")
    if arr.dtype != buf.dtype.numpy:
        raise ArgumentError(f"kernel '{kernel}': {role} '{buf.name}' expected dtype {buf.dtype}, "
                            f"got {arr.dtype}")


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
