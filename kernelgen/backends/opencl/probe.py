"""Which explicit vector widths an OpenCL device's compiler builds and runs correctly, found by
building a small kernel per width **in a child process**.

A compiler that cannot lower a construct does not always say so: pip's PoCL 3.0 (LLVM 14, which
targets a generic x86-64 on CPUs it does not know) aborts the whole process on a ``float16``
``fma`` (``LLVM ERROR: Cannot select ... _Z7_cl_fmaDv16_fS_S_``) and segfaults on other
``float16`` code. So the widths are tried in a child process: first all in one program (one
build), and where that kills the child, in another child one program a width from the narrowest
up (``--each``), each result reported as it goes: a width whose build kills the child is recorded
as failed, and the widths before it stand. The parent caches the answer per device and driver
(``device.py``), and runs this file by its path (it imports no kernelgen module).

    python kernelgen/backends/opencl/probe.py [--each] PLATFORM DEVICE  # as get_platforms()

prints one line per width: ``<width> ok`` or ``<width> failed: <why>``.

    python kernelgen/backends/opencl/probe.py --elementwise PLATFORM DEVICE WIDTH

prints ``elementwise <gain>``: how much faster a streaming kernel (``relu(x + y)`` over
``STREAM_FLOATS``) runs with a ``floatWIDTH`` vector per work-item than with one point per
work-item (``elementwise_gain``; ``element_vectors.py`` says why it is asked).
"""
from __future__ import annotations

import statistics
import string
import sys
from collections.abc import Iterable, Sequence

import numpy as np

WIDTHS = (4, 8, 16)  # narrowest first: a crash at one width keeps the answers before it

# Every vector construct the OpenCL templates print (backends/opencl/language.py: loads and
# stores, fma, NaN-propagating max through a lane mask and select, halving with .lo/.hi, lane
# access, composing a vector from lanes, as a stride-2 read picks its even ones, the bit casts
# of the fast math library). REVISION keys the cached answers: a new construct probes every
# device again.
REVISION = 2
_KERNEL = string.Template("""
__kernel void kg_probe(__global const float* x, __global float* y)
{
    const int i = get_global_id(0);
    float$w a = vload$w(0, x + $w * i);
    float$w c = fma(a, (float$w)(0.5f), a);                      /* 1.5 a */
    int$w m = (c > a) | isnan(c);
    float$w d = select(a, c, m);                                 /* max(c, a), NaN kept */
    float$w p = as_float$w((convert_int$w(rint(a)) + 127) << 23); /* 2^rint(a) */
    float$w q = (float$w)($deinterleaved);                      /* even lanes, odd */
    float$w e = d + p * 0.0f + (float$w)(a.s0) + q;
    vstore$w(e, 0, y + $w * i);
$halve
    y[$w * get_global_size(0) + i] = s1;
}
""")


def source(width: int) -> str:
    """The probe kernel at ``width`` lanes: ``y[W*i + j] = max(1.5 x, x) + x[W*i]`` plus the
    item's lanes deinterleaved (even ones first) and, past the vectors, each work-item's lane
    sum by halving ``.lo + .hi``."""
    halve, v, w = [], "e", width
    while w > 1:
        w //= 2
        halve.append(f"    float{w if w > 1 else ''} s{w} = {v}.lo + {v}.hi;")
        v = f"s{w}"
    lanes = [f"a.s{j:x}" for j in [*range(0, width, 2), *range(1, width, 2)]]
    return _KERNEL.substitute(w=width, halve="\n".join(halve), deinterleaved=", ".join(lanes))


def expected(x: np.ndarray, width: int, items: int) -> np.ndarray:
    lanes = x[:width * items].reshape(items, width)
    e = np.maximum(1.5 * lanes, lanes) + lanes[:, :1] + \
        np.concatenate([lanes[:, 0::2], lanes[:, 1::2]], axis=1)
    return np.concatenate([e.ravel(), e.sum(axis=1)]).astype(np.float32)


def check(cl: object, device: object, width: int) -> str | None:
    """None when the probe kernel at ``width`` builds and computes the right values; else why."""
    return check_together(cl, device, (width,))[width]


def check_together(cl: object, device: object, widths: Sequence[int]) -> dict[int, str | None]:
    """``check`` at each of ``widths``, their kernels built as one program (PoCL takes about a
    second a build whatever its size); where that program does not build, each width is built
    alone, so that one width's failure does not fail the others."""
    ctx = cl.Context([device])  # type: ignore[attr-defined]
    queue = cl.CommandQueue(ctx)  # type: ignore[attr-defined]
    text = "\n".join(source(w).replace("kg_probe", f"kg_probe{w}") for w in widths)
    try:
        prg = cl.Program(ctx, text).build()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - any failure means a width is unusable
        if len(widths) > 1:
            return {w: check(cl, device, w) for w in widths}
        return {widths[0]: " ".join(str(exc).split())[:300]}
    return {w: _run(cl, ctx, queue, prg, w) for w in widths}


