"""Compile a planned graph once, run it many times (``compile_plan`` -> ``CompiledModel``).

    model = compile_plan(graph, plan_none(graph), backend)
    outputs = model.run({"x": x})        # output name -> array

Compiling: each block is fused and compiled by the driver (``kernelgen.compile.compile``, the
backend's tunables from the Fast-Run database by default), blocks of one structure sharing
what they can (``block_kernels.py``); kernels of a backend that builds in batches are built
together; constants are uploaded to the device once; then one warm-up run builds whatever the
backend builds lazily. The result's ``plan`` is plain data (``plan.py``). Given a ``schedule``
(``ios.py``; its groups hold block indices), launches run stage by stage, a stage's groups on
concurrent queues where the runtime has them (``concurrently``) and every kernel in them may
run so, and intermediates share memory only between stages whose lives do not overlap.

Running: a run takes a set of device buffers (the intermediates in liveness-shared slots,
``memory.py``, and the inputs and outputs) with every launch bound to them once
(``Runtime.bound``: a kernel's arguments are set when the set is made, not every run), copies
the inputs in, calls the bound launches, and reads the outputs back with one wait for the
device. Programs that run one launch at a time share their stages' intermediates. Runs may
come from several threads at once: each takes its own set from a pool (more concurrent runs,
more sets), and the executables are thread-safe (``docs/calling.md``).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import backends
from ..backends import Backend, Runtime
from ..compile import STORED, TuningPolicy
from ..dtypes import DType
from ..exec import Executable, Kernel, Program
from ..exec.arguments import bind_inputs
from ..ir.fingerprint import fingerprint
from ..ir.loop import Buffer
from ..ir.node import Constant, Op, Placeholder, Value
from . import memory
from .model import Graph
from .plan import BufferSpec, KernelSpec, Launch, Plan
from .block_kernels import Compiled, compile_blocks, fuse_block
from .blocks import Block, block_graph, check_plan, concat_in_place_shape
from .ios import Schedule, check_schedule


@dataclass
class _Arena:
    """One run's buffers by buffer id (slots, inputs, outputs, the resident constants) and
    the plan's launches bound to them, to call in order."""

    handles: list[Any]
    calls: list[Callable[[], None]]


def compile_plan(graph: Graph, blocks: Sequence[Block], backend: str | Backend = backends.DEFAULT,
                 *, tuning: TuningPolicy = STORED, algorithm: str | None = None,
                 warmup: bool = True, schedule: Schedule | None = None,
                 **options: Any) -> CompiledModel:
    """``graph`` compiled block by block for ``backend``. ``algorithm`` names the convolution
    algorithm of blocks that hold a Conv (default: the stored or heuristic choice); ``options``
    are backend tunables applied to every block; ``schedule`` the stages the blocks run in
    (by block index; default: one after another)."""
    check_plan(graph, blocks)
    if schedule is not None:
        check_schedule(block_graph(graph, blocks), schedule)
    be = backends.get(backend)
    start = time.perf_counter()
    views = _views(graph, blocks, be)
    run = [b for b in range(len(blocks)) if b not in views]
    fused, names = zip(*(fuse_block(graph, blocks[b]) for b in run)) if run else ((), ())
    # kernels built elsewhere while the next blocks compile (OpenCL on PoCL: worker processes)
    pool = be.prewarm_pool() if warmup else None
    try:
        compiled = compile_blocks(fused, names, be, tuning, algorithm, options,
                                  lambda exe: pool.add_kernels(_kernels(exe)) if pool else None)
    except BaseException:
        if pool:
            pool.cancel()
        raise
    timings = {"compile_s": time.perf_counter() - start}
    plan = _plan(graph, blocks, run, views, compiled, be, schedule)
    start = time.perf_counter()
    if warmup:  # else each kernel builds at its first run (the CLI's emit builds none)
        if pool:
            pool.finish()
        _prebuild(be, compiled.executables)
    model = CompiledModel(graph, plan, compiled.executables, timings)
    if warmup:
        model.warm_up()
    timings["build_s"] = time.perf_counter() - start
    return model


# A value that shares another's memory: (the value, the value it is part of, element offset)
ViewOf = tuple[Value, Value, int]


