"""A program: several kernels of one backend run in order, wired by buffer name, called like one
kernel. Convolution algorithms that need more than one pass (im2col + GEMM, Winograd's
transforms around a batched GEMM) return one.

Stages whose inputs are all constants (Winograd's filter transform of constant weights) ran
once when the program was built; their results are ``folded`` constants, and the original
constant they came from must be passed unchanged (checked, since a different value would
otherwise be silently ignored). A program that knows how it folded them (``refold``) can be
bound to another block of the same structure with other constants (``rebound``): the same
kernels, the other block's folded constants, nothing generated or built again.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..backends import Runtime
from ..backends import get as get_backend
from ..errors import ArgumentError
from ..ir.loop import Buffer
from ..ir.node import Constant, Value
from ..version import __version__
from .arguments import bind_inputs, bind_outputs, finish
from .bounds import check_indices
from .kernel import Kernel


# the folded constants of a program from the values of its block's constant inputs, by name
Refold = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


class Program:
    """Kernels run in order on named buffers, called like a ``Kernel``: ``program(*arrays)``
    takes the arrays of ``inputs`` (those of the fused block it implements; by name too, and
    ``out=``) and returns the last stage's output; ``launch`` runs on device buffers.
    ``refold`` computes ``folded`` from the constant inputs' values (None: unknown)."""

    def __init__(self, name: str, backend: str, inputs: Sequence[Value], kernels: Sequence[Kernel],
                 folded: dict[str, np.ndarray], info: dict[str, Any],
                 refold: Refold | None = None) -> None:
        self._name = name
        self.backend = backend
        self.inputs = tuple(inputs)
        self.kernels = tuple(kernels)
        self.folded = dict(folded)
        self.refold = refold
        self._info = info
        produced = {b.name for k in self.kernels for b in k.loop.outputs}
        needed = {b.name for k in self.kernels for b in k.loop.inputs} - produced
        self.used = tuple(v for v in self.inputs if v.name in needed)
        self.metadata = _metadata(self, info)
        self._lock = threading.Lock()
        self._device_folded: dict[str, Any] | None = None

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

    def rebound(self, inputs: Sequence[Value]) -> Program:
        """This program for another block of the same structure: ``inputs`` are that block's,
        named and shaped as this one's (constants may hold other values); the stages are these
        very kernels, the folded constants are computed from ``inputs``' values."""
        if self.refold is None and self.folded:
            raise ValueError(f"program '{self.name}' cannot fold other constants (no refold)")
        mine = [(v.name, v.shape, v.dtype, isinstance(v, Constant)) for v in self.inputs]
        theirs = [(v.name, v.shape, v.dtype, isinstance(v, Constant)) for v in inputs]
        if mine != theirs:
            raise ValueError(f"program '{self.name}' takes {mine}, not {theirs}")
        constants = {v.name: v.value for v in inputs if isinstance(v, Constant)}
        folded = self.refold(constants) if self.refold is not None else {}
        return Program(self.name, self.backend, inputs, self.kernels, folded, self._info,
                       self.refold)

    @property
    def runtime(self) -> Runtime:
        """The backend runtime every stage runs on (device buffers for ``launch``)."""
        return self.kernels[0].runtime

    @property
    def output(self) -> Buffer:
        """The program's result: the last stage's output."""
        return self.kernels[-1].loop.outputs[0]

    @property
    def intermediates(self) -> tuple[Buffer, ...]:
        """The stages' outputs that the program's output is not, in launch order."""
        last = self.output.name
        return tuple(b for k in self.kernels for b in k.loop.outputs if b.name != last)

    def bind(self, *arrays: Any, **named: Any) -> dict[str, np.ndarray]:
        """Check ``arrays`` against ``inputs`` (by position, then by name); return every
        external buffer by name (folded constants included)."""
        callee = f"program '{self.name}'"
        constants = {v.name: v.value for v in self.inputs if isinstance(v, Constant)}
        checked = bind_inputs(callee, self.inputs, arrays, named, constants)
        env: dict[str, np.ndarray] = dict(self.folded)
        for value, arr in zip(self.inputs, checked):
            if isinstance(value, Constant) and value not in self.used and \
                    not np.array_equal(arr, value.value):
                raise ArgumentError(f"program '{self.name}': constant '{value.name}' was folded "
                                    f"into the program when it was built; pass the same value "
                                    f"or build the program again")
            env[value.name] = arr
        for k in self.kernels:  # gathers whose indices the caller passes
            if all(b.name in env for b in k.loop.inputs):
                check_indices(k.name, k.loop, [env[b.name] for b in k.loop.inputs])
        return env

    def __call__(self, *arrays: Any, out: Any = None, **named: Any) -> np.ndarray:
        """Run every stage on the device: inputs are copied there once, the stages' results
        stay there for the next stage, and only the last stage's output is copied back. (A host
        round trip per stage made a Winograd F(4x4) 3x3 conv on PoCL, 64 channels at 56x56,
        take 2.68 ms against 1.74, timed side by side.) Arguments as for ``Kernel``."""
        env = self.bind(*arrays, **named)
        written, returned = bind_outputs(f"program '{self.name}'", [self.output], out,
                                         list(env.values()))
        runtime = self.runtime
        resident = self._folded_on_device()  # and constants passed as built
        handles = {name: resident[name] if self._kept(name, env[name]) else
                   runtime.device_array(env[name]) for name in self._external()
                   if name not in self.folded}
        handles.update((name, resident[name]) for name in self.folded)
        self._run(handles)
        runtime.to_host(handles[self.output.name], written[0])
        return finish(written, returned)

    def launch(self, *handles: Any, wait: bool = True) -> None:
        """Run on device buffers: one per input (``inputs`` order; a folded constant's is not
        read), then the output's, from ``runtime.device_array`` / ``device_empty``. The stages'
        intermediate buffers are allocated per launch, so concurrent launches share nothing."""
        self._run(self._named(handles, "launch"))
        if wait:
            self.runtime.sync()

    def bound_launch(self, *handles: Any,
                     intermediate: Callable[[int, Buffer], Any] | None = None
                     ) -> Callable[[], None]:
        """``launch`` on ``handles`` as one function, every stage bound to its buffers once
        (``Runtime.bound``). The stages' intermediates are allocated here, or are
        ``intermediate(j, buffer)`` for the ``j``-th: a compiled model shares them between
        programs that never run at once."""
        named = self._named(handles, "bound_launch")
        for j, b in enumerate(self.intermediates):
            named[b.name] = (intermediate(j, b) if intermediate is not None
                             else self.runtime.device_empty(b))
        calls = [k.bound_launch(*(named[b.name] for b in (*k.loop.inputs, *k.loop.outputs)))
                 for k in self.kernels]

        def launch() -> None:
            for call in calls:
                call()
        return launch

    def _named(self, handles: Sequence[Any], method: str) -> dict[str, Any]:
        """The buffers of a launch by name: ``handles`` (the inputs, then the output) and the
        folded constants."""
        if len(handles) != len(self.inputs) + 1:
            raise ArgumentError(f"program '{self.name}'.{method} takes {len(self.inputs) + 1} "
                                f"device buffers (the inputs, then the output), got "
                                f"{len(handles)}")
        named = {v.name: h for v, h in zip(self.inputs, handles)}
        named[self.output.name] = handles[-1]
        named.update((n, h) for n, h in self._folded_on_device().items() if n in self.folded)
        return named

    def _external(self) -> list[str]:
        """Buffers the stages read that no stage writes, in first-use order."""
        produced = {b.name for k in self.kernels for b in k.loop.outputs}
        names = [b.name for k in self.kernels for b in k.loop.inputs if b.name not in produced]
        return list(dict.fromkeys(names))

    def _kept(self, name: str, array: np.ndarray) -> bool:
        """Whether ``array`` is the value of the program's constant input ``name``."""
        return any(v.name == name and isinstance(v, Constant) and v.value is array
                   for v in self.inputs)

    def _folded_on_device(self) -> dict[str, Any]:
        """Folded constants and the constant inputs as device buffers, uploaded once."""
        with self._lock:
            if self._device_folded is None:
                values = {**{v.name: v.value for v in self.inputs if isinstance(v, Constant)},
                          **self.folded}
                self._device_folded = {name: self.runtime.device_array(value)
                                       for name, value in values.items()}
            return self._device_folded

    def _run(self, handles: dict[str, Any]) -> None:
        """Enqueue every stage on ``handles`` (external buffers by name), allocating the
        intermediates (and the output, when it is not there)."""
        for k in self.kernels:
            for b in k.loop.outputs:
                if b.name not in handles:
                    handles[b.name] = self.runtime.device_empty(b)
            k.launch(*(handles[b.name] for b in (*k.loop.inputs, *k.loop.outputs)), wait=False)


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
