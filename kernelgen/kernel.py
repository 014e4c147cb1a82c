"""The kernel object every backend returns: source, JSON-serialisable metadata, and a call."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import ArgumentError, UnsupportedError
from .loop_ir import Buffer, LoopKernel

BACKENDS = ("opencl",)


class Kernel:
    """A generated kernel. ``kernel(*arrays)`` runs it on NumPy arrays and returns the output
    array (a tuple when the kernel has several outputs). ``metadata`` holds everything a host
    program needs to launch ``source`` itself: argument order, dtypes, shapes, launch geometry."""

    def __init__(self, loop: LoopKernel, backend: str, source: str, metadata: dict[str, Any],
                 launch: Any) -> None:
        self.loop = loop
        self.backend = backend
        self.source = source
        self.metadata = metadata
        self._launch = launch
        self._compiled: Any = None

    @property
    def name(self) -> str:
        return self.loop.name

    def __repr__(self) -> str:
        return f"<Kernel {self.name} on {self.backend}, schedule {self.metadata['schedule']}>"

    # --- argument checking ------------------------------------------------------------------

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

    # --- running ------------------------------------------------------------------------------

    def __call__(self, *inputs: Any, out: Any = None) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run on NumPy arrays; ``out`` may pass preallocated output arrays."""
        arrays = self._check_inputs(inputs)
        outs = self._outputs(out)
        self._run(arrays, outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        if self.backend == "opencl":
            import pyopencl as cl

            from .runtime import opencl as rt

            dev = rt.device()
            mf = cl.mem_flags
            bufs = [cl.Buffer(dev.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
                    for a in inputs]
            out_bufs = [cl.Buffer(dev.context, mf.WRITE_ONLY, max(o.nbytes, 1)) for o in outputs]
            self.launch(*bufs, *out_bufs)
            for o, b in zip(outputs, out_bufs):
                cl.enqueue_copy(dev.queue, o, b)
            dev.queue.finish()
            return
        raise UnsupportedError(self.backend, "a runtime", self.name)

    def launch(self, *buffers: Any, wait: bool = True) -> Any:
        """Enqueue on device buffers (inputs then outputs) without host copies; returns the
        event. Benchmarks use this to time the kernel alone."""
        from .runtime import opencl as rt

        if self._compiled is None:
            self._compiled = rt.build(self.source, self.name)
        dev = rt.device()
        self._compiled.set_args(*buffers)
        import pyopencl as cl

        event = cl.enqueue_nd_range_kernel(dev.queue, self._compiled, self._launch.global_size,
                                           self._launch.local_size)
        if wait:
            event.wait()
        return event


def _check_array(kernel: str, buf: Buffer, arr: np.ndarray, role: str) -> None:
    if arr.shape != buf.shape:
        raise ArgumentError(f"kernel '{kernel}': {role} '{buf.name}' expected shape {buf.shape}, "
                            f"got {arr.shape}")
    if arr.dtype != buf.dtype.numpy:
        raise ArgumentError(f"kernel '{kernel}': {role} '{buf.name}' expected dtype {buf.dtype}, "
                            f"got {arr.dtype}")


def metadata(loop: LoopKernel, backend: str, launch: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """The backend-independent metadata schema (JSON-serialisable)."""
    from . import __version__

    args = [{"name": b.name, "role": role, "dtype": str(b.dtype), "shape": list(b.shape)}
            for role, bufs in (("input", loop.inputs), ("output", loop.outputs)) for b in bufs]
    meta = {
        "name": loop.name, "backend": backend, "kernelgen_version": __version__, "args": args,
        "launch": {"global_size": list(launch.global_size),
                   "local_size": list(launch.local_size) if launch.local_size else None},
        "bytes_moved": loop.bytes_moved(), "flops": loop.flops(),
        "domain": [n for _, n in loop.domain], **extra,
    }
    json.dumps(meta)  # the schema promises JSON; fail here rather than in a caller
    return meta


def emit(loop: LoopKernel, backend: str = "opencl", **options: Any) -> Kernel:
    """Generate a kernel for ``backend`` ('opencl'). Options are the backend's tunables."""
    if backend == "opencl":
        from .emit.opencl import emit_opencl

        source, launch, extra = emit_opencl(loop, **options)
        return Kernel(loop, backend, source, metadata(loop, backend, launch, extra), launch)
    raise UnsupportedError(backend, "an emitter", f"kernel '{loop.name}' (backends: {BACKENDS})")