def _views(graph: Graph, blocks: Sequence[Block], be: Backend) -> dict[int, list[ViewOf]]:
    """The view blocks that launch nothing, by block index, with the values they make parts
    of others: a Slice's output part of its input; an in-place Concat's inputs parts of its
    output. A view block the device cannot address so (an offset off its alignment, an input
    already part of something else) is compiled as a copy."""
    views: dict[int, list[ViewOf]] = {}
    placed: set[int] = set()  # values already part of another
    for b, block in enumerate(blocks):
        if not block.view:
            continue
        op = block.ops[0]
        if op.kind == "Concat":
            offsets = _concat_offsets(graph, op, be, placed)
            if offsets is not None:
                views[b] = [(v, op, off) for v, off in zip(op.inputs, offsets)]
        elif (off := _view_offset(graph, block, be)) is not None:
            views[b] = [(op, op.inputs[0], off)]
        placed.update(id(child) for child, _, _ in views.get(b, ()))
    return views


def _concat_offsets(graph: Graph, op: Op, be: Backend, placed: set[int]) -> list[int] | None:
    """Where each input of an in-place Concat starts in its output (elements), or None where
    it cannot be assembled in place on this device."""
    if not concat_in_place_shape(graph, op):
        return None
    offsets, at = [], 0
    for v in op.inputs:
        if id(v) in placed or at * v.dtype.itemsize % be.view_alignment():
            return None
        offsets.append(at)
        at += v.numel
    return offsets


def _view_offset(graph: Graph, block: Block, be: Backend) -> int | None:
    """Where a view block's Slice output starts in its input (elements), when it is one
    contiguous range of an intermediate that the backend can address there; else None (the
    block is compiled as a copy). Contiguous: every axis before the first one it cuts holds
    one index, that axis is cut with step 1, and every later axis is whole."""
    op = block.ops[0]
    source = op.inputs[0]
    if (len(block.ops) != 1 or op.kind != "Slice" or not isinstance(source, Op)
            or graph.is_output(op) or graph.is_output(source)):
        return None
    begins = [0] * source.rank
    steps = [1] * source.rank
    for a, start, end, step in zip(op.attrs["axes"], op.attrs["starts"], op.attrs["ends"],
                                   op.attrs["steps"]):
        begins[a], _, steps[a] = slice(start, end, step).indices(source.shape[a])
    cut = next((a for a in range(source.rank) if op.shape[a] != source.shape[a]), source.rank)
    if any(op.shape[a] != 1 for a in range(cut)) or (cut < source.rank and op.shape[cut] > 1
                                                     and steps[cut] != 1):
        return None
    if any(begins[a] != 0 for a in range(cut + 1, source.rank)):
        return None
    offset, stride = 0, 1
    for a in reversed(range(source.rank)):
        offset += begins[a] * stride
        stride *= source.shape[a]
    if offset * source.dtype.itemsize % be.view_alignment():
        return None
    return offset


def _plan(graph: Graph, blocks: Sequence[Block], run: Sequence[int],
          views: dict[int, list[ViewOf]], compiled: Compiled, be: Backend,
          schedule: Schedule | None = None) -> Plan:
    """``run``: the blocks that launch (``compiled.launches`` in this order); ``views``: the
    view blocks, by block index, with the values they make parts of others."""
    values = _values(graph, blocks)
    ids = {v.name: k for k, v in enumerate(values)}
    # lives are counted in stages: groups of one stage may run at once
    when = ({b: k for k, st in enumerate(schedule.stages) for b in st.blocks}
            if schedule is not None else {b: b for b in range(len(blocks))})
    owner = {id(op): when[b] for b, block in enumerate(blocks) for op in block.ops}
    # a view's memory is its root's (parts of parts add up): the root lives from the first
    # write to any part (an in-place Concat's inputs come before it) to the last read
    parent = {id(child): (whole, off) for b in views for child, whole, off in views[b]}
    root: dict[int, tuple[Value, int]] = {}
    for key in parent:
        whole, base = parent[key]
        while id(whole) in parent:
            whole, off = parent[id(whole)]
            base += off
        root[key] = (whole, base)
    readers: dict[int, list[int]] = {}
    first: dict[int, int] = {}
    for v in values:
        if isinstance(v, Op):
            holder = root.get(id(v), (v, 0))[0]
            readers.setdefault(id(holder), []).extend(owner[id(c)] for c in graph.consumers(v))
            first[id(holder)] = min(first.get(id(holder), owner[id(v)]), owner[id(v)])
    resident = _resident(graph, compiled, ids)
    intervals = []
    for v in values:
        if isinstance(v, Op) and not graph.is_output(v) and id(v) not in root:
            start = first[id(v)]
            uses = [u for u in readers.get(id(v), []) if u != start]
            intervals.append(memory.Interval(ids[v.name], start, max(uses, default=start),
                                             str(v.dtype), v.numel, _nbytes(v)))
    slot_of, slots = memory.assign(intervals)
    buffers = []
    for k, v in enumerate(values):
        view_of, offset = None, 0
        if id(v) in root:
            holder, offset = root[id(v)]
            view_of = ids[holder.name]
        buffers.append(BufferSpec(k, v.name, _role(graph, v), str(v.dtype), tuple(v.shape),
                                  _nbytes(v), slot_of.get(k), k in resident, view_of, offset))
    kernels = tuple(_kernel_spec(k, exe, compiled.uses[k])
                    for k, exe in enumerate(compiled.executables))
    launches = tuple(Launch(k, blocks[b].names, tuple(ids[n] for n in names))
                     for b, (k, names) in zip(run, compiled.launches))
    return Plan(be.name, tuple(buffers), tuple(slots), kernels, launches,
                tuple(ids[v.name] for v in graph.inputs),
                tuple((name, ids[v.name]) for name, v in graph.outputs.items()),
                memory.live_peak(intervals), _launch_schedule(schedule, run))


