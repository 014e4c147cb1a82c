"""Integer masks in vector epilogues: attention scores with BERT's padding mask,
``q kᵀ / 8 + (1 - float(mask)) * -10000`` (the mask int64, one per key), on OpenCL with the
mask read as vectors and converted (``VectorSyntax.load_convert``, the default) against the
same block with the cast lane by lane (as before: ``mock.patch`` makes the cast unvectorisable),
and onnxruntime (all graph optimisations, 2 threads) on the same ONNX nodes; then the BERT-style
encoder layer of bench/model_launches.py compiled both ways. Every variant is checked against
onnxruntime and timed round-robin in the same rounds, onnxruntime last in each (its spinning
thread pool slows whatever runs right after it); medians in ms.

    python bench/vector_casts.py [--rounds 7] [--repeat 30] [--json bench/results/vector-casts.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import ContextManager
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_launches import MODELS  # noqa: E402
from patterns import _timed as timed  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.backends.c import vectorizable  # noqa: E402
from kernelgen.backends.opencl.runtime import device  # noqa: E402
from kernelgen.measure import runner  # noqa: E402

SHAPES = ((4, 128, 64), (12, 128, 64), (8, 256, 64))  # heads, sequence, depth


def lane_by_lane() -> ContextManager[object]:
    """Casts kept lane by lane, as before ``load_convert``: ``vectorizable``'s branch for
    casts never taken."""
    return mock.patch.object(vectorizable, "Cast", type("NoCast", (), {}))


def _session(options: ort.SessionOptions | None = None) -> ort.SessionOptions:
    options = options or ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    return options


def scores(heads: int, seq: int, depth: int) -> tuple[str, dict[str, Callable[[], object]]]:
    """The masked score pattern at one shape: its label and the timed callables."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((heads, seq, depth)).astype(np.float32)
    kt = rng.standard_normal((heads, depth, seq)).astype(np.float32)
    mask = (rng.random(seq) < 0.8).astype(np.int64)
    consts = {"s": 8.0, "one": 1.0, "big": -10000.0}

    def block() -> kg.FusedOp:
        mm = kg.matmul(kg.tensor("q", q.shape), kg.tensor("kt", kt.shape))
        scaled = kg.div(mm, kg.constant("s", np.array(8.0, np.float32)))
        as_float = kg.cast(kg.tensor("mask", (seq,), "int64"), "float32")
        keep = kg.sub(kg.constant("one", np.array(1.0, np.float32)), as_float)
        penalty = kg.mul(keep, kg.constant("big", np.array(-10000.0, np.float32)))
        return kg.fuse(mm, scaled, as_float, keep, penalty, kg.add(scaled, penalty),
                       force=True)

    nodes = [helper.make_node("Constant", [], [n], value=helper.make_tensor(
        n, TensorProto.FLOAT, (), [v])) for n, v in consts.items()]
    nodes += [helper.make_node("MatMul", ["q", "kt"], ["mm"]),
              helper.make_node("Div", ["mm", "s"], ["scaled"]),
              helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
              helper.make_node("Sub", ["one", "maskf"], ["keep"]),
              helper.make_node("Mul", ["keep", "big"], ["penalty"]),
              helper.make_node("Add", ["scaled", "penalty"], ["y"])]
    graph = helper.make_graph(
        nodes, "scores",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, q.shape),
         helper.make_tensor_value_info("kt", TensorProto.FLOAT, kt.shape),
         helper.make_tensor_value_info("mask", TensorProto.INT64, mask.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(), _session(),
                                   providers=["CPUExecutionProvider"])
    feeds = {"q": q, "kt": kt, "mask": mask}
    want = session.run(None, feeds)[0]
    runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, feeds)}
    for name, switch in (("vectors", nullcontext()), ("lane by lane", lane_by_lane())):
        with switch:
            kernel = block().emit_kernel("opencl", tuning="none")
        assert ("convert_float" in kernel.source) == (name == "vectors"), name
        np.testing.assert_allclose(kernel(q, kt, mask), want, rtol=1e-4, atol=1e-2)
        runs[name] = runner(kernel, q, kt, mask)
    return f"masked scores {heads}x{seq}x{seq}x{depth}", runs


def bert_inputs() -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
    """The encoder layer of bench/model_launches.py, its input shapes and seeded inputs (the
    last 17 positions padding)."""
    make, shapes = MODELS["bert_layer"]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(shapes["x"]).astype(np.float32),
             "mask": np.ones(shapes["mask"], np.int64)}
    feeds["mask"][:, -17:] = 0
    return make(), shapes, feeds


def bert_layer() -> tuple[str, dict[str, Callable[[], object]]]:
    """The encoder layer, compiled both ways (DNNFusion's plan), and onnxruntime."""
    proto, shapes, feeds = bert_inputs()
    session = ort.InferenceSession(proto.SerializeToString(), _session(),
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)[0]
    runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, feeds)}
    for name, switch in (("vectors", nullcontext()), ("lane by lane", lane_by_lane())):
        with switch:
            model = kg.compile_model(proto, backend="opencl", fusion="dnnfusion",
                                     input_shapes=shapes)
        np.testing.assert_allclose(model.run(None, feeds)[0], want, rtol=1e-3, atol=1e-3)
        runs[name] = (lambda m=model: m.run(None, feeds))
    return "BERT-style encoder layer (hidden 256, 4 heads, sequence 128)", runs


def measure(label: str, runs: dict[str, Callable[[], object]], rounds: int, repeat: int
            ) -> dict[str, object]:
    medians: dict[str, list[float]] = {name: [] for name in runs}
    ours = [name for name in runs if name != "onnxruntime"]
    for r in range(rounds):
        # kernelgen's two variants in alternating order, then onnxruntime, whose spinning
        # thread pool would slow whatever ran right after it
        order = (ours if r % 2 else ours[::-1]) + ["onnxruntime"]
        time.sleep(0.05)
        for name in order:
            medians[name].append(statistics.median(timed(runs[name], repeat)))
    row = {"case": label, **{f"{n}_ms": round(statistics.median(v), 4)
                             for n, v in medians.items()}}
    row["lane_by_lane_over_vectors"] = round(row["lane by lane_ms"] / row["vectors_ms"], 2)
    row["vs_ort"] = round(row["onnxruntime_ms"] / row["vectors_ms"], 2)
    print(f"{label}: vectors {row['vectors_ms']} ms, lane by lane {row['lane by lane_ms']} ms "
          f"({row['lane_by_lane_over_vectors']}x), onnxruntime {row['onnxruntime_ms']} ms "
          f"(x{row['vs_ort']})", flush=True)
    return row


Cases = list[tuple[str, dict[str, Callable[[], object]]]]
Measure = Callable[[str, dict[str, Callable[[], object]], int, int], dict[str, object]]


def case_main(doc: str, cases: Callable[[], Cases], measure: Measure) -> int:
    """A script of labelled cases timed by ``measure``: ``--rounds``, ``--repeat``, ``--json``
    (the rows, the machine and the OpenCL device)."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = [measure(label, runs, args.rounds, args.repeat) for label, runs in cases()]
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                         "device": device().name, "rows": rows},
                                        indent=1) + "\n")
    return 0


def main() -> int:
    return case_main(__doc__, lambda: [scores(*shape) for shape in SHAPES] + [bert_layer()],
                     measure)


if __name__ == "__main__":
    raise SystemExit(main())
