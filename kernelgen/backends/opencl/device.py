"""The OpenCL device kernels are generated for, as data: read from the device this process runs
on (``read``), or declared (``PROFILES``: a mobile GPU, a desktop GPU, CPUs), so that code for a
device can be generated and checked on a machine without it.

What generation reads from it (``capabilities``): the explicit vector widths its compiler
builds (a probe in a child process, ``probe.py``, cached per device and driver), the work-group
and work-item limits, local memory, whether it is a CPU (rows reduce in one work-item with
explicit vectors there, across a work-group on a GPU), fp64, and host-unified memory (calls then
wrap NumPy arrays instead of copying them).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from ...dtypes import DType
from ...options import cache_dir
from ...version import __version__
from ..base import Capabilities
from . import probe

# the explicit float vectors of a 'row' reduction (float8: wider measured no faster on PoCL)
ROW_WIDTH = 8
PROBE_TIMEOUT_S = 120
# elementwise kernels take explicit vectors where they ran this much faster (``probe.py``):
# Intel's CPU runtime 1.55-2.88x, Debian's PoCL 3.1 0.83-1.05x (three probes each, Sapphire
# Rapids, 2026-12-03)
ELEMENTWISE_GAIN = 1.25


@dataclass(frozen=True)
class DeviceInfo:
    """What kernelgen generates for. ``name`` keys tuned results (the Fast-Run database)."""

    name: str
    kind: str                        # 'cpu', 'gpu' or 'accelerator'
    compute_units: int
    max_work_group: int              # work-items of one work-group, at most
    max_item_sizes: tuple[int, ...]  # work-items along each NDRange dimension, at most
    local_memory: int                # bytes of __local memory a work-group may use
    preferred_width: int             # preferred float vector width
    native_width: int                # native float vector width
    fp16: bool                       # cl_khr_fp16 (half arithmetic; half storage is core)
    fp64: bool                       # double precision
    unified_memory: bool             # the device works on host memory (CPUs, mobile GPUs)
    alignment: int                   # bytes a host array's address needs to be used in place
    vector_widths: tuple[int, ...]   # explicit floatN widths that build and run, widest first
    simulator: bool = False          # a checker (Oclgrind), never chosen by default
    # elementwise kernels as a vector per work-item (``element_vectors.py``), as measured
    explicit_elementwise: bool = False

    def describe(self) -> str:
        """One line for a user: what generation takes from this device."""
        extras = [word for word, has in (("fp64", self.fp64), ("unified memory",
                                                                self.unified_memory)) if has]
        return (f"{self.name}: {self.kind}, {self.compute_units} compute units, work-groups "
                f"<= {self.max_work_group}, {self.local_memory // 1024} KiB local memory, "
                f"float vectors {'/'.join(map(str, self.vector_widths)) or 'none'}"
                + "".join(f", {e}" for e in extras))


def capabilities(info: DeviceInfo) -> Capabilities:
    """The code generator's view of ``info``."""
    cpu = info.kind == "cpu"
    widths = info.vector_widths if cpu else tuple(w for w in info.vector_widths if w <= 4)
    dtypes = frozenset(DType) if info.fp64 else frozenset(DType) - {DType.float64}
    return Capabilities(
        name="opencl", dtypes=dtypes, vector_width=min(ROW_WIDTH, max(widths, default=1)),
        vector_widths=widths, max_work_group=info.max_work_group,
        max_item_sizes=info.max_item_sizes, local_memory=info.local_memory,
        compute_units=info.compute_units, unified_memory=info.unified_memory,
        # A CPU device runs a work-group on one core: rows reduce fastest as one work-item with
        # explicit vector loops (measured 2.4 ms vs 13 ms for a 1024x4096 softmax on PoCL);
        # a GPU spreads a row over a work-group's items.
        register_lanes=info.native_width if cpu else 0,
        vector_registers=(32 if info.native_width >= 16 else 16) if cpu else 0,
        simd_within_work_item=cpu and bool(widths), pads_aliased_rows=cpu,
        explicit_elementwise=cpu and bool(widths) and info.explicit_elementwise,
        direct_schedule="item", pointwise_conv_in_place=True, winograd_4x4=cpu,
        split_small_convs=cpu, im2col_max_channels=32 if cpu else 0,
        winograd_max_waste=1.25 if cpu else 0.0)


# --- declared devices ---------------------------------------------------------------------

def _profile(name: str, kind: str, units: int, group: int, items: tuple[int, ...],
             local_kib: int, preferred: int, widths: tuple[int, ...], fp16: bool, fp64: bool,
             unified: bool) -> DeviceInfo:
    return DeviceInfo(f"profile:{name}", kind, units, group, items, local_kib * 1024, preferred,
                      preferred, fp16, fp64, unified, 128, widths)