def _launch_schedule(schedule: Schedule | None, run: Sequence[int]) -> Schedule | None:
    """``schedule`` over launch indices: view blocks launch nothing, so they leave it."""
    if schedule is None:
        return None
    index = {b: k for k, b in enumerate(run)}
    stages = []
    for st in schedule.stages:
        groups = tuple(g for g in (tuple(index[b] for b in g if b in index) for g in st.groups)
                       if g)
        if groups:
            stages.append(replace(st, groups=groups))
    return replace(schedule, stages=tuple(stages))


def _values(graph: Graph, blocks: Sequence[Block]) -> list[Value]:
    """Every buffer's value: the inputs, what blocks read from outside, what they write for
    other blocks or the graph, the graph's outputs."""
    found: dict[int, Value] = {id(v): v for v in graph.inputs}
    for block in blocks:
        members = {id(op) for op in block.ops}
        for op in block.ops:
            found.update((id(v), v) for v in op.inputs if id(v) not in members)
            if graph.is_output(op) or any(id(c) not in members for c in graph.consumers(op)):
                found[id(op)] = op
    found.update((id(v), v) for v in graph.outputs.values())
    return list(found.values())


def _resident(graph: Graph, compiled: Compiled, ids: dict[str, int]) -> set[int]:
    """Constants some launch reads from the device (a program's folded ones it does not)."""
    constants = {c.name for c in graph.constants}
    out: set[int] = set()
    for k, names in compiled.launches:
        exe = compiled.executables[k]
        read = names
        if isinstance(exe, Program):  # positions agree with this block's inputs
            read = [names[i] for i, v in enumerate(exe.inputs) if any(v is u for u in exe.used)]
        out.update(ids[n] for n in read if n in constants)
    return out


def _role(graph: Graph, v: Value) -> str:
    if isinstance(v, Constant):
        return "constant"
    if isinstance(v, Placeholder):
        return "input"
    return "output" if graph.is_output(v) else "intermediate"


def _nbytes(v: Value) -> int:
    return v.numel * v.dtype.itemsize


def _kernel_spec(k: int, exe: Executable, uses: int) -> KernelSpec:
    meta = exe.metadata
    kind = "program" if isinstance(exe, Program) else "kernel"
    return KernelSpec(k, exe.name, kind, uses, meta.get("schedule", kind), meta.get("algorithm"))


def _kernels(exe: Executable) -> list[Kernel]:
    return [k for k in (exe.kernels if isinstance(exe, Program) else [exe])
            if isinstance(k, Kernel)]


def _prebuild(be: Backend, executables: Sequence[Executable]) -> None:
    """Build every kernel at once where the backend builds in batches (NEON: one SIMDe parse
    per translation unit), from sources re-rendered with each kernel's own tunables (which
    give the same source, so the lazy build finds them built)."""
    if not be.batch_builds:
        return
    kernels = [k for exe in executables for k in _kernels(exe)]
    # each source once: unshared programs repeat their stages, and kernels of different
    # shapes can print the same code (a reshape is a copy), differing only in comments
    structures = {(fingerprint(k.loop), repr(sorted(k.metadata["tunables"].items()))): k
                  for k in kernels}
    unique: dict[str, Any] = {}
    for k in structures.values():
        source = be.render(be.choose(k.loop, k.metadata["tunables"]))
        code = "\n".join(line for line in source.text.splitlines()
                         if not line.lstrip().startswith(be.comment))
        unique.setdefault(code, source)
    be.prebuild(list(unique.values()))


