"""PyOpenCL runtime: one lazily created context and queue, and a cache of built programs.

PoCL keeps its own on-disk cache of compiled kernels (``POCL_CACHE_DIR``, read once at the first
``get_platforms()``), so an in-process dict keyed by source is all we add.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from ..errors import KernelgenError


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
