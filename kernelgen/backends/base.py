"""What a backend is, as data and one small interface.

A backend is one folder under ``kernelgen/backends/`` with the same files in each:
``language.py`` (syntax tables), ``schedule.py`` (the frozen schedule record, the function that
chooses it, and the tuner's search space), ``emit.py`` (the printer: loop IR + schedule ->
source), ``runtime.py`` (build and launch) and ``templates/``. Its ``__init__.py`` holds the
``Backend`` object that the registry (``backends/__init__.py``) lists. Shared code reads
``Capabilities`` and calls ``Backend`` methods; it never asks which backend it holds.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from ..dtypes import DType
from ..errors import UnsupportedError
from ..ir.expr import PRIMITIVES, Call, walk
from ..ir.loop import Buffer, LoopKernel


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers, as data. A kernel needing something missing raises
    ``UnsupportedError`` naming it (``check``)."""

    name: str
    dtypes: frozenset[DType] = frozenset(DType)
    primitives: frozenset[str] = frozenset(PRIMITIVES)
    vector_width: int = 1  # float32 lanes of its explicit vector code (1: none)
    max_work_group: int | None = None  # work-items of one work-group, at most
    # rows reduce in one thread with explicit vector loops (CPU-like devices)
    simd_within_work_item: bool = False
    # a contraction reading its operands in place is slowed by rows that alias in the L1 cache,
    # so such operands are read from padded copies (``compile/padding.py``)
    pads_aliased_rows: bool = False
    # the schedule that computes each output element's window on its own (conv 'direct')
    direct_schedule: str = "row"
    # measured preferences of the convolution heuristic (``compile/conv_algorithms.py``): a
    # pointwise conv's implicit GEMM reads its input as the GEMM operand in place (im2col would
    # only copy it); im2col beats Winograd up to this many input channels over a large map;
    # F(4x4)'s transforms unroll a whole tile per work-item
    pointwise_conv_in_place: bool = False
    im2col_max_channels: int = 0
    winograd_4x4: bool = False

    def check(self, kernel: LoopKernel) -> None:
        for b in kernel.inputs + kernel.outputs:
            if b.dtype not in self.dtypes:
                raise UnsupportedError(self.name, f"dtype {b.dtype}",
                                       f"buffer '{b.name}' of kernel '{kernel.name}'")
        for root in kernel.roots():
            for node in walk(root):
                if isinstance(node, Call) and node.fn not in self.primitives:
                    raise UnsupportedError(self.name, f"function '{node.fn}'",
                                           f"kernel '{kernel.name}'")


@dataclass(frozen=True, order=True)
class Config:
    """One point in a kernel's tunable space: emit options sorted by name
    (``Config.of(tile=(8, 32), pack=True)``), hashable so that it can key a results database.
    Lists (as JSON returns them) become tuples."""

    values: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def of(cls, **values: Any) -> Config:
        return cls(tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                for k, v in values.items())))

    def as_options(self) -> dict[str, Any]:
        """Keyword options for ``FusedOp.emit`` / ``kernelgen.compile``."""
        return dict(self.values)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{k}={v}" for k, v in self.values) + "}" if self.values \
            else "{default}"


class Runtime(Protocol):
    """How the rest of kernelgen runs a backend's kernel: on host arrays (``run``), or on
    device buffers (``device_array``/``device_empty``, ``launch``, ``sync``, ``to_host``)."""

    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None: ...
    def device_array(self, array: np.ndarray) -> Any: ...
    def device_empty(self, buffer: Buffer) -> Any: ...
    def launch(self, handles: Sequence[Any]) -> None: ...
    def sync(self) -> None: ...
    def to_host(self, handle: Any, out: np.ndarray) -> None: ...


@dataclass(frozen=True)
class Emitted:
    """One kernel as a backend emits it: the source a user reads, the launch metadata a host
    program needs (None: a plain call), the rest of its metadata, and its runtime."""

    source: str
    launch: dict[str, Any] | None
    metadata: Mapping[str, Any]
    runtime: Runtime


@dataclass(frozen=True)
class Backend:
    """A code generator and its runtime. Subclasses (one per backend folder) implement the
    methods; the fields are data shared code may read."""

    name: str
    caps: Capabilities
    suffix: str   # file suffix of its sources
    comment: str  # line-comment mark of its language
    batch_builds: ClassVar[bool] = False  # whether ``prebuild`` is cheaper than one by one

    def problem(self) -> str | None:
        """Why kernels cannot run here (a tool or device missing), naming what to install;
        None when they can."""
        raise NotImplementedError

    def device_identity(self) -> str:
        """What a measurement depends on besides the kernel: device and toolchain."""
        raise NotImplementedError

    def template_digest(self) -> str:
        """A hash of the backend's kernel skeletons: tuned results measured with other
        templates must not be reused."""
        raise NotImplementedError

    def search_space(self, loop: LoopKernel) -> list[Config]:
        """The tunables worth measuring for ``loop``, the default first."""
        raise NotImplementedError

    def emit(self, loop: LoopKernel, options: Mapping[str, Any]) -> Emitted:
        """``loop`` as source, metadata and a runtime, under ``options`` (its tunables)."""
        raise NotImplementedError

    def prebuild(self, emitted: Sequence[Emitted]) -> None:
        """Build many kernels at once (where ``batch_builds``)."""
