"""Run generated NEON kernels on real AArch64 instruction semantics: cross-compile them with
``aarch64-linux-gnu-gcc -static`` into one harness and run it under ``qemu-aarch64``, by default
as a Cortex-A53 (ARMv8.0: proves no later instruction is used).

Debian: ``apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user``. Timings under
qemu say nothing about ARM speed; this is a correctness check.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import KernelgenError, UnsupportedError
from .. import templates
from .language import header as neon_header

CROSS_CC = "aarch64-linux-gnu-gcc"


def tools() -> tuple[str, str]:
    """(cross compiler, emulator), or UnsupportedError naming what is missing."""
    cc = shutil.which(CROSS_CC)
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if not cc or not qemu:
        missing = [name for name, found in ((CROSS_CC, cc), ("qemu-aarch64", qemu)) if not found]
        raise UnsupportedError("neon-aarch64", " and ".join(missing) + " (apt-get install "
                               "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)",
                               "the AArch64 check")
    return cc, qemu


def build_harness(kernels: Sequence[Any], workdir: Path) -> Path:
    """One static AArch64 executable holding every kernel (``kernelgen.Kernel`` from
    ``emit("neon")``), dispatched by index."""
    cc, _ = tools()
    sources = [k.runtime.source for k in kernels]
    helpers: dict[str, str] = {}
    for s in sources:
        helpers.update(s.helpers)
    declarations, table = [], []
    for k, s in zip(kernels, sources):
        declarations.append(f"void {s.function_name}();")
        sizes = [b.numel * b.dtype.itemsize for b in k.loop.inputs + k.loop.outputs]
        table.append(f"    {{(void (*)(void)){s.function_name}, {len(k.loop.inputs)}, "
                     f"{len(k.loop.outputs)}, {{{', '.join(map(str, sizes))}}}}},")
    code = "\n".join([neon_header(), *helpers.values(), *(s.function for s in sources)])
    harness = templates.render("neon", "harness.c", declarations="\n".join(declarations),
                               table="\n".join(table))
    (workdir / "kernels.c").write_text(code)
    (workdir / "harness.c").write_text(harness)
    exe = workdir / "harness"
    result = subprocess.run([cc, "-O2", "-std=gnu11", "-ffp-contract=off", "-march=armv8-a",
                             "-static", "-fopenmp",
                             str(workdir / "kernels.c"), str(workdir / "harness.c"), "-o",
                             str(exe), "-lm"], capture_output=True, text=True)
    if result.returncode:
        raise KernelgenError(f"AArch64 cross-compile failed:\n{result.stderr[-4000:]}")
    return exe


def run(exe: Path, kernels: Sequence[Any], inputs: Sequence[Sequence[np.ndarray]],
        workdir: Path, cpu: str = "cortex-a53") -> list[tuple[np.ndarray, ...]]:
    """Run kernel ``i`` on ``inputs[i]`` under qemu; returns each kernel's outputs."""
    _, qemu = tools()
    lines, outputs = [], []
    for index, (kernel, arrays) in enumerate(zip(kernels, inputs)):
        paths = []
        for k, (buf, arr) in enumerate(zip(kernel.loop.inputs, arrays)):
            path = workdir / f"k{index}_in{k}.bin"
            np.ascontiguousarray(arr, dtype=buf.dtype.numpy).tofile(path)
            paths.append(str(path))
        outs = [workdir / f"k{index}_out{k}.bin" for k in range(len(kernel.loop.outputs))]
        lines.append(" ".join([str(index), *paths, *map(str, outs)]))
        outputs.append(outs)
    jobs = workdir / "jobs.txt"
    jobs.write_text("\n".join(lines) + "\n")
    result = subprocess.run([qemu, "-cpu", cpu, str(exe), str(jobs)], capture_output=True,
                            text=True, timeout=1800, env={"OMP_NUM_THREADS": "2"})
    if result.returncode:
        raise KernelgenError(f"harness failed under qemu ({result.returncode}): {result.stderr}")
    return [tuple(np.fromfile(p, dtype=b.dtype.numpy).reshape(b.shape)
                  for p, b in zip(outs, k.loop.outputs)) for outs, k in zip(outputs, kernels)]
