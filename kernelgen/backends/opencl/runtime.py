"""PyOpenCL runtime: one lazily created context and queue, and a cache of built programs.

PoCL keeps its own on-disk cache of compiled kernels (``POCL_CACHE_DIR``, read once at the first
``get_platforms()``), so an in-process dict keyed by source is all we add.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import KernelgenError


@dataclass(frozen=True)
class Device:
    context: Any
    queue: Any
    device: Any

    @property
    def name(self) -> str:
        return f"{self.device.platform.version} / {self.device.name.strip()}"


_lock = threading.Lock()
_device: Device | None = None
_programs: dict[str, Any] = {}


def _import_cl() -> Any:
    try:
        import pyopencl as cl
    except ImportError as exc:
        raise KernelgenError("the OpenCL backend needs pyopencl (pip install pyopencl "
                             "pocl-binary-distribution)") from exc
    return cl


_PROBE = "__kernel void kg_probe(__global float* x) { x[get_global_id(0)] += 1.0f; }"


def _usable(cl: Any, dev: Any) -> bool:
    """Whether ``dev`` can build a kernel. PoCL 3.0 from the pip wheel cannot on CPUs its LLVM 14
    does not know (it asks for target CPU 'generic'); Debian's PoCL targets a named ISA level."""
    try:
        cl.Program(cl.Context([dev]), _PROBE).build()
        return True
    except cl.Error:
        return False


def device() -> Device:
    """The OpenCL device kernels run on: ``PYOPENCL_CTX`` if set, else the first device (PoCL
    platforms first) that builds a probe kernel."""
    global _device
    with _lock:
        if _device is not None:
            return _device
        cl = _import_cl()
        try:
            if os.environ.get("PYOPENCL_CTX"):
                ctx = cl.create_some_context(interactive=False)
                dev = ctx.devices[0]
            else:
                platforms = sorted(cl.get_platforms(), key=lambda p: "PoCL" not in p.version)
                candidates = [d for p in platforms for d in p.get_devices()]
                dev = next(d for d in candidates if _usable(cl, d))
                ctx = cl.Context([dev])
        except (cl.Error, StopIteration) as exc:
            raise KernelgenError(
                "no OpenCL device that can build kernels was found; install PoCL "
                "(pip install pocl-binary-distribution, or on CPUs its LLVM does not know, "
                f"apt-get install pocl-opencl-icd) [{exc!r}]") from exc
        queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        _device = Device(ctx, queue, dev)
        return _device


def build(source: str, name: str) -> Any:
    """The compiled kernel ``name`` from ``source``, built once per process."""
    cl = _import_cl()
    with _lock:
        program = _programs.get(source)
    if program is None:
        dev = device()
        try:
            program = cl.Program(dev.context, source).build()
        except cl.RuntimeError as exc:
            raise KernelgenError(f"OpenCL build of kernel '{name}' failed:\n{exc}\n--- source "
                                 f"---\n{source}") from exc
        with _lock:
            _programs[source] = program
    return cl.Kernel(program, name)


class OpenCLRuntime:
    """Runs one generated kernel: builds it at first use, then enqueues it (after its packing
    kernel, when ``launch.pack`` is set). A kernel with ``launch.scratch`` takes a scratch
    buffer this runtime keeps after its outputs.

    Safe to call from several threads: a ``cl.Kernel``'s arguments are state shared by every
    caller (``clSetKernelArg`` then ``clEnqueueNDRangeKernel`` is not atomic), and the packing
    launch and the kernel share the scratch panels, so one lock covers setting the arguments
    and enqueueing both launches. The queue is in order, so another caller's pack cannot run
    between this caller's pack and the kernel that reads it."""

    def __init__(self, source: str, name: str, launch: Any, n_inputs: int = 0) -> None:
        self.source, self.name, self.geometry = source, name, launch
        self.n_inputs = n_inputs
        self._kernel: Any = None
        self._pack: Any = None
        self._scratch: Any = None
        self._lock = threading.Lock()

    def _compiled(self) -> Any:
        """The kernel (and its packing kernel and scratch), built once; call with the lock."""
        if self._kernel is None:
            kernel = build(self.source, self.name)
            if self.geometry.pack is not None:
                self._pack = build(self.source, f"{self.name}_pack")
            if self.geometry.scratch:
                cl = _import_cl()
                self._scratch = cl.Buffer(device().context, cl.mem_flags.READ_WRITE,
                                          4 * self.geometry.scratch)
            self._kernel = kernel
        return self._kernel

    def device_array(self, array: np.ndarray) -> Any:
        cl = _import_cl()
        mf = cl.mem_flags
        return cl.Buffer(device().context, mf.READ_ONLY | mf.COPY_HOST_PTR,
                         hostbuf=np.ascontiguousarray(array))

    def device_empty(self, buffer: Any) -> Any:
        cl = _import_cl()
        size = max(buffer.numel * buffer.dtype.itemsize, 1)
        return cl.Buffer(device().context, cl.mem_flags.READ_WRITE, size)

    def launch(self, handles: Sequence[Any]) -> None:
        cl = _import_cl()
        queue = device().queue
        with self._lock:
            kernel = self._compiled()
            if self._pack is not None:
                pack = self.geometry.pack
                self._pack.set_args(*handles[:self.n_inputs], self._scratch)
                cl.enqueue_nd_range_kernel(queue, self._pack, pack.global_size, pack.local_size)
            if self._scratch is not None:
                handles = [*handles, self._scratch]
            kernel.set_args(*handles)
            cl.enqueue_nd_range_kernel(queue, kernel, self.geometry.global_size,
                                       self.geometry.local_size)

    def sync(self) -> None:
        device().queue.finish()

    def to_host(self, handle: Any, out: np.ndarray) -> None:
        """Copy a device buffer into ``out`` once the queued launches are done."""
        cl = _import_cl()
        cl.enqueue_copy(device().queue, out, handle)
        self.sync()

    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        cl = _import_cl()
        handles = [self.device_array(a) for a in inputs]
        out_handles = [cl.Buffer(device().context, cl.mem_flags.WRITE_ONLY, max(o.nbytes, 1))
                       for o in outputs]
        self.launch([*handles, *out_handles])
        for o, h in zip(outputs, out_handles):
            cl.enqueue_copy(device().queue, o, h)
        self.sync()
