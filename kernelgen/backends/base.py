"""What a backend is, as data and one small interface.

A backend is one folder under ``kernelgen/backends/`` with the same files in each:
``language.py`` (syntax tables), ``schedule.py`` (the frozen schedule record, the function that
chooses it, and the tuner's search space), ``emit.py`` (the printer: loop IR + schedule ->
source), ``runtime.py`` (build and launch) and ``templates/``. Its ``__init__.py`` holds the
``Backend`` object that the registry (``backends/__init__.py``) lists. Shared code reads
``Capabilities`` and calls ``Backend`` methods; it never asks which backend it holds.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Protocol

import numpy as np

from ..dtypes import DType
from ..errors import UnsupportedError
from ..ir.expr import PRIMITIVES, Call, walk
from ..ir.loop import Buffer, LoopKernel
from ..lower import fastmath
from . import templates


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers, as data. A kernel needing something missing raises
    ``UnsupportedError`` naming it (``check``)."""

    name: str
    dtypes: frozenset[DType] = frozenset(DType)
    primitives: frozenset[str] = frozenset(PRIMITIVES)
    # functions ``choose`` expands into primitives before deciding anything (the IR's float32
    # math library, ``lower/fastmath.py``; 'pow': constant exponents strength-reduced); the
    # others print as the language's own. By default all: it needs only the primitives.
    fast_math: frozenset[str] = fastmath.EXPANDABLE
    vector_width: int = 1  # float32 lanes of its explicit vector code (1: none)
    # the widths of explicit float vectors its compiler builds (contraction tiles, windows),
    # widest first
    vector_widths: tuple[int, ...] = ()
    # a CPU's SIMD register file, which bounds a register tile: float32 lanes of one register
    # and how many registers (0: unknown, or not a CPU; the tiles measured on AVX-512 apply)
    register_lanes: int = 0
    vector_registers: int = 0
    max_work_group: int | None = None  # work-items of one work-group, at most
    max_item_sizes: tuple[int, ...] | None = None  # work-items along each dimension, at most
    local_memory: int | None = None  # bytes of work-group local memory, at most
    compute_units: int | None = None
    # the device works on host memory: calls wrap host arrays instead of copying them
    unified_memory: bool = False
    # rows reduce in one thread with explicit vector loops (CPU-like devices)
    simd_within_work_item: bool = False
    # elementwise kernels as a vector per work-item: a compiler that vectorises poorly across
    # work-items (Intel's CPU runtime), as measured (``backends/opencl/element_vectors.py``)
    explicit_elementwise: bool = False
    # a contraction reading its operands in place is slowed by rows that alias in the L1 cache,
    # so such operands are read from padded copies (``compile/padding.py``)
    pads_aliased_rows: bool = False
    # the schedule that computes each output element's window on its own (conv 'direct')
    direct_schedule: str = "row"
    # measured preferences of the convolution heuristic (``compile/conv_algorithms.py``): a
    # pointwise conv's implicit GEMM reads its input as the GEMM operand in place (im2col would
    # only copy it); im2col beats Winograd up to this many input channels;
    # F(4x4)'s transforms unroll a whole tile per work-item; convolutions over small maps still
    # split into Winograd or im2col stages (measured on CPUs; a GPU's implicit GEMM unmeasured)
    pointwise_conv_in_place: bool = False
    im2col_max_channels: int = 0
    winograd_4x4: bool = False
    split_small_convs: bool = False
    # F(2x2)'s output tiles over a small odd map compute this share of its outputs or more
    # (7x7: 64 for 49): im2col instead, where its columns run the whole map (0: no limit)
    winograd_max_waste: float = 0.0

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
    """How the rest of kernelgen runs a backend's kernel: on host arrays (``run``; ``keep[i]``
    says input ``i`` is a constant of the kernel object, the same array every call, which a
    runtime may keep on its device), or on device buffers (``device_array``/``device_empty``,
    ``launch``, ``sync``, ``to_host``)."""

    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray],
            keep: Sequence[bool] = ()) -> None: ...
    def device_array(self, array: np.ndarray) -> Any: ...
    def device_empty(self, buffer: Buffer) -> Any: ...
    def launch(self, handles: Sequence[Any]) -> None: ...
    def sync(self) -> None: ...
    def to_host(self, handle: Any, out: np.ndarray) -> None: ...
    def view(self, handle: Any, offset: int, buffer: Buffer) -> Any:
        """The part of the device buffer ``handle`` that starts ``offset`` elements in and
        holds ``buffer`` (its dtype's elements), sharing the memory."""
        ...
    def bound(self, handles: Sequence[Any]) -> Callable[[], None]:
        """A function that enqueues this kernel on ``handles`` (as ``launch``), with what
        does not change between its calls (the kernel's arguments) done once, here. A compiled
        model binds each launch once per set of buffers and calls it every run."""
        ...
    def write(self, handle: Any, array: np.ndarray) -> Any:
        """Copy ``array`` into the device buffer ``handle`` (of its size), in order with the
        launches; ``array`` must stay unchanged until the next ``sync``. Returns what the
        caller holds until then (a pending copy), or None."""
        ...
    def read(self, handle: Any, out: np.ndarray) -> Any:
        """Copy the device buffer ``handle`` into ``out`` after the launches enqueued before;
        ``out`` holds the values once the next ``sync`` returns. Returns what the caller
        holds until then, as ``write``."""
        ...