def _run(cl: object, ctx: object, queue: object, prg: object, width: int) -> str | None:
    items = 8
    rng = np.random.default_rng(width)
    x = rng.uniform(-3, 3, width * items).astype(np.float32)
    mf = cl.mem_flags  # type: ignore[attr-defined]
    try:
        kernel = cl.Kernel(prg, f"kg_probe{width}")  # type: ignore[attr-defined]
        xb = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)  # type: ignore
        y = np.zeros(width * items + items, np.float32)
        yb = cl.Buffer(ctx, mf.WRITE_ONLY, y.nbytes)  # type: ignore[attr-defined]
        kernel(queue, (items,), None, xb, yb)
        cl.enqueue_copy(queue, y, yb)  # type: ignore[attr-defined]
        queue.finish()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - any failure means the width is unusable
        return " ".join(str(exc).split())[:300]
    want = expected(x, width, items)
    if not np.allclose(y, want, rtol=1e-5, atol=1e-5):
        return f"wrong values (max error {float(np.max(np.abs(y - want))):.3g})"
    return None


STREAM_FLOATS = 1 << 18  # 3 MiB moved a launch: in the caches, where launches differ most
STREAM_BLOCKS, STREAM_LAUNCHES = 5, 4
_STREAM = string.Template("""
__kernel void kg_points(__global const float* x, __global const float* y, __global float* z)
{
    const int i = get_global_id(0);
    z[i] = fmax(x[i] + y[i], 0.0f);
}
__kernel void kg_vectors(__global const float* x, __global const float* y, __global float* z)
{
    const int i = get_global_id(0);
    vstore$w(fmax(vload$w(i, x) + vload$w(i, y), 0.0f), i, z);
}
""")


def elementwise_gain(cl: object, device: object, width: int) -> float:
    """The median time of ``relu(x + y)`` one point per work-item over that of one
    ``floatWIDTH`` vector per work-item (both in work-groups of 256 items), in alternating
    blocks of launches."""
    ctx = cl.Context([device])  # type: ignore[attr-defined]
    queue = cl.CommandQueue(  # type: ignore[attr-defined]
        ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)  # type: ignore
    mf = cl.mem_flags  # type: ignore[attr-defined]
    prg = cl.Program(ctx, _STREAM.substitute(w=width)).build()  # type: ignore[attr-defined]
    x = np.linspace(-1, 1, STREAM_FLOATS, dtype=np.float32)
    bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)  # type: ignore
            for _ in range(2)] + [cl.Buffer(ctx, mf.WRITE_ONLY, x.nbytes)]  # type: ignore
    runs = {"kg_points": STREAM_FLOATS, "kg_vectors": STREAM_FLOATS // width}
    kernels = {name: cl.Kernel(prg, name) for name in runs}  # type: ignore[attr-defined]
    times: dict[str, list[float]] = {name: [] for name in runs}
    for name, kernel in kernels.items():
        kernel.set_args(*bufs)
        cl.enqueue_nd_range_kernel(queue, kernel, (runs[name],), (256,)).wait()  # type: ignore
    for _ in range(STREAM_BLOCKS):
        for name, kernel in kernels.items():
            for _ in range(STREAM_LAUNCHES):
                event = cl.enqueue_nd_range_kernel(  # type: ignore[attr-defined]
                    queue, kernel, (runs[name],), (256,))
                event.wait()
                times[name].append(event.profile.end - event.profile.start)
    return statistics.median(times["kg_points"]) / statistics.median(times["kg_vectors"])


def main(argv: list[str]) -> int:
    import pyopencl as cl
    if argv and argv[0] == "--elementwise":
        platform, device, width = (int(a) for a in argv[1:4])
        dev = cl.get_platforms()[platform].get_devices()[device]
        print(f"elementwise {elementwise_gain(cl, dev, width):.3f}", flush=True)
        return 0
    each = argv[0] == "--each"
    platform, device = (int(a) for a in argv[each:each + 2])
    dev = cl.get_platforms()[platform].get_devices()[device]
    results: Iterable[tuple[int, str | None]]
    if each:  # narrowest first, printed as they go: a crash keeps the answers before it
        results = ((width, check(cl, dev, width)) for width in WIDTHS)
    else:
        results = check_together(cl, dev, WIDTHS).items()
    for width, why in results:
        print(f"{width} ok" if why is None else f"{width} failed: {why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
