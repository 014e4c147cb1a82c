"""PyOpenCL runtime: one lazily created context and queue, and a cache of built programs.

Launches go to the device's queue, except inside ``concurrently``, which gives each group of
launches an in-order queue of its own (IOS's concurrent stages, ``graph/ios.py``): the groups
start after everything queued before, and the main queue waits for all of them.

PoCL keeps its own on-disk cache of compiled kernels (``POCL_CACHE_DIR``, read once at the first
``get_platforms()``), so an in-process dict keyed by source is all we add.
"""
from __future__ import annotations

import contextvars
import math
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import hostmem
from ...errors import KernelgenError
from . import placement
from .device import DeviceInfo, read
from .waiting import Waits, seconds


@dataclass(frozen=True)
class Device:
    context: Any
    queue: Any
    device: Any
    info: DeviceInfo  # what code is generated for
    # the alignment a host array needs for a call to use it in place (``host_alignment``)
    host_alignment: int = 1
    waits: Waits = field(default_factory=Waits)  # polled or slept for (waiting.py)

    @property
    def name(self) -> str:
        return self.info.name


# KERNELGEN_OPENCL_DEVICE picks the device by a part of its platform's or its own name
# ('intel', 'pocl 3.1', 'oclgrind'); PYOPENCL_CTX is honoured when it is not set
SELECT_ENV = "KERNELGEN_OPENCL_DEVICE"
_lock = threading.Lock()
_device: Device | None = None
_programs: dict[str, Any] = {}
_side_queues: list[Any] = []  # the queues of concurrent groups, made as needed
# the queue this context's launches go to (inside ``concurrently``); None: the device's
_current_queue: contextvars.ContextVar[Any] = contextvars.ContextVar("kernelgen_cl_queue",
                                                                     default=None)


def _import_cl() -> Any:
    try:
        import pyopencl as cl
    except ImportError as exc:
        raise KernelgenError("the OpenCL backend needs pyopencl (pip install pyopencl "
                             "pocl-binary-distribution)") from exc
    return cl


_PROBE = "__kernel void kg_probe(__global float* x) { x[get_global_id(0)] += 1.0f; }"


def host_alignment(info: DeviceInfo) -> int:
    """The alignment a host array needs to be used in place by a ``USE_HOST_PTR`` buffer:
    PoCL's CPU device runs kernels on the host's memory at any address, so 1 there; others get
    the device's base alignment (Intel's CPU runtime copies a buffer that misses it to memory of
    its own and back at each map: a 64 MiB call took 10x the kernel, docs/toolchain.md). A
    probe cannot tell the two apart: Intel's copy back also lands before the map. NumPy's large
    arrays sit 16 bytes past a page, so this decides whether calls copy every input."""
    if info.unified_memory and "pocl" in info.name.lower():
        return 1
    return info.alignment


def _usable(cl: Any, dev: Any) -> bool:
    """Whether ``dev`` can build a kernel. PoCL 3.0 from the pip wheel cannot on CPUs its LLVM 14
    does not know (it asks for target CPU 'generic'); Debian's PoCL targets a named ISA level."""
    try:
        cl.Program(cl.Context([dev]), _PROBE).build()
        return True
    except cl.Error:
        return False


def label(platform: Any, dev: Any) -> str:
    """How a device is named to users, and what ``KERNELGEN_OPENCL_DEVICE`` is matched against."""
    return f"{platform.name.strip()} | {platform.version.strip()} | {dev.name.strip()}"