PRIVATE = {"tunable": False}  # field metadata: a schedule field that is not a tunable


@dataclass(frozen=True)
class Schedule:
    """Every decision a backend's printer needs for one kernel, made by the backend's
    ``schedule.choose`` and printed by its ``emit.render``, which decides nothing.

    The field names are one vocabulary for every backend; a field that a schedule does not
    use is None. The public fields are the metadata's ``tunables`` (``kind`` under the name
    ``schedule``), and passing them back to ``emit`` as options gives the same source. Fields
    marked ``PRIVATE`` are plans derived from the public ones (the loop the printer prints,
    which operand is the vector one, ...)."""

    kind: str        # the schedule: 'elementwise', 'row', 'group', 'item', 'tiled', ...
    index_type: str  # the type of index arithmetic (64 bits where a buffer needs it)
    loop: LoopKernel = field(repr=False, compare=False, metadata=PRIVATE)  # what is printed
    tile: tuple[int, ...] | None = None  # a contraction's tile: rows x columns (x reduction)
    pack: bool | None = None  # a contraction operand packed into contiguous panels first
    local_size: int | None = None  # work-items a work-group holds, at most (the target)
    vector_width: int | None = None  # float32 lanes of the explicit vector code
    group_rows: int | None = None  # group points (a staged kernel's queries) per work-item
    row_vectors: int | None = None  # 'row': vectors of a staged row a step computes

    def tunables(self) -> dict[str, Any]:
        """The public decisions, as emit options (JSON-serialisable)."""
        values = ((option, getattr(self, name)) for name, option in _public(type(self)))
        return {option: value for option, value in values if value is not None}

    def facts(self) -> dict[str, Any]:
        """What the metadata reports about the decisions besides the tunables (how often a
        fused producer is computed, which buffers a packed operand reads, ...)."""
        return {}


def _public(schedule: type[Schedule]) -> list[tuple[str, str]]:
    """(field, option name) of a schedule's public fields: ``kind`` is the ``schedule`` option."""
    return [(f.name, "schedule" if f.name == "kind" else f.name) for f in fields(schedule)
            if f.metadata.get("tunable", True)]


def option_names(schedule: type[Schedule]) -> frozenset[str]:
    """The emit options a backend whose schedule is ``schedule`` accepts: its public fields."""
    return frozenset(option for _, option in _public(schedule))


# options of kernelgen 0.1 that the shared vocabulary renamed, for the error message
RENAMED = {"reduce_strategy": "schedule", "tile_m": "tile", "tile_n": "tile",
           "block_m": "tile", "block_n": "tile", "block_k": "tile", "pack_b": "pack",
           "pack_rows": "pack"}


