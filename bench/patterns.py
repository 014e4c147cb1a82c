"""Patterns every exported model contains, fused by kernelgen on OpenCL, against onnxruntime (all
graph optimisations, 2 threads) and against a copy kernel moving the same bytes, in one run
(kernelgen and the copy round-robin, onnxruntime just before and after them, each side run
untimed for ``measure.SETTLE_S`` before it is timed after the other): fused
transposes (2-D, NCHW->NHWC), ShuffleNet's channel shuffle, attention with the Transpose of K
fused, a masked softmax, residual adds, squeeze-and-excitation scaling, a GELU FFN layer,
depth-to-space, U-Net's resize + concat and MobileNetV2's strided depthwise convs, each at
three shapes from real models (BERT, ResNet, ShuffleNetV2, MobileNetV2/V3, super-resolution,
U-Net). Both sides get the same inputs, and kernelgen's output is checked against
onnxruntime's before timing.

    python bench/patterns.py [--rounds 5] [--repeat 30] [--only transpose,attention]
                             [--backend opencl|neon] [--json bench/results/patterns.json]

Per round: onnxruntime's median over ours (above 1: kernelgen faster), and the copy kernel's
time over ours, scaled by bytes (the fraction of the copy bandwidth the pattern reaches: each
input read once, the output written once). The table gives the medians over rounds, and the
arithmetic rate counted on the loop IR (the measure for the contractions). With ``--backend
neon`` (NEON C; through SIMDe on x86, a quarter of AVX-512's width, so onnxruntime is no target
there) also the fraction of the FMA peak (``bench/peak_fma_neon.c``, measured first) and of the
roofline.
"""
from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

import kernelgen as kg
from kernelgen.compile import copy_kernel
from kernelgen.measure import round_robin, runner

from conv import two_thread_session  # bench/, on the path of every script importing this


@dataclass
class Pattern:
    """One pattern at one shape: ONNX nodes (inputs named as the arrays), the same computation
    as kernelgen operators, and the arrays."""

    family: str
    label: str
    nodes: list
    ops: list[kg.Op]
    arrays: dict[str, np.ndarray]
    output: str


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def transpose_add_relu(rows: int, cols: int) -> Pattern:
    """relu(transpose(x) + b): a Linear layer's weight read transposed, with its bias."""
    rng = np.random.default_rng(0)
    x, b = kg.tensor("x", (rows, cols)), kg.tensor("b", (rows,))
    t = kg.transpose(x, (1, 0))
    a = kg.add(t, b)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Add", ["t", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return Pattern("transpose", f"relu(transpose(x) + b), {rows}x{cols}", nodes,
                   [t, a, kg.relu(a)], {"x": _rand(rng, rows, cols), "b": _rand(rng, rows)}, "y")


def nchw_to_nhwc(n: int, c: int, hw: int) -> Pattern:
    """NCHW -> NHWC with a ReLU: a layout change at a model's edge."""
    rng = np.random.default_rng(1)
    x = kg.tensor("x", (n, c, hw, hw))
    t = kg.transpose(x, (0, 2, 3, 1))
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Relu", ["t"], ["y"])]
    return Pattern("nchw-to-nhwc", f"relu(NCHW->NHWC), {n}x{c}x{hw}x{hw}", nodes,
                   [t, kg.relu(t)], {"x": _rand(rng, n, c, hw, hw)}, "y")


