"""A hand-written OpenCL attention kernel whose scores read a transposed panel of K, against
kernelgen's fused kernel (the ``row`` schedule) with the keys' dot products (``panel=False``)
and with its own panel (``backends/opencl/panel.py``, the default), and onnxruntime, in one
run: the experiment behind the generated panel and the measure of what it still lacks
(docs/benchmarks.md, "Attention with K transposed into a panel").

The generated kernel is also timed with P V reading a row of weights ``E / sum(E)`` (the form
before ``lower/staging.py``'s ``_normalise_after_sums``).

With ``panel=False`` the fused kernel computes each score as a dot product along the depth,
folded across the lanes, one work-item per 8 queries. Here one work-item takes a whole head:

1. K of the head (keys x depth) is transposed into local memory, 16 x 16 blocks in registers
   (four rounds of interleaving shuffles), rows padded by ``--pad`` floats (without it, rows
   256 floats apart fall into the same few L1 sets);
2. 8 queries at a time, each score row is a sum over the depth of a query's scalar times a
   panel row of 32 keys: two vectors of 16 keys, 16 accumulators, no lane folds;
3. the rows' max and exp sum, then P V with the keys' weights broadcast over rows of V.

``--phases`` times the kernel with each phase left out (its results then wrong) to say where
its time goes. Shapes: sequence a multiple of 32, depth of 16 (an experiment, not a template).

    python bench/attention_panel.py [--rounds 5] [--repeat 30] [--phases] [--json FILE]

The kernels run round-robin, onnxruntime in blocks before and after them; medians in ms.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen.backends.opencl import placement
from kernelgen.backends.opencl import runtime as cl_runtime
from kernelgen.lower import staging
from kernelgen.measure import round_robin, runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patterns import attention, ort_runner  # noqa: E402

SHAPES = [(8, 256, 64), (12, 128, 64), (4, 512, 64)]
ROWS = 8  # queries a work-item computes at once
KEY_VECTORS = 2  # 16-key vectors of a score step
PHASES = ("transpose", "exp", "pv")


def _interleave_masks() -> tuple[str, str]:
    """shuffle2 masks that interleave the low (high) halves of two 16-lane vectors; four
    rounds over 16 rows (row i with row i + 8 into rows 2i, 2i + 1) transpose them."""
    low = ", ".join(str(j) for i in range(8) for j in (i, i + 16))
    high = ", ".join(str(j) for i in range(8, 16) for j in (i, i + 16))
    return low, high


def panel_source(seq: int, depth: int, pad: int = 16, skip: frozenset[str] = frozenset()
                 ) -> str:
    """The kernel ``attention(q, k, s, v, out)`` for one head per work-item."""
    if seq % (16 * KEY_VECTORS) or depth % 16:
        raise ValueError(f"attention_panel: sequence {seq} must be a multiple of "
                         f"{16 * KEY_VECTORS} and depth {depth} of 16")
    stride, size = seq + pad, seq * depth
    low, high = _interleave_masks()
    lines = [
        "__kernel __attribute__((reqd_work_group_size(1, 1, 1)))",
        "void attention(__global const float* restrict q, __global const float* restrict k,",
        "               __global const float* restrict s, __global const float* restrict v,",
        "               __global float* restrict out)",
        "{",
        f"    __local float kt[{depth * stride}];",
        "    const int h = get_group_id(0);",
        f"    const __global float* kh = k + h * {size};",
        f"    const __global float* vh = v + h * {size};",
    ]
    add = lines.append
    if "transpose" not in skip:
        add(f"    for (int key = 0; key < {seq}; key += 16)")
        add(f"    for (int d0 = 0; d0 < {depth}; d0 += 16) {{")
        for r in range(16):
            add(f"        const float16 t0_{r} = vload16(0, kh + (key + {r}) * {depth} + d0);")
        for round_ in range(4):
            for i in range(8):
                a, b = f"t{round_}_{i}", f"t{round_}_{i + 8}"
                add(f"        const float16 t{round_ + 1}_{2 * i} = "
                    f"shuffle2({a}, {b}, (uint16)({low}));")
                add(f"        const float16 t{round_ + 1}_{2 * i + 1} = "
                    f"shuffle2({a}, {b}, (uint16)({high}));")
        for c in range(16):
            add(f"        vstore16(t4_{c}, 0, kt + (d0 + {c}) * {stride} + key);")
        add("    }")
    add("    const float scale = s[0];")
    add(f"    for (int row = 0; row < {seq}; row += {ROWS}) {{")
    add(f"    const __global float* qh = q + h * {size} + row * {depth};")
    add(f"    float st[{ROWS}][{seq}];")
    for i in range(ROWS):
        add(f"    float16 mx{i} = (float16)(-INFINITY);")
    add(f"    for (int j = 0; j < {seq}; j += {16 * KEY_VECTORS}) {{")
    for i in range(ROWS):
        for c in range(KEY_VECTORS):
            add(f"        float16 a{i}_{c} = (float16)(0.0f);")
    add(f"        for (int d = 0; d < {depth}; ++d) {{")
    for c in range(KEY_VECTORS):
        add(f"            const float16 k{c} = vload16(0, kt + d * {stride} + j + {16 * c});")
    for i in range(ROWS):
        add(f"            const float x{i} = qh[{i * depth} + d];")
        for c in range(KEY_VECTORS):
            add(f"            a{i}_{c} = x{i} * k{c} + a{i}_{c};")
    add("        }")
    for i in range(ROWS):
        for c in range(KEY_VECTORS):
            add(f"        a{i}_{c} *= scale; mx{i} = fmax(mx{i}, a{i}_{c}); "
                f"vstore16(a{i}_{c}, 0, &st[{i}][j + {16 * c}]);")
    add("    }")
    for i in range(ROWS):
        add(f"    const float8 m8_{i} = fmax(mx{i}.lo, mx{i}.hi); "
            f"const float4 m4_{i} = fmax(m8_{i}.lo, m8_{i}.hi);")
        add(f"    const float2 m2_{i} = fmax(m4_{i}.lo, m4_{i}.hi); "
            f"const float m{i} = fmax(m2_{i}.x, m2_{i}.y);")
        add(f"    float16 sum{i} = (float16)(0.0f);")
    add(f"    for (int j = 0; j < {seq}; j += 16) {{")
    for i in range(ROWS):
        x = f"vload16(0, &st[{i}][j])"
        e = x if "exp" in skip else f"exp({x} - m{i})"
        add(f"        {{ const float16 e = {e}; sum{i} += e; vstore16(e, 0, &st[{i}][j]); }}")
    add("    }")
    for i in range(ROWS):
        add(f"    const float8 s8_{i} = sum{i}.lo + sum{i}.hi; "
            f"const float4 s4_{i} = s8_{i}.lo + s8_{i}.hi;")
        add(f"    const float2 s2_{i} = s4_{i}.lo + s4_{i}.hi; "
            f"const float inv{i} = 1.0f / (s2_{i}.x + s2_{i}.y);")
    vectors = depth // 16
    for i0 in range(0, ROWS, 4):  # 4 rows x depth/16 accumulators of P V at a time
        add("    {")
        for i in range(i0, i0 + 4):
            for c in range(vectors):
                add(f"        float16 o{i}_{c} = (float16)(0.0f);")
        add(f"        for (int j = 0; j < {1 if 'pv' in skip else seq}; ++j) {{")
        for c in range(vectors):
            add(f"            const float16 v{c} = vload16({c}, vh + j * {depth});")
        for i in range(i0, i0 + 4):
            add(f"            const float p{i} = st[{i}][j];")
            for c in range(vectors):
                add(f"            o{i}_{c} = p{i} * v{c} + o{i}_{c};")
        add("        }")
        for i in range(i0, i0 + 4):
            for c in range(vectors):
                add(f"        vstore16(o{i}_{c} * inv{i}, {c}, "
                    f"out + h * {size} + (row + {i}) * {depth});")
        add("    }")
    add("    }")
    add("}")
    return "\n".join(lines) + "\n"


class Panel:
    """The panel kernel bound to device-resident copies of the pattern's arrays."""

    def __init__(self, arrays: dict[str, np.ndarray], source: str) -> None:
        import pyopencl as cl

        self.cl, self.dev = cl, cl_runtime.device()
        self.kernel = cl_runtime.build(source, "attention")
        flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
        # held here: the kernel's arguments do not keep their buffers alive
        self.buffers = [cl.Buffer(self.dev.context, flags, hostbuf=arrays[name])
                        for name in "qksv"]
        self.out = np.empty_like(arrays["q"])
        self.out_buffer = cl.Buffer(self.dev.context, cl.mem_flags.READ_WRITE,
                                    size=self.out.nbytes)
        self.kernel.set_args(*self.buffers, self.out_buffer)

    def __call__(self) -> None:
        """One run, waited for. On PoCL its workers are spread over the cores first (the row
        schedule's runner places them as it found fastest for its own kernel)."""
        placement.place("spread")
        self.cl.enqueue_nd_range_kernel(self.dev.queue, self.kernel, (self.out.shape[0],),
                                        (1,))
        self.dev.queue.finish()

    def result(self) -> np.ndarray:
        self.cl.enqueue_copy(self.dev.queue, self.out, self.out_buffer)
        return self.out


