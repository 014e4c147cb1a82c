"""Build NEON C kernels into shared libraries and call them on NumPy arrays.

On x86 the source compiles through SIMDe's NEON headers (pip ``cmeel-simde``); on AArch64 it uses
``arm_neon.h``. Libraries are cached on disk under a key of the code, the compiler command and
version, and the CPU, and written atomically (compile to a private temporary, then
``os.replace``), so a crash or two processes building the same kernel never leave a torn file.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import KernelgenError, UnsupportedError
from ...options import cache_dir as kernelgen_cache_dir
from ...options import writable_cache_dir
from . import concurrent_groups
from .language import NeonSource, header

_lock = threading.Lock()
_libraries: dict[Path, ctypes.CDLL] = {}
_damaged: set[Path] = set()  # cached files that did not load and could not be removed


def cache_dir() -> Path:
    """Where built libraries are written (``kernelgen/neon`` under the cache directory, or,
    when that cannot be written, a private directory for this process: ``options``)."""
    return writable_cache_dir("neon")


def _library(key: str) -> Path:
    """The library built under ``key``: in the cache directory, even a read-only one, if it
    is there; else where ``build`` writes it."""
    path = kernelgen_cache_dir("neon") / f"{key}.so"
    return path if path not in _damaged and path.is_file() else cache_dir() / f"{key}.so"


def simde_include() -> str | None:
    """An include directory holding simde/arm/neon.h (``KERNELGEN_SIMDE_INCLUDE`` first, then
    pip's cmeel-simde)."""
    candidates = [os.environ.get("KERNELGEN_SIMDE_INCLUDE", "")]
    candidates.append(str(Path(sysconfig.get_paths()["purelib"]) / "cmeel.prefix" / "include"))
    for c in candidates:
        if c and (Path(c) / "simde" / "arm" / "neon.h").is_file():
            return c
    return None


@functools.cache
def toolchain() -> tuple[list[str], str]:
    """(compile command prefix, identity for the cache key) of the host C compiler."""
    cc = os.environ.get("CC", "gcc")
    if not shutil.which(cc):
        raise UnsupportedError("neon", f"a C compiler ('{cc}' not found; apt-get install gcc)",
                               "building NEON kernels")
    # --no-undefined: a missing symbol fails the build here, not every kernel at dlopen.
    # -ffp-contract=off: GNU C contracts a * b - c into one FMA, which keeps the product
    # exact where the kernel's other pass rounded it: log_softmax(x1 * x0) at the row's max
    # (2e30) gave -7e22 instead of 0 (the fuzzer's seed 9). FMAs the kernels want are
    # written as intrinsics (vfmaq), which the flag leaves alone.
    flags = [cc, "-O3", "-std=gnu11", "-ffp-contract=off", "-fPIC", "-shared", "-fopenmp",
             "-Wl,--no-undefined"]
    if platform.machine().lower() in ("aarch64", "arm64"):
        flags.append("-mcpu=native")
    else:
        include = simde_include()
        if include is None:
            raise UnsupportedError("neon", "SIMDe headers (pip install cmeel-simde)",
                                   "compiling NEON intrinsics on a non-ARM host")
        flags += ["-march=native", f"-I{include}"]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    if "clang" not in version:
        # GCC 12.2 at -O3 with masked loads (AVX2, AVX-512) if-converts a scalar loop of
        # guarded reads with a negative stride into wrong code: a slice with step -2 concatenated
        # with itself read x[2*i + j + 2] for x[3*i - 2*j + 2] (test_fusion's random blocks).
        # The kernels' explicit vectors do not rely on if-conversion.
        flags.append("-fno-tree-loop-if-convert")
    return flags, version.splitlines()[0] + "|" + _cpu_identity()


def _cpu_identity() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = [line.split(":", 1)[1].strip() for line in info.splitlines()
              if line.startswith(("model name", "flags", "Features"))][:2]
    return platform.machine() + "|" + hashlib.sha256("|".join(fields).encode()).hexdigest()[:16]


def library_key(code: str) -> str:
    flags, identity = toolchain()
    return hashlib.sha256("\0".join([code, " ".join(flags), identity]).encode()).hexdigest()[:24]


def build(units: Sequence[tuple[str, str]], common: str) -> None:
    """Compile ``units`` ((key, code) pairs whose keys are missing from the cache) into one
    library and publish it under every key. ``common`` is the translation unit's text."""
    missing = [key for key, _ in units if not _library(key).exists()]
    if not missing:
        return
    flags, _ = toolchain()
    directory = cache_dir()
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        source = Path(tmp) / "kernels.c"
        source.write_text(common)
        output = Path(tmp) / "kernels.so"
        result = subprocess.run([*flags, str(source), "-o", str(output), "-lm"],
                                capture_output=True, text=True)
        if result.returncode:
            raise KernelgenError(f"NEON build failed ({' '.join(flags)}):\n{result.stderr}\n"
                                 f"--- source ---\n{common}")
        for key in missing:  # publish atomically: a reader sees no file or a complete one
            staged = Path(tmp) / f"{key}.so"
            os.link(output, staged)
            os.replace(staged, directory / f"{key}.so")


def load(key: str, function: str, n_args: int, rebuild: Any) -> Any:
    """The C function ``function`` from the library cached under ``key``; ``rebuild()`` runs
    first if the file is missing, and again once if it does not load (a damaged file)."""
    path = _library(key)
    with _lock:
        lib = _libraries.get(path)
    if lib is None:
        if not path.exists():
            rebuild()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            try:
                path.unlink(missing_ok=True)
            except OSError:  # a read-only cache: build a fresh copy where we can write
                _damaged.add(path)
            rebuild()
            path = _library(key)
            lib = ctypes.CDLL(str(path))
        with _lock:
            _libraries[path] = lib
    fn = getattr(lib, function)
    fn.argtypes = [ctypes.c_void_p] * n_args
    fn.restype = None
    return fn


def call(fn: Any, arrays: Sequence[np.ndarray]) -> None:
    fn(*(a.ctypes.data_as(ctypes.c_void_p) for a in arrays))


def build_kernels(sources: Sequence[Any]) -> None:
    """Compile many kernels' ``NeonSource``s in one translation unit (one SIMDe parse)."""
    units, helpers, functions = [], {}, []
    for src in sources:
        assert isinstance(src, NeonSource)
        units.append((library_key(src.code), src.text))
        helpers.update(src.helpers)
        functions.append(src.function)
    if not units:
        return
    build(units, "\n".join([header(), *helpers.values(), *functions]))


class NeonRuntime:
    """Runs one NEON kernel from its cached shared library."""

    def __init__(self, source: Any, n_args: int) -> None:
        self.source = source
        self.n_args = n_args
        self._fn: Any = None

    def _compiled(self) -> Any:
        if self._fn is None:
            key = library_key(self.source.code)
            self._fn = load(key, self.source.function_name, self.n_args,
                            rebuild=lambda: build([(key, self.source.text)], self.source.text))
        return self._fn

    def device_array(self, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(array)

    def device_empty(self, buffer: Any) -> np.ndarray:
        return np.empty(buffer.shape, buffer.dtype.numpy)

    def launch(self, handles: Sequence[Any]) -> None:
        call(self._compiled(), handles)

    def bound(self, handles: Sequence[Any]) -> Callable[[], None]:
        """The call on ``handles`` with their pointers taken once (each keeps its array)."""
        fn = self._compiled()
        pointers = [a.ctypes.data_as(ctypes.c_void_p) for a in handles]
        return lambda: fn(*pointers)

    def write(self, handle: np.ndarray, array: np.ndarray) -> None:
        np.copyto(handle, array)

    def read(self, handle: np.ndarray, out: np.ndarray) -> None:
        out[...] = handle

    # a kernel allocates its scratch per call: any may run in a concurrent group
    concurrent_safe = True

    def concurrently(self, groups: Sequence[Sequence[Callable[[], None]]]) -> None:
        """IOS's parallel stage: the groups on threads of their own (``concurrent_groups.py``)."""
        concurrent_groups.concurrently(groups)

    def sync(self) -> None:
        """Calls are synchronous."""

    def to_host(self, handle: np.ndarray, out: np.ndarray) -> None:
        out[...] = handle

    def view(self, handle: np.ndarray, offset: int, buffer: Any) -> np.ndarray:
        return handle.reshape(-1)[offset:offset + buffer.numel].reshape(buffer.shape)

    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray],
            keep: Sequence[bool] = ()) -> None:
        """On the arrays themselves: the function runs on host memory."""
        call(self._compiled(), [*inputs, *outputs])