def list_devices() -> list[str]:
    """Every OpenCL device this process can see, as ``label`` names them."""
    cl = _import_cl()
    try:
        return [label(p, d) for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error:
        return []


def _rank(cl: Any, platform: Any, dev: Any) -> tuple[int, int]:
    """The default order: GPUs first, then PoCL's CPU devices, then other CPU runtimes;
    Oclgrind, a simulator for checking kernels, only when nothing else is there."""
    simulator = platform.name.strip() == "Oclgrind"
    return (simulator, 0 if dev.type & cl.device_type.GPU else
            1 if "PoCL" in platform.version else 2)


def _match(query: str, platform: Any, dev: Any) -> int | None:
    """Where ``query`` names the device, best first: 0 in the platform's name, 1 in its
    version, 2 in the device's name, 3 across them in ``label``; None nowhere. On an Intel
    CPU every implementation's device is an 'Intel(R) Xeon(R)', so 'intel' had picked the
    first platform listed (PoCL) instead of Intel's runtime."""
    q = query.lower()
    fields = (platform.name, platform.version, dev.name, label(platform, dev))
    return next((rank for rank, text in enumerate(fields) if q in text.lower()), None)


def _entries(cl: Any) -> list[tuple[int, int, Any, Any]]:
    """(platform index, device index, platform, device) of every device, in platform order."""
    return [(pi, di, p, d) for pi, p in enumerate(cl.get_platforms())
            for di, d in enumerate(p.get_devices())]


def _named(query: str, entries: list[tuple[int, int, Any, Any]]
           ) -> list[tuple[int, tuple[int, int, Any, Any]]]:
    """The entries ``query`` names with ``_match``'s rank, best first (platform order within
    a rank)."""
    found = [(rank, e) for e in entries if (rank := _match(query, e[2], e[3])) is not None]
    return sorted(found, key=lambda found_entry: found_entry[0])


def named_devices(query: str) -> list[tuple[int, str]]:
    """The devices ``query`` names, as ``KERNELGEN_OPENCL_DEVICE`` would choose among them:
    (``_match``'s rank, ``label``), best first; rank 0 or 1 means it names an implementation
    (a platform), not only a CPU."""
    cl = _import_cl()
    try:
        return [(rank, label(e[2], e[3])) for rank, e in _named(query, _entries(cl))]
    except cl.Error:
        return []


def _select(cl: Any) -> tuple[int, int]:
    """(platform index, device index) of the device to run on."""
    entries = _entries(cl)
    names = "; ".join(label(p, d) for _, _, p, d in entries) or "none"
    query = os.environ.get(SELECT_ENV, "").strip()
    if query:
        chosen = [e for _, e in _named(query, entries)]
        if not chosen:
            raise KernelgenError(f"{SELECT_ENV}={query!r} names no OpenCL device; devices: "
                                 f"{names}")
        if not _usable(cl, chosen[0][3]):
            raise KernelgenError(f"the OpenCL device {label(chosen[0][2], chosen[0][3])} "
                                 f"({SELECT_ENV}={query!r}) cannot build a kernel")
        return chosen[0][0], chosen[0][1]
    if os.environ.get("PYOPENCL_CTX"):
        dev = cl.create_some_context(interactive=False).devices[0]
        return next((pi, di) for pi, di, _, d in entries if d == dev)
    ranked = sorted(entries, key=lambda e: _rank(cl, e[2], e[3]))
    pi, di, _, _ = next(e for e in ranked if _usable(cl, e[3]))
    return pi, di


def device() -> Device:
    """The OpenCL device kernels run on: the one ``KERNELGEN_OPENCL_DEVICE`` names (a part of
    its name, see ``list_devices``), else ``PYOPENCL_CTX``'s, else the first that builds a
    kernel, GPUs first, then PoCL, then other CPU runtimes, Oclgrind last."""
    global _device
    with _lock:
        if _device is not None:
            return _device
        cl = _import_cl()
        try:
            pi, di = _select(cl)
        except (cl.Error, StopIteration) as exc:
            raise KernelgenError(
                "no OpenCL device that can build kernels was found; install PoCL "
                "(pip install pocl-binary-distribution, or on CPUs its LLVM does not know, "
                f"apt-get install pocl-opencl-icd) [{exc!r}]") from exc
        dev = cl.get_platforms()[pi].get_devices()[di]
        ctx = cl.Context([dev])
        queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        info = read(cl, pi, di)
        _device = Device(ctx, queue, dev, info, host_alignment(info))
        return _device


def view_alignment() -> int:
    """The byte alignment of a sub-buffer's origin on the device (``MEM_BASE_ADDR_ALIGN``
    is in bits)."""
    return max(int(device().device.mem_base_addr_align) // 8, 1)


def side_queue(k: int) -> Any:
    """The ``k``-th queue for concurrent groups (in order, like the device's)."""
    dev = device()
    with _lock:
        while len(_side_queues) <= k:
            _side_queues.append(_import_cl().CommandQueue(dev.context))
        return _side_queues[k]


def concurrently(groups: Sequence[Sequence[Callable[[], None]]]) -> None:
    """Call each group's enqueueing functions with their launches going to a queue of the
    group's own; the groups wait for what the device's queue held before, and later work on
    the device's queue waits for every group. Returns once everything is enqueued. A launch
    that packs into a kernel's shared scratch buffer must not be given here (it relies on the
    one in-order queue; ``OpenCLRuntime.concurrent_safe``)."""
    cl = _import_cl()
    main = device().queue
    start = cl.enqueue_marker(main)
    main.flush()
    done = []
    for k, group in enumerate(groups):
        queue = side_queue(k)
        cl.enqueue_barrier(queue, wait_for=[start])
        token = _current_queue.set(queue)
        try:
            for enqueue in group:
                enqueue()
        finally:
            _current_queue.reset(token)
        done.append(cl.enqueue_marker(queue))
        queue.flush()  # another queue waits on these events: they must reach the device
    cl.enqueue_barrier(main, wait_for=done)


def unbuildable_widths(source: str, info: DeviceInfo) -> list[int]:
    """The ``floatN`` widths above 4 that ``source`` declares and the device's vector probe
    rejected (``probe.py``): code generated for another device (``for_device``) can hold them."""
    used = {int(w) for w in re.findall(r"\bfloat(\d+)\b", source)}
    return sorted(w for w in used if w > 4 and w not in info.vector_widths)


def build(source: str, name: str) -> Any:
    """The compiled kernel ``name`` from ``source``, built once per process. A source with
    vector widths the device's probe rejected is refused before its compiler sees it: pip's
    PoCL 3.0 aborts the whole process on ``float16`` code on CPUs its LLVM does not know."""
    cl = _import_cl()
    with _lock:
        program = _programs.get(source)
    if program is None:
        dev = device()
        missing = unbuildable_widths(source, dev.info)
        if missing:
            names = ", ".join(f"float{w}" for w in missing)
            raise KernelgenError(
                f"OpenCL kernel '{name}' uses {names}, which the device '{dev.name}' does not "
                f"build correctly (kernelgen's vector probe accepted float vectors of "
                f"{'/'.join(map(str, dev.info.vector_widths)) or 'no'} lanes); generate the "
                f"kernel for this device (the default target) or for one with those widths")
        try:
            program = cl.Program(dev.context, source).build()
        except cl.RuntimeError as exc:
            raise KernelgenError(f"OpenCL build of kernel '{name}' failed:\n{exc}\n--- source "
                                 f"---\n{source}") from exc
        with _lock:
            _programs[source] = program
    return cl.Kernel(program, name)


def built(source: str) -> bool:
    """Whether this process has built the program of ``source``."""
    with _lock:
        return source in _programs


def program_binary(source: str) -> bytes | None:
    """The device binary of the program this process built from ``source``; None when it was
    not built here (or the implementation gives none)."""
    with _lock:
        program = _programs.get(source)
    if program is None:
        return None
    binaries = program.binaries
    return bytes(binaries[0]) if binaries and binaries[0] else None


def preload(source: str, binary: bytes) -> bool:
    """Build the program of ``source`` from ``binary`` (``program_binary`` of an earlier
    process on this device), so ``build`` finds it; False when the device refuses the binary
    (another driver version), and ``build`` compiles the source as usual."""
    cl = _import_cl()
    with _lock:
        if source in _programs:
            return True
    dev = device()
    try:
        program = cl.Program(dev.context, [dev.device], [binary]).build()
    except cl.Error:
        return False
    with _lock:
        _programs.setdefault(source, program)
    return True


class OpenCLRuntime:
    """Runs one generated kernel: builds it at first use, then enqueues it (after its packing
    kernel, when ``launch.pack`` is set). A kernel with ``launch.scratch`` takes a scratch
    buffer this runtime keeps after its outputs.

    A call on host arrays (``run``) uses them in place where the device works on host memory
    (CPUs, mobile GPUs: ``USE_HOST_PTR`` buffers, the outputs mapped back, nothing copied;
    arrays not aligned as the device wants are copied to aligned ones first), and copies
    them to and from the device otherwise. A kernel object's constants (``keep``) become
    device buffers once.

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
        self._scratch: Any = None  # shared by unbound launches, made at the first
        self._lock = threading.Lock()
        self._kept: dict[int, tuple[np.ndarray, Any]] = {}  # input index -> (array, buffer)
        self._packed_from: tuple[Any, ...] = ()  # the constants' buffers the panels hold
        self.fastest_s = math.inf  # its fastest run seen at a wait (waiting.py)

    def _compiled(self) -> Any:
        """The kernel (and its packing kernel), built once; call with the lock."""
        if self._kernel is None:
            kernel = build(self.source, self.name)
            self._check_group(kernel, self.geometry.local_size, self.name)
            if self.geometry.pack is not None:
                self._pack = build(self.source, f"{self.name}_pack")
                self._check_group(self._pack, self.geometry.pack.local_size, f"{self.name}_pack")
            self._kernel = kernel
        return self._kernel

    def _shared_scratch(self) -> Any:
        """The scratch buffer unbound launches, and bindings that pack at every launch, share
        (made at the first; a model's bindings of constant panels own theirs, so it is never
        made for them); None for a kernel without scratch. Call with the lock."""
        if self._scratch is None and self.geometry.scratch:
            self._scratch = self._new_scratch()
        return self._scratch

    def _new_scratch(self) -> Any:
        cl = _import_cl()
        return cl.Buffer(device().context, cl.mem_flags.READ_WRITE, 4 * self.geometry.scratch)

    @staticmethod
    def _check_group(kernel: Any, local: tuple[int, ...] | None, name: str) -> None:
        """A work-group larger than this kernel can run on the device (a GPU lowers the limit
        for kernels that use many registers) is an error naming the way out, not a failed
        enqueue."""
        if not local:
            return
        cl = _import_cl()
        dev = device()
        limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev.device)
        items = int(np.prod(local))
        if items > limit:
            raise KernelgenError(
                f"OpenCL kernel '{name}' launches work-groups of {items} items {tuple(local)}, "
                f"but the device ({dev.name}) runs this kernel in groups of at most {limit}; "
                f"emit it with local_size={limit} or less")

    def device_array(self, array: np.ndarray) -> Any:
        cl = _import_cl()
        mf = cl.mem_flags
        return cl.Buffer(device().context, mf.READ_ONLY | mf.COPY_HOST_PTR,
                         hostbuf=np.ascontiguousarray(array))

    def device_empty(self, buffer: Any) -> Any:
        cl = _import_cl()
        size = max(buffer.numel * buffer.dtype.itemsize, 1)
        return cl.Buffer(device().context, cl.mem_flags.READ_WRITE, size)

    @property
    def concurrent_safe(self) -> bool:
        """Whether bound launches (``bound``) may go to several queues at once: not with a
        packing launch filling a scratch buffer every launch of this kernel shares; yes when
        the panels are constants', which each binding packs into its own buffer once."""
        return not self.geometry.scratch or self._packs_constants

    @property
    def _packs_constants(self) -> bool:
        return self.geometry.pack is not None and bool(self.geometry.pack_once)

    def concurrently(self, groups: Sequence[Sequence[Callable[[], None]]]) -> None:
        concurrently(groups)

    def choose_placement(self, run: Callable[[], object], given: str | None = None
                         ) -> str | None:
        """The placement of the device's worker threads under which ``run`` (a compiled
        model's run) is fastest, or ``given`` untimed (the workers found by ``run``'s runs
        all the same), or None where they are not placed (``placement.py``)."""
        return placement.choose(run, device().info, self.place, given=given)

    def place(self, name: str) -> None:
        """Pin the device's worker threads as ``choose_placement`` chose, and poll for the
        end of a run where that placement says so (``waiting.py``)."""
        placement.place(name)
        device().waits.poll_runs = placement.polls(name)

    def launch(self, handles: Sequence[Any]) -> None:
        cl = _import_cl()
        if self.geometry.scratch:
            self._refuse_concurrent()
        queue = _current_queue.get() or device().queue
        with self._lock:
            kernel = self._compiled()
            scratch = self._shared_scratch()
            keys = tuple(handles[i] for i in self.geometry.pack_once)
            if self._repack(keys):
                pack = self.geometry.pack
                self._pack.set_args(*handles[:self.n_inputs], scratch)
                cl.enqueue_nd_range_kernel(queue, self._pack, pack.global_size, pack.local_size)
                self._packed_from = keys
            if scratch is not None:
                handles = [*handles, scratch]
            kernel.set_args(*handles)
            event = cl.enqueue_nd_range_kernel(queue, kernel, self.geometry.global_size,
                                               self.geometry.local_size)
        device().waits.launched(event, self)

    def bound(self, handles: Sequence[Any]) -> Callable[[], None]:
        """``launch`` on ``handles`` as a function, with the arguments set once: on a kernel
        object of its own, so no other binding or caller can change them. (The bundled
        model's launches took 3.7 us each to enqueue so on PoCL, 5.7 with their arguments
        set every time.) The function holds the buffers: a kernel's arguments do not keep a
        buffer alive.

        Panels of constants (``Launch.pack_once``) are packed here, once, into a buffer of
        this binding's own: blocks of one structure share a kernel but not their weights, and
        panels shared between them were packed again at every launch (the BERT layer's Q, K
        and V projections: two packs a run)."""
        cl = _import_cl()
        with self._lock:
            self._compiled()
            scratch = self._new_scratch() if self._packs_constants else self._shared_scratch()
        kernel = build(self.source, self.name)
        geometry, main, waits = self.geometry, device().queue, device().waits
        global_size, local_size = geometry.global_size, geometry.local_size
        pack = None
        if geometry.pack is not None:
            pack = build(self.source, f"{self.name}_pack")
            pack.set_args(*handles[:self.n_inputs], scratch)
        if self._packs_constants:
            cl.enqueue_nd_range_kernel(main, pack, geometry.pack.global_size,
                                       geometry.pack.local_size).wait()
        args = (*handles, *((scratch,) if scratch is not None else ()))
        kernel.set_args(*args)
        if self._packs_constants or scratch is None:
            def plain(held: tuple[Any, ...] = args) -> None:
                waits.launched(cl.enqueue_nd_range_kernel(
                    _current_queue.get() or main, kernel, global_size, local_size), self)
            return plain

        def packed(held: tuple[Any, ...] = args) -> None:
            self._refuse_concurrent()
            with self._lock:  # the packing launch and the kernel share the scratch panels
                if pack is not None:
                    waits.note(cl.enqueue_nd_range_kernel(main, pack, geometry.pack.global_size,
                                                          geometry.pack.local_size))
                waits.launched(cl.enqueue_nd_range_kernel(main, kernel, global_size,
                                                          local_size), self)
        return packed

    def _refuse_concurrent(self) -> None:
        """A kernel that packs into the scratch buffer every launch of it shares relies on
        the device's one in-order queue: an error in a concurrent group."""
        if _current_queue.get() is not None:
            raise KernelgenError(f"OpenCL kernel '{self.name}' packs into a shared scratch "
                                 f"buffer: it cannot run in a concurrent group")

    def _repack(self, keys: tuple[Any, ...]) -> bool:
        """Whether the packing launch runs before the kernel, whose constant operands
        (``Launch.pack_once``) are in ``keys``: constant panels are packed again only from
        other buffers, since a constant's buffer is never written, so the same buffer holds
        the same value. Call with the lock."""
        return self._pack is not None and not (keys and _same(keys, self._packed_from))

    def write(self, handle: Any, array: np.ndarray) -> Any:
        """The copy's event: PyOpenCL waits for a copy from or to host memory when its event
        is released, so the caller holds it until it syncs (a wait per copy cost a run of
        the bundled model 0.07 ms, a quarter of it)."""
        return _import_cl().enqueue_copy(device().queue, handle, array, is_blocking=False)

    def read(self, handle: Any, out: np.ndarray) -> Any:
        return _import_cl().enqueue_copy(device().queue, out, handle, is_blocking=False)

    def sync(self) -> None:
        dev = device()
        dev.waits.finish(dev.queue)

    def device_ms(self, call: Callable[[], None]) -> float | None:
        """The milliseconds the device ran the kernels that ``call`` enqueues (their events'
        profiling counters, summed), waited for: a launch's time without the host's launch
        and wait (``graph/profile.py``). None where the implementation gives no counters.
        Not for use while other threads launch on the device."""
        dev = device()
        events: list[Any] = []
        dev.waits.recorded = events
        try:
            call()
        finally:
            dev.waits.recorded = None
        self.sync()
        total = sum(seconds(e) for e in events)
        return total * 1e3 if events and math.isfinite(total) else None

    def view(self, handle: Any, offset: int, buffer: Any) -> Any:
        size = buffer.dtype.itemsize
        return handle.get_sub_region(offset * size, max(buffer.numel * size, 1))

    def to_host(self, handle: Any, out: np.ndarray) -> None:
        """Copy a device buffer into ``out`` once the queued launches are done."""
        cl = _import_cl()
        cl.enqueue_copy(device().queue, out, handle)
        self.sync()

    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray],
            keep: Sequence[bool] = ()) -> None:
        """Run on host arrays; ``keep[i]``: input ``i`` is a constant of the kernel object (the
        same array on every call), made a device buffer once."""
        dev = device()
        shared = dev.info.unified_memory
        wrap = self._in_place if shared else self.device_array
        handles = [self._constant(i, a, wrap) if i < len(keep) and keep[i] else wrap(a)
                   for i, a in enumerate(inputs)]
        if shared:
            written = [o if hostmem.aligned(o.ctypes.data, dev.host_alignment)
                       else hostmem.empty(o.shape, o.dtype) for o in outputs]
            out_handles = [self._in_place(o, writable=True) for o in written]
        else:
            written = outputs
            out_handles = [self._device_output(o) for o in outputs]
        self.launch([*handles, *out_handles])
        if shared:  # the maps below would sleep until the kernel is done (waiting.py)
            self.sync()
        for o, w, h in zip(outputs, written, out_handles):
            self._read_back(h, w, shared)
            if w is not o:
                np.copyto(o, w)
        self.sync()

    def _constant(self, index: int, array: np.ndarray, wrap: Any) -> Any:
        with self._lock:
            kept = self._kept.get(index)
            if kept is None or kept[0] is not array:
                kept = (array, wrap(array))
                self._kept[index] = kept
            return kept[1]

    def _in_place(self, array: np.ndarray, writable: bool = False) -> Any:
        """A buffer over ``array``'s own memory (an aligned copy of an array that is not
        aligned as the device needs to use it in place, ``host_alignment``)."""
        cl = _import_cl()
        mf = cl.mem_flags
        if not hostmem.aligned(array.ctypes.data, device().host_alignment):
            array = hostmem.copy(array)
        flags = (mf.READ_WRITE if writable else mf.READ_ONLY) | mf.USE_HOST_PTR
        return cl.Buffer(device().context, flags, hostbuf=array if array.nbytes else
                         np.zeros(1, array.dtype))

    def _device_output(self, out: np.ndarray) -> Any:
        cl = _import_cl()
        return cl.Buffer(device().context, cl.mem_flags.WRITE_ONLY, max(out.nbytes, 1))

    def _read_back(self, handle: Any, out: np.ndarray, shared: bool) -> None:
        """Make the kernel's results visible in ``out``: mapping a buffer over host memory
        (the map is the host array itself on CPU devices), copying a device's own buffer."""
        cl = _import_cl()
        queue = device().queue
        if not out.nbytes:
            return
        if not shared:
            cl.enqueue_copy(queue, out, handle)
            return
        mapped, mapping = cl.enqueue_map_buffer(queue, handle, cl.map_flags.READ, 0,
                                                out.shape, out.dtype, is_blocking=False)
        waits = device().waits
        waits.wait_for_map(queue, mapping)
        if mapped.ctypes.data != out.ctypes.data:  # an implementation that copied after all
            np.copyto(out, mapped)
        waits.wait_for_map(queue, mapped.base.release(queue))


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two sequences hold the same objects (buffers compare by identity)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))
