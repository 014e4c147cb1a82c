"""The kernel object every backend returns: source, JSON-serialisable metadata, and a call.

Each backend supplies a runtime with one small interface (``run`` on host arrays, and the
device-buffer trio ``device_array``/``device_empty``/``launch`` plus ``sync`` that benchmarks
use), so this module and ``bench`` never ask which backend they hold.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from .errors import ArgumentError, UnsupportedError
from .loop_ir import Buffer, LoopKernel


class Runtime(Protocol):
    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None: ...
    def device_array(self, array: np.ndarray) -> Any: ...
    def device_empty(self, buffer: Buffer) -> Any: ...
    def launch(self, handles: Sequence[Any]) -> None: ...
    def sync(self) -> None: ...
    def to_host(self, handle: Any, out: np.ndarray) -> None: ...


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
    from . import __version__

    args = [{"name": b.name, "role": role, "dtype": str(b.dtype), "shape": list(b.shape)}
            for role, bufs in (("input", loop.inputs), ("output", loop.outputs)) for b in bufs]
    meta = {
        "name": loop.name, "backend": backend, "kernelgen_version": __version__, "args": args,
        "launch": launch, "bytes_moved": loop.bytes_moved(), "flops": loop.flops(),
        "domain": [n for _, n in loop.domain], **extra,
    }
    json.dumps(meta)  # the schema promises JSON; fail here rather than in a caller
    return meta


def _scratch(elements: int) -> dict[str, Any]:
    """Launch metadata for a scratch buffer of ``elements`` float32 (panels of a packed
    operand) that the host allocates once and passes after the outputs; none when 0."""
    if not elements:
        return {}
    return {"args": "the inputs, the outputs, then the scratch buffer",
            "scratch_bytes": 4 * elements}


def _emit_opencl(loop: LoopKernel, **options: Any) -> Kernel:
    from .emit.opencl import emit_opencl
    from .runtime.opencl import OpenCLRuntime

    source, launch, extra = emit_opencl(loop, **options)
    geometry: dict[str, Any] = {
        "global_size": list(launch.global_size),
        "local_size": list(launch.local_size) if launch.local_size else None}
    geometry.update(_scratch(launch.scratch))
    if launch.pack is not None:  # launched first, filling the scratch buffer
        geometry["pack"] = {"kernel": f"{loop.name}_pack",
                            "global_size": list(launch.pack.global_size),
                            "local_size": list(launch.pack.local_size),
                            "args": "the inputs, then the scratch buffer"}
    runtime = OpenCLRuntime(source, loop.name, launch, len(loop.inputs))
    return Kernel(loop, "opencl", source, metadata(loop, "opencl", geometry, extra), runtime)


def _emit_neon(loop: LoopKernel, **options: Any) -> Kernel:
    from .emit.neon import emit_neon
    from .runtime.neon import NeonRuntime

    source, extra = emit_neon(loop, **options)
    runtime = NeonRuntime(source, len(loop.inputs) + len(loop.outputs))
    return Kernel(loop, "neon", source.text, metadata(loop, "neon", None, extra), runtime)


def _emit_triton(loop: LoopKernel, **options: Any) -> Kernel:
    from .emit.triton import emit_triton
    from .runtime.triton import TritonRuntime

    source, launch, extra = emit_triton(loop, **options)
    launch.update(_scratch(source.scratch))
    runtime = TritonRuntime(source, loop, launch)
    return Kernel(loop, "triton", source.text, metadata(loop, "triton", launch, extra), runtime)


BACKENDS: dict[str, Callable[..., Kernel]] = {
    "opencl": _emit_opencl, "neon": _emit_neon, "triton": _emit_triton}


def emit(loop: LoopKernel, backend: str = "opencl", **options: Any) -> Kernel:
    """Generate a kernel for ``backend`` ('opencl', 'neon', 'triton'). Options are the
    backend's tunables (see each emitter)."""
    if backend not in BACKENDS:
        raise UnsupportedError(backend, "an emitter",
                               f"kernel '{loop.name}' (backends: {', '.join(BACKENDS)})")
    return BACKENDS[backend](loop, **options)