def concurrent_safe(exe: Executable) -> bool:
    """Whether ``exe``'s launches may go to a concurrent queue (no shared scratch buffer)."""
    kernels = exe.kernels if isinstance(exe, Program) else [exe]
    return all(getattr(getattr(k, "runtime", None), "concurrent_safe", False) for k in kernels)


def _stages(plan: Plan, executables: Sequence[Executable], runtime: Runtime | None
            ) -> list[tuple[tuple[tuple[int, ...], ...], bool]]:
    """Per stage its groups of launch indices and whether they run concurrently: several
    groups, a runtime with concurrent queues, and kernels that may run so."""
    if plan.schedule is None:
        return [(((k,),), False) for k in range(len(plan.launches))]
    can = hasattr(runtime, "concurrently")
    return [(st.groups, can and len(st.groups) > 1 and all(
        concurrent_safe(executables[plan.launches[b].kernel]) for b in st.blocks))
        for st in plan.schedule.stages]


def _runtime(exe: Executable) -> Runtime:
    """The runtime ``exe`` launches on (a program's kernels share their backend's)."""
    kernel = exe.kernels[0] if isinstance(exe, Program) else exe
    assert isinstance(kernel, Kernel)
    return kernel.runtime


class CompiledModel:
    """A graph compiled for one backend: ``run(feeds)`` returns output name -> array.
    ``plan`` is plain data; ``executables[k]`` is the plan's kernel ``k``; ``timings`` are the
    compile phases' seconds. ``constants`` (name -> array) default to the graph's values (a
    model loaded from a save has no operators to read them from)."""

    def __init__(self, graph: Graph, plan: Plan, executables: Sequence[Executable],
                 timings: dict[str, float],
                 constants: Mapping[str, np.ndarray] | None = None) -> None:
        self.graph = graph
        self.plan = plan
        self.executables = tuple(executables)
        self.timings = timings
        self.runtime: Runtime | None = _runtime(self.executables[0]) if executables else None
        if constants is None:
            constants = {v.name: v.value for v in graph.constants}
        self.constants = {b.name: np.asarray(constants[b.name]) for b in plan.buffers
                          if b.role == "constant"}
        self._resident = {b.id: self._device(self.constants[b.name]) for b in plan.buffers
                          if b.resident}
        self._pool: list[_Arena] = []
        self._lock = threading.Lock()
        self._stages = _stages(plan, self.executables, self.runtime)
        # where the runtime's worker threads run during a run (``warm_up``)
        self.placement: str | None = None

    def warm_up(self, placement: str | None = None) -> None:
        """One run on zeros (every kernel built and its buffers made), then the placement of
        the runtime's worker threads timed on such runs and the fastest kept, applied before
        each run (OpenCL on PoCL: ``backends/opencl/placement.py``; none elsewhere); or
        ``placement`` untimed (a saved model's, chosen when it was compiled)."""
        zeros = {v.name: np.zeros(v.shape, v.dtype.numpy) for v in self.graph.inputs}
        self.run(zeros)
        rt = self.runtime
        if rt is not None and hasattr(rt, "choose_placement") and self.plan.launches:
            # a run applies the kept placement: unset, each timed run keeps the one on trial
            self.placement = None
            self.placement = rt.choose_placement(lambda: self.run(zeros), given=placement)

    def _device(self, array: np.ndarray) -> Any:
        assert self.runtime is not None
        return self.runtime.device_array(array)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's outputs by name, for ``feeds`` (input name -> array, each of the input's
        shape and dtype; ``ArgumentError`` otherwise)."""
        host = self._host(feeds)
        if not self.plan.launches:
            return self._outputs(None, host)
        if self.placement is not None:
            self.runtime.place(self.placement)  # type: ignore[union-attr]
        arena = self._take()
        try:
            pending = self._write(arena, host)
            for call in arena.calls:
                call()
            return self._outputs(arena, host, pending)
        finally:
            with self._lock:
                self._pool.append(arena)

    def bind(self, feeds: Mapping[str, np.ndarray]) -> list[Any]:
        """Device buffers for one run on ``feeds``, by buffer id, held apart from the runs'
        pool, every constant among them (the scheduler and the profile time launches on
        them, and a launch may read a constant that a program folded into itself)."""
        host = self._host(feeds)
        arena = self._arena()
        pending = self._write(arena, host)
        assert self.runtime is not None
        for b in self.plan.buffers:
            if b.role == "constant" and arena.handles[b.id] is None:
                arena.handles[b.id] = self._device(self.constants[b.name].reshape(b.shape))
        self.runtime.sync()
        del pending
        return arena.handles

    def _host(self, feeds: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
        """``feeds`` checked against the graph's inputs, by the inputs' buffer ids."""
        arrays = bind_inputs(f"model '{self.graph.name}'", self.graph.inputs, (), feeds)
        return {self.plan.inputs[k]: a for k, a in enumerate(arrays)}

    def _take(self) -> _Arena:
        """A set of buffers, with the launches bound to them, that no other run is using."""
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return self._arena()

    def _arena(self) -> _Arena:
        """New slot, input and output buffers (constants: the resident ones), and every launch
        of the plan bound to them, stage by stage (``Runtime.bound``)."""
        rt = self.runtime
        assert rt is not None
        plan = self.plan
        slots = {s.id: rt.device_empty(Buffer(f"slot{s.id}", (s.numel,), DType(s.dtype)))
                 for s in plan.slots}
        handles: list[Any] = [None] * len(plan.buffers)
        for b in plan.buffers:
            if b.role == "intermediate" and b.view_of is None:
                assert b.slot is not None
                handles[b.id] = slots[b.slot]
            elif b.role in ("input", "output"):
                handles[b.id] = rt.device_empty(Buffer(b.name, b.shape, DType(b.dtype)))
            elif b.resident:
                handles[b.id] = self._resident[b.id]
        for b in plan.buffers:  # a view's root is a slot's tenant, never a view
            if b.view_of is not None:
                handles[b.id] = rt.view(handles[b.view_of], b.offset,
                                        Buffer(b.name, b.shape, DType(b.dtype)))
        shared = {key: rt.device_empty(Buffer(f"stage{key[0]}", (numel,), DType(key[1])))
                  for key, numel in self._stage_buffers().items()}

        def bound(k: int, together: bool) -> Callable[[], None]:
            launch = plan.launches[k]
            exe = self.executables[launch.kernel]
            args = (handles[a] for a in launch.args)
            if isinstance(exe, Program) and not together:
                return exe.bound_launch(*args, intermediate=lambda j, buf: rt.view(
                    shared[(j, str(buf.dtype))], 0, buf))
            return exe.bound_launch(*args)

        def concurrently(groups: list[list[Callable[[], None]]]) -> Callable[[], None]:
            return lambda: rt.concurrently(groups)  # type: ignore[attr-defined]

        calls: list[Callable[[], None]] = []
        for groups, together in self._stages:
            if together:
                calls.append(concurrently([[bound(k, True) for k in g] for g in groups]))
            else:
                calls.extend(bound(k, False) for g in groups for k in g)
        return _Arena(handles, calls)

    def _stage_buffers(self) -> dict[tuple[int, str], int]:
        """Elements of the buffer that holds the ``j``-th intermediate of every program run
        one launch at a time, by (``j``, dtype): the largest such. The queue is in order, so
        one program's intermediates are dead before the next program's stages begin."""
        sizes: dict[tuple[int, str], int] = {}
        for groups, together in self._stages:
            for k in (k for g in groups for k in g):
                exe = self.executables[self.plan.launches[k].kernel]
                if isinstance(exe, Program) and not together:
                    for j, buf in enumerate(exe.intermediates):
                        key = (j, str(buf.dtype))
                        sizes[key] = max(sizes.get(key, 0), buf.numel)
        return sizes

    def _write(self, arena: _Arena, host: dict[int, np.ndarray]) -> list[Any]:
        """Copy the inputs into the arena's input buffers, in order with its launches; what
        the copies return, to hold until the device is synced (``Runtime.write``)."""
        assert self.runtime is not None
        return [self.runtime.write(arena.handles[k], array) for k, array in host.items()]

    def _outputs(self, arena: _Arena | None, host: dict[int, np.ndarray],
                 pending: list[Any] | None = None) -> dict[str, np.ndarray]:
        """The outputs, read back after the launches with one wait for the device; ``pending``
        what the input copies returned, held until then."""
        pending = list(pending or ())
        out: dict[str, np.ndarray] = {}
        for name, k in self.plan.outputs:
            b = self.plan.buffers[k]
            if b.role == "input":
                out[name] = host[k].copy()
            elif b.role == "constant":
                out[name] = self.constants[b.name].reshape(b.shape).copy()
            else:
                assert self.runtime is not None and arena is not None
                out[name] = np.empty(b.shape, np.dtype(b.dtype))
                pending.append(self.runtime.read(arena.handles[k], out[name]))
        if self.runtime is not None:
            self.runtime.sync()
        return out

    def sources(self) -> list[str]:
        """Each executable's source, by kernel id."""
        return [exe.source for exe in self.executables]