def row(shape: tuple[int, int, int], rounds: int, repeat: int, pad: int, phases: bool
        ) -> dict[str, object]:
    p = attention(*shape)
    fused = kg.fuse(*p.ops, force=True)
    run_ort, want = ort_runner(p)
    runs: dict[str, Callable[[], object]] = {}
    # the generated kernel: with its keys' dot products, reading them from its own panel, and
    # that with P V reading a row of weights E / sum(E) (before staging._normalise_after_sums)
    for name, options, normalise in (("row schedule", {"panel": False}, True),
                                     ("generated panel", {}, True),
                                     ("generated panel, weights row", {}, False)):
        staging.NORMALISE_AFTER_SUMS = normalise
        kernel = kg.fuse(*p.ops, force=True).emit("opencl", **options)
        staging.NORMALISE_AFTER_SUMS = True
        args = [p.arrays.get(x.name, kernel.constants.get(x.name)) for x in fused.inputs]
        np.testing.assert_allclose(kernel(*args), want, rtol=2e-4, atol=2e-5)
        runs[name] = runner(kernel, *args)
    panel = Panel(p.arrays, panel_source(shape[1], shape[2], pad))
    panel()
    np.testing.assert_allclose(panel.result(), want, rtol=2e-4, atol=2e-5)
    runs["panel"] = panel
    for phase in PHASES if phases else ():
        runs[f"panel without {phase}"] = Panel(
            p.arrays, panel_source(shape[1], shape[2], pad, frozenset({phase})))
    # onnxruntime apart, before and after the rounds: its spinning pool doubled the times of
    # the kernels run right after it on Intel's runtime (docs/benchmarks.md, methodology)
    ms = {name: round(float(np.median(t)), 3) for name, t in round_robin(
        runs, 3, rounds * repeat, apart={"onnxruntime": run_ort}).items()}
    out = {"pattern": p.label, "ms": ms,
           "onnxruntime / panel": round(ms["onnxruntime"] / ms["panel"], 2),
           "onnxruntime / row schedule": round(ms["onnxruntime"] / ms["row schedule"], 2),
           "row schedule / panel": round(ms["row schedule"] / ms["panel"], 2),
           "onnxruntime / generated panel": round(ms["onnxruntime"] / ms["generated panel"], 2),
           "row schedule / generated panel": round(
               ms["row schedule"] / ms["generated panel"], 2),
           "weights row / generated panel": round(
               ms["generated panel, weights row"] / ms["generated panel"], 2)}
    print(json.dumps(out), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="times --repeat runs of each")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--pad", type=int, default=16, help="floats after each panel row")
    ap.add_argument("--phases", action="store_true", help="also time each phase left out")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = [row(shape, args.rounds, args.repeat, args.pad, args.phases) for shape in SHAPES]
    if args.json:
        args.json.write_text(json.dumps({"device": cl_runtime.device().name, "pad": args.pad,
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
