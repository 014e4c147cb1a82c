"""Run generated Triton modules: on a CUDA GPU when there is one, else through Triton's
interpreter on CPU tensors (``TRITON_INTERPRET=1`` must be set before ``triton`` is imported:
one Triton mode per process).

Modules are written to a stable file under the cache directory (Triton reads a kernel's source
from its file) with an atomic rename, then imported once per process.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ...errors import UnsupportedError
from ...ir.loop import LoopKernel
from ...options import writable_cache_dir
from .language import TritonSource

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _torch() -> Any:
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        raise UnsupportedError("triton", "the triton and torch packages (pip install triton "
                               "torch==2.13.0)", "running Triton kernels") from exc
    return torch


def device() -> str:
    """'cuda' when a GPU runs the kernels, 'cpu' under the interpreter."""
    torch = _torch()
    if not interpreted() and torch.cuda.is_available():
        return "cuda"
    if interpreted():
        return "cpu"
    raise UnsupportedError("triton", "a CUDA GPU, or TRITON_INTERPRET=1 set before importing "
                           "triton", "running Triton kernels")


def module_dir() -> Path:
    """Where generated modules are written (``kernelgen/triton`` under the cache directory, or,
    when that cannot be written, a private directory for this process: ``options``)."""
    return writable_cache_dir("triton")


def load_module(name: str, text: str) -> ModuleType:
    """Import the generated module ``name`` (written atomically if not there yet)."""
    with _lock:
        if name in _modules:
            return _modules[name]
        path = module_dir() / f"{name}.py"
        if not path.exists() or path.read_text() != text:
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".py.tmp")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _modules[name] = module
        return module


# Triton's interpreter keeps the running kernel's state in module globals (the grid, the
# program ids), so two threads interpreting at once corrupt each other's launch; on a GPU,
# launches from several threads are safe.
_interpreter_lock = threading.Lock()


class TritonRuntime:
    """Launches one generated Triton kernel over its grid (with a scratch buffer of its own per
    launch, when the kernel packs panels into one: launches from several threads, on any
    stream, never share panels; the caching allocator makes it cheap)."""

    def __init__(self, source: TritonSource, loop: LoopKernel) -> None:
        self.source, self.loop = source, loop
        self.grid = source.grid
        self.constexprs = dict(source.constexprs)
        self._fn: Any = None
        self._kept: dict[int, tuple[np.ndarray, Any]] = {}  # constants on the device
        self._lock = threading.Lock()

    def _kernel(self) -> Any:
        if self._fn is None:
            module = load_module(self.source.module_name, self.source.text)
            self._fn = getattr(module, self.source.function)
        return self._fn

    def device_array(self, array: np.ndarray) -> Any:
        torch = _torch()
        return torch.from_numpy(np.ascontiguousarray(array)).to(device())

    def _constant(self, index: int, array: np.ndarray) -> Any:
        """A kernel object's constant input on the device, copied there once."""
        with self._lock:
            kept = self._kept.get(index)
            if kept is None or kept[0] is not array:
                kept = (array, self.device_array(array))
                self._kept[index] = kept
            return kept[1]

    def device_empty(self, buffer: Any) -> Any:
        torch = _torch()
        return torch.empty(buffer.shape, dtype=_torch_dtype(torch, buffer.dtype.numpy),
                           device=device())

    def launch(self, handles: Sequence[Any]) -> None:
        scratch = []
        if self.source.scratch:
            torch = _torch()
            scratch.append(torch.empty(self.source.scratch, dtype=torch.float32,
                                       device=device()))
        kernel = self._kernel()
        if interpreted():
            with _interpreter_lock:
                kernel[self.grid](*handles, *scratch, **self.constexprs)
        else:
            # no contraction of a * b - c into an FMA: the kernels round a product once and
            # expect the same rounded value wherever they recompute it (a row's max pass and
            # store pass); fused, log_softmax(s * x) at a 2e30 max gave -7e22, not 0 (H200)
            kernel[self.grid](*handles, *scratch, **self.constexprs, enable_fp_fusion=False)

    def bound(self, handles: Sequence[Any]) -> Callable[[], None]:
        handles = list(handles)
        return lambda: self.launch(handles)

    def write(self, handle: Any, array: np.ndarray) -> None:
        torch = _torch()
        handle.copy_(torch.from_numpy(np.ascontiguousarray(array)))

    def read(self, handle: Any, out: np.ndarray) -> None:
        self.to_host(handle, out)

    def sync(self) -> None:
        torch = _torch()
        if device() == "cuda":
            torch.cuda.synchronize()

    def view(self, handle: Any, offset: int, buffer: Any) -> Any:
        return handle.reshape(-1)[offset:offset + buffer.numel].view(buffer.shape)

    def to_host(self, handle: Any, out: np.ndarray) -> None:
        """Copy a device tensor into ``out`` once the queued launches are done."""
        self.sync()
        out[...] = handle.cpu().numpy()

    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray],
            keep: Sequence[bool] = ()) -> None:
        handles = [self._constant(i, a) if i < len(keep) and keep[i] else self.device_array(a)
                   for i, a in enumerate(inputs)]
        out_handles = [self.device_empty(b) for b in self.loop.outputs]
        self.launch([*handles, *out_handles])
        self.sync()
        for out, handle in zip(outputs, out_handles):
            out[...] = handle.cpu().numpy()


def _torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    return {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64,
            "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}[np.dtype(dtype).name]
