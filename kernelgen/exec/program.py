"""A program: several kernels of one backend run in order, wired by buffer name, called like one
kernel. Convolution algorithms that need more than one pass (im2col + GEMM, Winograd's
transforms around a batched GEMM) return one.

Stages whose inputs are all constants (Winograd's filter transform of constant weights) ran
once when the program was built; their results are ``folded`` constants, and the original
constant they came from must be passed unchanged (checked, since a different value would
otherwise be silently ignored).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends import get as get_backend
from ..errors import ArgumentError
from ..ir.node import Constant, Value
from ..version import __version__
from .kernel import Kernel


class Program:
    """Kernels run in order on named buffers. ``program(*arrays)`` takes the arrays of
    ``inputs`` (those of the fused block it implements) and returns the last stage's output."""

    def __init__(self, name: str, backend: str, inputs: Sequence[Value], kernels: Sequence[Kernel],
                 folded: dict[str, np.ndarray], info: dict[str, Any]) -> None:
        self._name = name
        self.backend = backend
        self.inputs = tuple(inputs)
        self.kernels = tuple(kernels)
        self.folded = dict(folded)
        produced = {b.name for k in self.kernels for b in k.loop.outputs}
        needed = {b.name for k in self.kernels for b in k.loop.inputs} - produced
        self.used = tuple(v for v in self.inputs if v.name in needed)
        self.metadata = _metadata(self, info)

    @property
    def name(self) -> str:
        return self._name

    @property
    def source(self) -> str:
        """Every stage's source, in launch order, each under a comment naming the stage."""
        mark = get_backend(self.backend).comment
        return "\n\n".join(f"{mark} ---- stage {i}: {k.name} ----\n{k.source}"
                           for i, k in enumerate(self.kernels))

    def __repr__(self) -> str:
        return (f"<Program {self.name} on {self.backend}: {self.metadata['algorithm']}, "
                f"{len(self.kernels)} kernels>")

    def bind(self, *arrays: Any) -> dict[str, np.ndarray]:
        """Check ``arrays`` against ``inputs``; return every external buffer by name (folded
        constants included)."""
        if len(arrays) != len(self.inputs):
            names = ", ".join(v.name for v in self.inputs)
            raise ArgumentError(f"program '{self.name}' takes {len(self.inputs)} inputs "
                                f"({names}), got {len(arrays)}")
        env: dict[str, np.ndarray] = dict(self.folded)
        for value, arr in zip(self.inputs, arrays):
            arr = np.asarray(arr)
            if arr.shape != value.shape or arr.dtype != value.dtype.numpy:
                raise ArgumentError(f"program '{self.name}': input '{value.name}' expected "
                                    f"{value.dtype}{list(value.shape)}, got "
                                    f"{arr.dtype}{list(arr.shape)}")
            if isinstance(value, Constant) and value not in self.used and \
                    not np.array_equal(arr, value.value):
                raise ArgumentError(f"program '{self.name}': constant '{value.name}' was folded "
                                    f"into the program when it was built; pass the same value "
                                    f"or build the program again")
            env[value.name] = np.ascontiguousarray(arr)
        return env

    def __call__(self, *arrays: Any) -> np.ndarray:
        """Run every stage on the device: inputs are copied there once, the stages' results
        stay there for the next stage, and only the last stage's output is copied back. (A host
        round trip per stage made a Winograd F(4x4) 3x3 conv on PoCL, 64 channels at 56x56,
        take 2.68 ms against 1.74, timed side by side.)"""
        env = self.bind(*arrays)
        runtime = self.kernels[0].runtime
        handles: dict[str, Any] = {}
        for k in self.kernels:
            for b in k.loop.inputs:
                if b.name not in handles:
                    handles[b.name] = runtime.device_array(env[b.name])
            for b in k.loop.outputs:
                handles[b.name] = runtime.device_empty(b)
            k.launch(*(handles[b.name] for b in (*k.loop.inputs, *k.loop.outputs)), wait=False)
        last = self.kernels[-1].loop.outputs[0]
        out = np.empty(last.shape, last.dtype.numpy)
        runtime.to_host(handles[last.name], out)
        return out


def _metadata(program: Program, info: dict[str, Any]) -> dict[str, Any]:
    last = program.kernels[-1].loop.outputs[0]
    args = [{"name": v.name, "role": "input", "dtype": str(v.dtype), "shape": list(v.shape)}
            for v in program.inputs]
    args.append({"name": last.name, "role": "output", "dtype": str(last.dtype),
                 "shape": list(last.shape)})
    meta = {"name": program.name, "backend": program.backend, "kernelgen_version": __version__,
            "schedule": "program", "args": args, **info,
            "folded_constants": sorted(program.folded),
            "flops": sum(k.loop.flops() for k in program.kernels),
            "stages": [k.metadata for k in program.kernels]}
    json.dumps(meta)
    return meta