def channel_shuffle(c: int, hw: int, groups: int = 2) -> Pattern:
    """ShuffleNetV2's channel shuffle: reshape, transpose, reshape."""
    rng = np.random.default_rng(2)
    x = kg.tensor("x", (1, c, hw, hw))
    r1 = kg.reshape(x, (1, groups, c // groups, hw, hw))
    t = kg.transpose(r1, (0, 2, 1, 3, 4))
    r2 = kg.reshape(t, (1, c, hw, hw))
    shapes = {"s1": np.array([1, groups, c // groups, hw, hw]), "s2": np.array([1, c, hw, hw])}
    nodes = [helper.make_node("Constant", [], [k], value=helper.make_tensor(
                 k, TensorProto.INT64, v.shape, v)) for k, v in shapes.items()]
    nodes += [helper.make_node("Reshape", ["x", "s1"], ["r1"]),
              helper.make_node("Transpose", ["r1"], ["t"], perm=[0, 2, 1, 3, 4]),
              helper.make_node("Reshape", ["t", "s2"], ["y"])]
    return Pattern("channel-shuffle", f"channel shuffle, {c}x{hw}x{hw}, {groups} groups", nodes,
                   [r1, t, r2], {"x": _rand(rng, 1, c, hw, hw)}, "y")


def attention(heads: int, seq: int, depth: int) -> Pattern:
    """softmax(Q transpose(K) * s) V with K as the projections give it: (heads, seq, depth)."""
    rng = np.random.default_rng(3)
    q, k, v = (kg.tensor(n, (heads, seq, depth)) for n in "qkv")
    s = kg.tensor("s", (1,))
    kt = kg.transpose(k, (0, 2, 1))
    scores = kg.matmul(q, kt)
    scaled = kg.mul(scores, s)
    p = kg.softmax(scaled, 2)
    o = kg.matmul(p, v)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["sc"]),
             helper.make_node("Mul", ["sc", "s"], ["m"]),
             helper.make_node("Softmax", ["m"], ["p"], axis=2),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    arrays = {n: _rand(rng, heads, seq, depth) for n in "qkv"}
    arrays["s"] = np.array([depth ** -0.5], np.float32)
    return Pattern("attention", f"attention, {heads} heads x {seq} x {depth}, K transposed",
                   nodes, [kt, scores, scaled, p, o], arrays, "y")


def masked_softmax(rows: int, cols: int) -> Pattern:
    """softmax(x * s + mask) over rows: attention scores with a padding mask."""
    rng = np.random.default_rng(4)
    x, s, mask = kg.tensor("x", (rows, cols)), kg.tensor("s", (1,)), kg.tensor("mask", (cols,))
    m = kg.mul(x, s)
    a = kg.add(m, mask)
    nodes = [helper.make_node("Mul", ["x", "s"], ["m"]),
             helper.make_node("Add", ["m", "mask"], ["a"]),
             helper.make_node("Softmax", ["a"], ["y"], axis=1)]
    arrays = {"x": _rand(rng, rows, cols), "s": np.array([0.125], np.float32),
              "mask": np.where(np.arange(cols) < cols - 7, 0.0, -1e4).astype(np.float32)}
    return Pattern("softmax", f"softmax(x * s + mask), {rows}x{cols}", nodes,
                   [m, a, kg.softmax(a, 1)], arrays, "y")


def residual(c: int, hw: int) -> Pattern:
    """relu(x + y): a ResNet block's residual add."""
    rng = np.random.default_rng(5)
    x, y = kg.tensor("x", (1, c, hw, hw)), kg.tensor("y", (1, c, hw, hw))
    a = kg.add(x, y)
    nodes = [helper.make_node("Add", ["x", "y"], ["a"]), helper.make_node("Relu", ["a"], ["z"])]
    return Pattern("residual", f"relu(x + y), {c}x{hw}x{hw}", nodes, [a, kg.relu(a)],
                   {"x": _rand(rng, 1, c, hw, hw), "y": _rand(rng, 1, c, hw, hw)}, "z")


def se_scale(c: int, hw: int) -> Pattern:
    """x * sigmoid(s): a squeeze-and-excitation block's channel scaling (MobileNetV3)."""
    rng = np.random.default_rng(6)
    x, g = kg.tensor("x", (1, c, hw, hw)), kg.tensor("g", (1, c, 1, 1))
    sg = kg.sigmoid(g)
    nodes = [helper.make_node("Sigmoid", ["g"], ["sg"]),
             helper.make_node("Mul", ["x", "sg"], ["y"])]
    return Pattern("se-scale", f"x * sigmoid(s), {c}x{hw}x{hw}", nodes, [sg, kg.mul(x, sg)],
                   {"x": _rand(rng, 1, c, hw, hw), "g": _rand(rng, 1, c, 1, 1)}, "y")


def ffn_gelu(m: int, k: int, n: int) -> Pattern:
    """gelu(x W + b), erf form: a transformer FFN's first layer (onnxruntime fuses the ONNX
    expansion into its Gelu)."""
    rng = np.random.default_rng(7)
    x, w, b = kg.tensor("x", (m, k)), kg.tensor("w", (k, n)), kg.tensor("b", (n,))
    mm = kg.matmul(x, w)
    a = kg.add(mm, b)
    consts = {"sqrt2": np.array(2 ** 0.5, np.float32), "one": np.array(1.0, np.float32),
              "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Constant", [], [n_], value=helper.make_tensor(
                 n_, TensorProto.FLOAT, (), [float(v)])) for n_, v in consts.items()]
    nodes += [helper.make_node("MatMul", ["x", "w"], ["mm"]),
              helper.make_node("Add", ["mm", "b"], ["a"]),
              helper.make_node("Div", ["a", "sqrt2"], ["d"]),
              helper.make_node("Erf", ["d"], ["e"]),
              helper.make_node("Add", ["e", "one"], ["e1"]),
              helper.make_node("Mul", ["a", "e1"], ["p"]),
              helper.make_node("Mul", ["p", "half"], ["y"])]
    arrays = {"x": _rand(rng, m, k), "w": _rand(rng, k, n) / np.float32(k ** 0.5),
              "b": _rand(rng, n)}
    return Pattern("ffn-gelu", f"gelu(x W + b), {m}x{k}x{n}", nodes, [mm, a, kg.gelu(a)],
                   arrays, "y")


def depth_to_space(c: int, hw: int, block: int) -> Pattern:
    """DepthToSpace (DCR) with a ReLU: a super-resolution network's upsampling."""
    rng = np.random.default_rng(8)
    x = kg.tensor("x", (1, c, hw, hw))
    d = kg.depth_to_space(x, block)
    nodes = [helper.make_node("DepthToSpace", ["x"], ["d"], blocksize=block, mode="DCR"),
             helper.make_node("Relu", ["d"], ["y"])]
    return Pattern("depth-to-space", f"relu(depth_to_space), {c}x{hw}x{hw}, block {block}",
                   nodes, [d, kg.relu(d)], {"x": _rand(rng, 1, c, hw, hw)}, "y")


def resize_concat(c: int, hw: int) -> Pattern:
    """concat(resize_nearest(x, 2), skip): a U-Net decoder's upsampling and skip connection."""
    rng = np.random.default_rng(9)
    x, skip = kg.tensor("x", (1, c, hw, hw)), kg.tensor("skip", (1, c, 2 * hw, 2 * hw))
    up = kg.resize(x, scales=[1.0, 1.0, 2.0, 2.0], mode="nearest")
    scales = np.array([1.0, 1.0, 2.0, 2.0], np.float32)
    nodes = [helper.make_node("Constant", [], ["scales"], value=helper.make_tensor(
                 "scales", TensorProto.FLOAT, (4,), scales)),
             helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Concat", ["up", "skip"], ["y"], axis=1)]
    return Pattern("resize-concat", f"concat(resize(x, 2), skip), {c}x{hw}x{hw}", nodes,
                   [up, kg.concat([up, skip], axis=1)],
                   {"x": _rand(rng, 1, c, hw, hw), "skip": _rand(rng, 1, c, 2 * hw, 2 * hw)},
                   "y")


def depthwise(c: int, hw: int, stride: int) -> Pattern:
    """clip(x, 0, 6) -> depthwise 3x3 conv with bias: a MobileNetV2 block's ReLU6 and its
    depthwise conv (stride 2 where the block downsamples); the weights are constants."""
    rng = np.random.default_rng(10 + stride)
    w, b = (_rand(rng, c, 1, 3, 3) / 3).astype(np.float32), _rand(rng, c)
    x = kg.tensor("x", (1, c, hw, hw))
    six = kg.clip(x, 0.0, 6.0)
    conv = kg.conv(six, kg.constant("w", w), kg.constant("b", b), pads=[1, 1, 1, 1],
                   strides=[stride, stride], group=c)
    consts = {"w": w, "b": b, "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    nodes = [helper.make_node("Constant", [], [k], value=helper.make_tensor(
                 k, TensorProto.FLOAT, v.shape, v.ravel())) for k, v in consts.items()]
    nodes += [helper.make_node("Clip", ["x", "lo", "hi"], ["six"]),
              helper.make_node("Conv", ["six", "w", "b"], ["y"], pads=[1, 1, 1, 1],
                               strides=[stride, stride], group=c)]
    return Pattern("depthwise", f"depthwise 3x3 of relu6, {c}x{hw}x{hw}, stride {stride}",
                   nodes, [six, conv], {"x": 4 * _rand(rng, 1, c, hw, hw)}, "y")


PATTERNS: dict[str, list[Callable[[], Pattern]]] = {
    "transpose": [lambda: transpose_add_relu(2048, 2048), lambda: transpose_add_relu(768, 3072),
                  lambda: transpose_add_relu(3072, 768)],
    "nchw-to-nhwc": [lambda: nchw_to_nhwc(1, 64, 56), lambda: nchw_to_nhwc(1, 256, 28),
                     lambda: nchw_to_nhwc(8, 32, 28)],
    "channel-shuffle": [lambda: channel_shuffle(116, 28), lambda: channel_shuffle(232, 14),
                        lambda: channel_shuffle(464, 7)],
    "attention": [lambda: attention(8, 256, 64), lambda: attention(12, 128, 64),
                  lambda: attention(4, 512, 64)],
    "softmax": [lambda: masked_softmax(4096, 1024), lambda: masked_softmax(12 * 128, 128),
                lambda: masked_softmax(1024, 4096)],
    "residual": [lambda: residual(256, 56), lambda: residual(512, 28),
                 lambda: residual(2048, 7)],
    "se-scale": [lambda: se_scale(144, 56), lambda: se_scale(240, 28),
                 lambda: se_scale(672, 14)],
    "ffn-gelu": [lambda: ffn_gelu(128, 768, 3072), lambda: ffn_gelu(512, 1024, 1024),
                 lambda: ffn_gelu(64, 1024, 4096)],
    "depth-to-space": [lambda: depth_to_space(64, 56, 2), lambda: depth_to_space(256, 28, 2),
                       lambda: depth_to_space(36, 64, 3)],
    "resize-concat": [lambda: resize_concat(128, 28), lambda: resize_concat(256, 14),
                      lambda: resize_concat(64, 56)],
    # MobileNetV2 at 224x224: its three downsampling depthwise convs
    "depthwise": [lambda: depthwise(96, 112, 2), lambda: depthwise(144, 56, 2),
                  lambda: depthwise(576, 14, 2)],
}


def ort_runner(p: Pattern) -> tuple[Callable[[], None], np.ndarray]:
    """onnxruntime on ``p`` (all graph optimisations, 2 threads): a timed callable and its
    output."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
              for n, a in p.arrays.items()]
    graph = helper.make_graph(p.nodes, p.family, inputs,
                              [helper.make_tensor_value_info(p.output, TensorProto.FLOAT, None)])
    session = two_thread_session(graph)
    feeds = dict(p.arrays)
    return (lambda: session.run(None, feeds)), session.run(None, feeds)[0]


def _timed(f: Callable[[], object], repeat: int) -> list[float]:
    """``repeat`` back-to-back runs of ``f`` after untimed ones for ``measure.SETTLE_S`` (the
    other runtime's spinning threads idle by then), in milliseconds."""
    return round_robin({"f": f}, 1, repeat)["f"]


def measure(p: Pattern, rounds: int, repeat: int, backend: str = "opencl",
            peak_gflops: float | None = None) -> dict[str, object]:
    """One pattern's row. With ``peak_gflops`` (NEON C: the FMA microkernel's, measured in the
    same run) also the fraction of the peak and of the roofline: the time the pattern's bytes
    take at the copy kernel's bandwidth or its FLOPs at the peak, whichever is longer, over
    the kernel's time (NEON's target, issue 20: 0.7 at least)."""
    fused = kg.fuse(*p.ops, force=True)
    kernel = fused.emit(backend)
    arrays = [p.arrays.get(v.name, kernel.constants.get(v.name)) for v in fused.inputs]
    run_ort, want = ort_runner(p)
    np.testing.assert_allclose(kernel(*arrays), want, rtol=2e-4, atol=2e-5)
    moved = kernel.loop.bytes_moved()
    biggest = max((a.shape for a in p.arrays.values()), key=lambda s: int(np.prod(s)))
    copy = copy_kernel(biggest, backend=backend)
    copy_bytes = 2 * 4 * int(np.prod(biggest))
    ours = runner(kernel, *arrays)
    # the copy under the pattern's placement of PoCL's workers, so that the two runs of a
    # round do not move the workers back and forth (kernelgen/measure.py, runner)
    runs = {"kernelgen": ours,
            "copy": runner(copy, p.arrays[next(n for n, a in p.arrays.items()
                                               if a.shape == biggest)],
                           placement=getattr(ours, "placement", None))}
    per_round: dict[str, list[float]] = {"vs_ort": [], "of_copy": []}
    if peak_gflops:
        per_round.update(of_peak=[], of_roofline=[])
    medians: dict[str, list[float]] = {name: [] for name in (*runs, "onnxruntime")}
    for _ in range(rounds):
        # onnxruntime just before and just after ours (docs/benchmarks.md, methodology: its
        # spinning thread pool inflated both sides' times when interleaved)
        times: dict[str, list[float]] = {"onnxruntime": _timed(run_ort, repeat)}
        times.update(round_robin(runs, 1, repeat))
        times["onnxruntime"] += _timed(run_ort, repeat)
        ms = {name: float(np.median(t)) for name, t in times.items()}
        for name in medians:
            medians[name].append(ms[name])
        per_round["vs_ort"].append(ms["onnxruntime"] / ms["kernelgen"])
        per_round["of_copy"].append((moved / ms["kernelgen"]) / (copy_bytes / ms["copy"]))
        if peak_gflops:
            at_peak = kernel.loop.flops() / peak_gflops / 1e6  # ms
            per_round["of_peak"].append(at_peak / ms["kernelgen"])
            per_round["of_roofline"].append(
                max(moved * ms["copy"] / copy_bytes, at_peak) / ms["kernelgen"])
    row = {"family": p.family, "pattern": p.label,
           "schedule": kernel.metadata["schedule"], "tunables": kernel.metadata["tunables"],
           **{f"{n}_ms": round(float(np.median(v)), 3) for n, v in medians.items()},
           "gflops": round(kernel.loop.flops() / float(np.median(medians["kernelgen"])) / 1e6, 1),
           **{k: round(float(np.median(v)), 2) for k, v in per_round.items()},
           "rounds": {k: [round(x, 2) for x in v] for k, v in per_round.items()}}
    print(f"{p.label}: kernelgen {row['kernelgen_ms']} ms, onnxruntime "
          f"{row['onnxruntime_ms']} ms (x{row['vs_ort']}), {row['of_copy']} of copy "
          f"bandwidth, {row['gflops']} GFLOP/s"
          + (f" ({row['of_peak']} of peak), {row['of_roofline']} of the roofline"
             if peak_gflops else ""), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--only", default=",".join(PATTERNS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--backend", choices=("opencl", "neon"), default="opencl")
    args = parser.parse_args()
    peak = None
    if args.backend == "neon":
        from gemm import neon_peak_gflops
        peak = neon_peak_gflops()
        print(f"NEON C FMA peak (bench/peak_fma_neon.c): {peak:.1f} GFLOP/s", flush=True)
    rows = [measure(build(), args.rounds, args.repeat, args.backend, peak)
            for family in args.only.split(",") for build in PATTERNS[family]]
    ratios = [r["vs_ort"] for r in rows]
    summary = {"machine": platform.processor() or platform.machine(), "backend": args.backend,
               "geomean_vs_ort": round(float(np.exp(np.mean(np.log(ratios)))), 2),
               **({"peak_gflops": round(peak, 1), "below_0.7_of_roofline": sum(
                   r["of_roofline"] < 0.7 for r in rows)} if peak else {}),
               "rows": rows}
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
