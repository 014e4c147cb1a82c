"""Two OpenCL paths for a CPU that write explicit vectors where PoCL's own lanes (one output a
work-item) gather and scatter: the 'columns' schedule for outputs that each reduce on their
own (LRN's window over channels, a reduction over channels) against the 'item' schedule they
ran before, and interleaved stores for rows that interleave copies of their inputs' rows
(Winograd's output transform, nearest upsampling + concat, depth-to-space) against the
unroll before them. Each pair is compiled from the same block in one process (the new path
switched off by ``mock.patch``), checked against onnxruntime, and timed round-robin, with
onnxruntime (all graph optimisations, 2 threads) just before and after the rounds
(``measure.round_robin``'s ``apart``); medians in ms. The shapes
are Inception v1's (LRN, its Winograd convs), SqueezeNet's and those of bench/patterns.py.

    python bench/explicit_vectors.py [--repeat 60] [--json bench/results/explicit-vectors.json]
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ContextManager
from unittest import mock

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kernelgen as kg
from kernelgen.backends.opencl import interleaved, schedule
from kernelgen.measure import round_robin, runner
from kernelgen.ops.reduce import reduce_op

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling import write_rows  # noqa: E402

ORT = "onnxruntime"


@dataclass
class Row:
    """A block as kernelgen operators and as ONNX nodes (weights as initializers), its inputs,
    the emit options, and the switch that turns the new path off."""

    label: str
    ops: list[kg.Op]
    nodes: list
    inputs: dict[str, np.ndarray]
    weights: dict[str, np.ndarray]
    before: Callable[[], ContextManager[object]]
    options: dict[str, object]


def item_only() -> ContextManager[object]:
    """No 'columns' plan: such kernels run 'item', as before it."""
    return mock.patch.object(schedule, "opencl_columns", lambda loop, caps: None)


def unrolled_only() -> ContextManager[object]:
    """No interleaved stores: such kernels run ``unroll``'s plan, as before them."""
    return mock.patch.object(interleaved, "plan", lambda loop, caps: None)


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def lrn(c: int, hw: int) -> Row:
    rng = np.random.default_rng(c)
    x = kg.tensor("x", (1, c, hw, hw))
    node = helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-4, beta=0.75, bias=1.0)
    return Row(f"LRN 5 over {c}x{hw}x{hw}", [kg.lrn(x, 5, alpha=1e-4, beta=0.75)], [node],
               {"x": _rand(rng, 1, c, hw, hw)}, {}, item_only, {})


def channel_mean(c: int, hw: int) -> Row:
    rng = np.random.default_rng(c + 1)
    x = kg.tensor("x", (1, c, hw, hw))
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1)
    return Row(f"ReduceMean over the {c} channels of {hw}x{hw}",
               [reduce_op("ReduceMean", x, [1])], [node], {"x": _rand(rng, 1, c, hw, hw)}, {},
               item_only, {})


def winograd(c: int, m: int, hw: int) -> Row:
    rng = np.random.default_rng(m)
    w = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = _rand(rng, m)
    conv = kg.conv(kg.tensor("x", (1, c, hw, hw)), kg.constant("w", w), kg.constant("b", b),
                   pads=[1] * 4)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    return Row(f"Winograd F(2x2) conv + ReLU {c}->{m} @{hw}", [conv, kg.relu(conv)], nodes,
               {"x": _rand(rng, 1, c, hw, hw)}, {"w": w, "b": b}, unrolled_only,
               {"algorithm": "winograd"})


def resize_concat(c: int, hw: int) -> Row:
    rng = np.random.default_rng(c + hw)
    x, skip = kg.tensor("x", (1, c, hw, hw)), kg.tensor("skip", (1, c, 2 * hw, 2 * hw))
    up = kg.resize(x, scales=[1.0, 1.0, 2.0, 2.0], mode="nearest")
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Concat", ["up", "skip"], ["y"], axis=1)]
    return Row(f"concat(resize(x, 2), skip) {c}x{hw}x{hw}", [up, kg.concat([up, skip], axis=1)],
               nodes, {"x": _rand(rng, 1, c, hw, hw), "skip": _rand(rng, 1, c, 2 * hw, 2 * hw)},
               {"scales": np.array([1.0, 1.0, 2.0, 2.0], np.float32)}, unrolled_only, {})


def depth_to_space(c: int, hw: int, block: int) -> Row:
    rng = np.random.default_rng(c * block)
    x = kg.tensor("x", (1, c, hw, hw))
    d = kg.depth_to_space(x, block)
    nodes = [helper.make_node("DepthToSpace", ["x"], ["d"], blocksize=block, mode="DCR"),
             helper.make_node("Relu", ["d"], ["y"])]
    return Row(f"relu(depth_to_space) {c}x{hw}x{hw}, block {block}", [d, kg.relu(d)], nodes,
               {"x": _rand(rng, 1, c, hw, hw)}, {}, unrolled_only, {})


ROWS = (lambda: lrn(64, 55), lambda: lrn(192, 55), lambda: lrn(96, 27),
        lambda: channel_mean(256, 56), lambda: channel_mean(21, 97),
        lambda: winograd(64, 192, 55), lambda: winograd(128, 128, 27),
        lambda: winograd(48, 192, 13), lambda: winograd(512, 512, 7),
        lambda: resize_concat(128, 28), lambda: resize_concat(256, 14),
        lambda: resize_concat(64, 56), lambda: depth_to_space(256, 28, 2),
        lambda: depth_to_space(1024, 14, 2), lambda: depth_to_space(324, 21, 3))


def _session(r: Row) -> Callable[[], list[np.ndarray]]:
    import onnxruntime as ort

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
              for n, a in r.inputs.items()]
    graph = helper.make_graph(r.nodes, "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(a, n)
                                           for n, a in r.weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return lambda: session.run(None, r.inputs)


def measure(r: Row, repeat: int) -> dict[str, object]:
    fused = kg.fuse(*r.ops)
    now = fused.emit("opencl", tuning="none", **r.options)
    with r.before():
        before = fused.emit("opencl", tuning="none", **r.options)
    ort_call = _session(r)
    want = ort_call()[0]
    args = [r.inputs[name] for name in r.inputs]
    for program in (now, before):
        np.testing.assert_allclose(program(*args), want, rtol=1e-3, atol=1e-3)
    times = {name: float(np.median(t)) for name, t in round_robin(
        {"now": runner(now, *args), "before": runner(before, *args)}, 3, repeat,
        apart={ORT: ort_call}).items()}
    kernels = getattr(now, "kernels", [now])
    return {"block": r.label, "now_ms": times["now"], "before_ms": times["before"],
            "onnxruntime_ms": times[ORT], "gain": times["before"] / times["now"],
            "now_vs_ort": times[ORT] / times["now"],
            "now_form": "+".join(k.metadata["schedule"] + (
                "+interleaved" if k.metadata.get("interleaved_stores") else "")
                for k in kernels)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    print(f"{'block':46s} {'ORT':>7s} {'now':>7s} {'before':>7s} {'gain':>6s} {'vs ORT':>7s}")
    for build in ROWS:
        r = measure(build(), args.repeat)
        rows.append(r)
        print(f"{r['block']:46s} {r['onnxruntime_ms']:7.3f} {r['now_ms']:7.3f} "
              f"{r['before_ms']:7.3f} {r['gain']:5.2f}x {r['now_vs_ort']:6.2f}x  "
              f"{r['now_form']}", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