PROFILES: dict[str, DeviceInfo] = {p.name.removeprefix("profile:"): p for p in (
    # what these CPUs' PoCL reports: AVX-512 (16 float lanes), AVX2 (8 lanes; float16 builds
    # as two registers) and a generic x86-64 build (SSE: pip's PoCL on a CPU its LLVM does not
    # know, whose float16 code aborts)
    _profile("cpu-avx512", "cpu", 2, 4096, (4096, 4096, 4096), 1024, 16, (16, 8, 4),
             False, True, True),
    _profile("cpu-avx2", "cpu", 2, 4096, (4096, 4096, 4096), 512, 8, (16, 8, 4),
             False, True, True),
    _profile("cpu-sse", "cpu", 2, 4096, (4096, 4096, 4096), 1024, 4, (8, 4), False, True,
             True),
    # an Arm Mali-class phone GPU: small work-groups and local memory, host-unified memory,
    # no fp64
    _profile("mobile-gpu", "gpu", 16, 256, (256, 256, 256), 32, 4, (16, 8, 4), True, False,
             True),
    # a discrete GPU: 1024-item work-groups, 48 KiB local memory, its own memory
    _profile("desktop-gpu", "gpu", 80, 1024, (1024, 1024, 64), 48, 1, (16, 8, 4), True, True,
             False),
)}


def profile(name: str) -> DeviceInfo:
    """The declared device ``name`` (``PROFILES``)."""
    if name not in PROFILES:
        raise KeyError(f"no OpenCL device profile '{name}'; profiles: {', '.join(PROFILES)}")
    return PROFILES[name]


# --- the device this process runs on ------------------------------------------------------