def check_options(backend: str, options: Mapping[str, Any], allowed: frozenset[str],
                  schedule: type[Schedule] | None = None) -> None:
    """Raise ``TypeError`` naming every option ``backend`` does not take (and the new name of a
    renamed one), and, given the backend's ``schedule`` record, ``ValueError`` naming an option
    whose value is not of its field's kind (``tile=(4.5, 8)`` would print broken code)."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        hints = "".join(f"; '{k}' is now '{RENAMED[k]}'" for k in unknown if k in RENAMED)
        raise TypeError(f"unknown {backend} emit options {unknown}{hints}; expected "
                        f"{sorted(allowed)}")
    kinds = {option: _kind(str(f.type)) for f in fields(schedule or Schedule)
             for name, option in _public(schedule or Schedule) if f.name == name}
    for option, value in options.items():
        kind = kinds.get(option)
        if value is None or kind is None or _is_kind(value, kind):
            continue
        raise ValueError(f"{backend} emit option {option}={value!r}: expected {_KIND_WORDS[kind]}")


# the kinds of option value a schedule field's annotation admits
_KIND_WORDS = {"ints": "a tuple of positive integers", "int": "a positive integer",
               "bool": "True or False", "str": "a string"}


def _kind(annotation: str) -> str | None:
    for kind, marker in (("ints", "tuple[int"), ("bool", "bool"), ("int", "int"), ("str", "str")):
        if annotation.startswith(marker):
            return kind
    return None


def _is_kind(value: Any, kind: str) -> bool:
    def positive_int(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) \
            and bool(v >= 1)
    if kind == "ints":
        return isinstance(value, (tuple, list)) and len(value) > 0 and \
            all(positive_int(v) for v in value)
    if kind == "int":
        return positive_int(value)
    if kind == "bool":
        return isinstance(value, (bool, np.bool_))
    return isinstance(value, str)


def check_derived(schedule: Schedule, options: Mapping[str, Any], derived: Sequence[str]) -> None:
    """Options that name a derived field (the index type, a vector width that the tile
    decides) are accepted when they agree with the decision, as the metadata reports it."""
    for name in derived:
        if name in options and options[name] != getattr(schedule, name):
            raise ValueError(f"kernel '{schedule.loop.name}': {name} follows from the other "
                             f"choices ({getattr(schedule, name)!r} here), got "
                             f"{options[name]!r}")


@dataclass(frozen=True)
class Source:
    """A rendered kernel: the text a user reads, what a host program needs to launch it
    (``launch``, JSON; None: a plain function call) and facts the printer knows for the
    metadata (entry points, signature). Backends subclass it with what their runtime needs."""

    text: str
    launch: dict[str, Any] | None
    facts: dict[str, Any]


@dataclass(frozen=True)
class Backend:
    """A code generator and its runtime. Subclasses (one per backend folder) implement the
    methods; the fields are data shared code may read."""

    name: str
    caps: Capabilities
    suffix: str   # file suffix of its sources
    comment: str  # line-comment mark of its language
    batch_builds: ClassVar[bool] = False  # whether ``prebuild`` is cheaper than one by one

    def bound(self) -> Backend:
        """This backend with the capabilities of the device it generates for, read from the
        device where they depend on it (OpenCL); ``backends.get`` returns it."""
        return self

    def problem(self) -> str | None:
        """Why kernels cannot run here (a tool or device missing), naming what to install;
        None when they can."""
        raise NotImplementedError

    def device_identity(self) -> str:
        """What a measurement depends on besides the kernel: device and toolchain."""
        raise NotImplementedError

    def view_alignment(self) -> int:
        """The byte alignment a view into a device buffer must start at
        (``Runtime.view``)."""
        return 1

    def template_digest(self) -> str:
        """A hash of the backend's kernel skeletons (``<name>/templates/``): tuned results
        measured with other templates must not be reused."""
        return templates.digest(self.name)

    def search_space(self, loop: LoopKernel) -> list[Config]:
        """The tunables worth measuring for ``loop``, the default first."""
        raise NotImplementedError

    def choose(self, loop: LoopKernel, options: Mapping[str, Any]) -> Schedule:
        """Decide every tunable of ``loop`` (``options`` win over the defaults) on its
        ``expand``ed form, which is what ``render`` prints; checks them and raises naming the
        option at fault."""
        raise NotImplementedError

    def expand(self, loop: LoopKernel) -> LoopKernel:
        """``loop`` with the functions ``caps.fast_math`` names expanded into primitives
        (``lower/fastmath.py``): what ``choose`` and ``search_space`` look at."""
        return fastmath.expand(loop, self.caps.fast_math)

    def render(self, schedule: Schedule) -> Source:
        """Print ``schedule.loop`` as ``schedule`` says; decides nothing."""
        raise NotImplementedError

    def runtime(self, loop: LoopKernel, source: Source) -> Runtime:
        """What builds and launches ``source`` (lazily: nothing is built here)."""
        raise NotImplementedError

    def prebuild(self, sources: Sequence[Source]) -> None:
        """Build many kernels at once (where ``batch_builds``)."""

    def prewarm_pool(self) -> Any:
        """Where the backend can make kernels' first runs cheaper while a model compiles (OpenCL
        on PoCL: worker processes fill its disk cache), an object taking each compiled block's
        kernels (``add_kernels``) and waited for before the first run (``finish``, or
        ``cancel``); else None."""
        return None

    def binary(self, text: str) -> bytes | None:
        """The device binary this process built from the source ``text``, to be saved beside
        it (a saved model); None where the backend keeps none or has not built it."""
        return None

    def preload(self, text: str, binary: bytes) -> bool:
        """Take ``binary`` (from ``binary``) as the build of ``text``, so building ``text``
        costs nothing; False when the device refuses it (the source is then built)."""
        return False