def read(cl: Any, platform_index: int, device_index: int) -> DeviceInfo:
    """``DeviceInfo`` of device ``device_index`` of platform ``platform_index`` (the indices of
    ``cl.get_platforms()`` in this environment), probing its vector widths once per driver."""
    platform = cl.get_platforms()[platform_index]
    dev = platform.get_devices()[device_index]
    kinds = {cl.device_type.CPU: "cpu", cl.device_type.GPU: "gpu"}
    kind = next((word for bit, word in kinds.items() if dev.type & bit), "accelerator")
    extensions = dev.extensions.split()
    simulator = platform.name.strip() == "Oclgrind"
    identity = _identity(platform, dev)
    widths = probed_widths(platform_index, device_index, identity)
    return DeviceInfo(
        name=f"{platform.version.strip()} / {dev.name.strip()}", kind=kind,
        compute_units=int(dev.max_compute_units), max_work_group=int(dev.max_work_group_size),
        max_item_sizes=tuple(int(n) for n in dev.max_work_item_sizes),
        local_memory=int(dev.local_mem_size),
        preferred_width=int(dev.preferred_vector_width_float),
        native_width=int(dev.native_vector_width_float),
        fp16="cl_khr_fp16" in extensions,
        fp64="cl_khr_fp64" in extensions or bool(dev.double_fp_config),
        # Oclgrind's uninitialised-value check does not see what the host wrote into a
        # USE_HOST_PTR buffer (it reports every read of one): calls copy in and out there
        unified_memory=(bool(dev.host_unified_memory) or kind == "cpu") and not simulator,
        alignment=max(int(dev.mem_base_addr_align) // 8, 1),
        vector_widths=widths, simulator=simulator,
        explicit_elementwise=kind == "cpu" and bool(widths) and not simulator and
        probed_elementwise(platform_index, device_index, identity, min(widths[0], 16)))


def _identity(platform: Any, dev: Any) -> str:
    return " | ".join((platform.name.strip(), platform.version.strip(), dev.name.strip(),
                       dev.driver_version.strip(), __version__, f"probe {probe.REVISION}"))


def probed_widths(platform_index: int, device_index: int, identity: str) -> tuple[int, ...]:
    """The explicit vector widths the device builds and runs correctly, widest first:
    ``KERNELGEN_OPENCL_VECTOR_WIDTHS`` (e.g. ``8,4``) if set, else the cached probe of this
    device and driver, else a new probe in a child process (about a second, once)."""
    given = os.environ.get("KERNELGEN_OPENCL_VECTOR_WIDTHS")
    if given:
        return tuple(sorted({int(w) for w in given.split(",") if w.strip()}, reverse=True))
    path = _cache_path("probe", identity)
    stored = _stored(path, identity)
    if stored is not None and isinstance(stored.get("vector_widths"), list):
        return tuple(stored["vector_widths"])
    report = _run_probe(platform_index, device_index)
    widths = tuple(sorted((w for w, why in report.items() if why is None), reverse=True))
    _store(path, {"identity": identity, "vector_widths": list(widths),
                  "failures": {str(w): why for w, why in report.items() if why is not None}})
    return widths


def probed_elementwise(platform_index: int, device_index: int, identity: str,
                       width: int) -> bool:
    """Whether elementwise kernels run as a ``floatWIDTH`` vector per work-item here
    (``element_vectors.py``): ``KERNELGEN_OPENCL_EXPLICIT_ELEMENTWISE`` (1 or 0) if set, else
    the cached measurement of this device and driver, else a new one in a child process
    (``probe.elementwise_gain``, about a second, once): yes from ``ELEMENTWISE_GAIN`` on."""
    given = os.environ.get("KERNELGEN_OPENCL_EXPLICIT_ELEMENTWISE")
    if given is not None and given.strip():
        return given.strip() not in ("0", "false", "no")
    path = _cache_path("elementwise", f"{identity} | width {width}")
    stored = _stored(path, f"{identity} | width {width}")
    if stored is not None and isinstance(stored.get("gain"), (int, float)):
        return stored["gain"] >= ELEMENTWISE_GAIN
    gain = _run_elementwise_probe(platform_index, device_index, width)
    _store(path, {"identity": f"{identity} | width {width}", "gain": gain})
    return gain >= ELEMENTWISE_GAIN


def _cache_path(kind: str, identity: str) -> Any:
    return cache_dir("opencl", f"{kind}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.json")


def _stored(path: Any, identity: str) -> dict[str, Any] | None:
    """The record cached at ``path`` for ``identity``; None if there is none (or a damaged
    one: the caller measures again)."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) and stored.get("identity") == identity else None


def _store(path: Any, record: dict[str, Any]) -> None:
    """``record`` at ``path``, atomically: another process may read it at the same time. A
    cache that cannot be written is skipped: the next process measures again (a second)."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass


def _probe_command(*args: str) -> list[str]:
    """The child process running ``probe.py`` with ``args``: from its file, not as ``python -m
    kernelgen...``, because it needs only NumPy and PyOpenCL and importing kernelgen first took
    longer (1.2-2.8 s) than the probe itself, twice in every cold compile."""
    run_file = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
    return [sys.executable, "-c", run_file, probe.__file__, *args]


def _run_elementwise_probe(platform_index: int, device_index: int, width: int) -> float:
    """``probe.elementwise_gain`` measured in a child process; 0 where it failed (points per
    work-item stay, as before the measurement existed)."""
    cmd = _probe_command("--elementwise", str(platform_index), str(device_index), str(width))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError):
        return 0.0
    for line in done.stdout.splitlines():
        head, _, rest = line.partition(" ")
        if head == "elementwise":
            try:
                return float(rest)
            except ValueError:
                break
    return 0.0


def _probe_child(platform_index: int, device_index: int, *flags: str) -> tuple[str, str, int]:
    """The width probe's stdout, stderr and exit code (OSError: no interpreter to start)."""
    cmd = _probe_command(*flags, str(platform_index), str(device_index))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        return done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return out, f"timed out after {PROBE_TIMEOUT_S} s", -1


def _reported(out: str) -> dict[int, str | None]:
    """The widths a probe child printed: None (builds and runs) or why not."""
    report: dict[int, str | None] = {}
    for line in out.splitlines():
        head, _, rest = line.partition(" ")
        if head.isdigit() and int(head) in probe.WIDTHS:
            report[int(head)] = None if rest.strip() == "ok" else rest.removeprefix("failed: ")
    return report


def _run_probe(platform_index: int, device_index: int) -> dict[int, str | None]:
    """Each probed width -> None (builds and runs) or why not. A child that reported no width
    (it crashed building them together) is followed by one building them one at a time; a
    width that child did not report (it crashed or hung building it) failed, and so did every
    wider one."""
    try:
        out, err, code = _probe_child(platform_index, device_index)
        report = _reported(out)
        if not report:
            out, err, code = _probe_child(platform_index, device_index, "--each")
            report = _reported(out)
    except OSError as exc:  # no interpreter to start: assume the narrowest width only
        return {w: None if w == min(probe.WIDTHS) else f"not probed ({exc})"
                for w in probe.WIDTHS}
    last = (err.strip().splitlines() or [f"exit code {code}"])[-1]
    for width in probe.WIDTHS:
        report.setdefault(width, f"the compiler crashed building it ({last[:200]})")
    return report
