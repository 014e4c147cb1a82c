"""Attention's head splits fused into its contractions, on OpenCL (``run_rule``).

- The Q projection with its split, ``transpose(reshape(x @ w + b, (1, s, h, d)), (0, 2, 1,
  3))``, whose remap keeps the innermost runs of d (``keeps_runs``): one kernel storing
  vectors at each head's place (``flatten_offset_aligned``, the default), the same kernel
  storing lane by lane (as before: ``mock.patch`` drops the aligned form), and the block split
  into the projection and a transpose kernel (what the DNNFusion planner ran before).
- The scores ``transpose(q) · transpose(k) / 8``, which reduce both remapped operands along
  their stride-1 axis (``reads_runs_along_reduction``): one kernel against the two
  transposes and the product.
- The BERT-style encoder layer of bench/model_launches.py planned and compiled with both
  rules, with the epilogue rule only, and as before.

Each beside onnxruntime (all graph optimisations, 2 threads) on the same ONNX nodes. Every
variant is checked against onnxruntime and timed round-robin in the same rounds, onnxruntime
last in each (its spinning thread pool slows whatever runs right after it); medians in ms,
and each variant's time over the default's as the median of the rounds' ratios.

    python bench/kept_runs.py [--rounds 7] [--repeat 30] [--json bench/results/kept-runs.json]
"""
from __future__ import annotations

import importlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from patterns import _timed as timed  # noqa: E402
from vector_casts import bert_inputs, case_main  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.backends.opencl import columns, tile_stores  # noqa: E402
from kernelgen.compile import compile_split  # noqa: E402
from kernelgen.compile.tuning import NO_TUNING  # noqa: E402
from kernelgen.measure import runner  # noqa: E402

# (sequence, hidden, heads): this repo's BERT-style layer, BERT-base, ViT-S/16 (197 tokens)
SHAPES = ((128, 256, 4), (128, 768, 12), (197, 384, 6))
SCORES = ((128, 4), (128, 12), (256, 8))  # (sequence, heads), head dimension 64
fuse_module = importlib.import_module("kernelgen.fusion.fuse")


@contextmanager
def lanes_only() -> Iterator[None]:
    """Epilogues whose run is contiguous only a vector at a time stored lane by lane, as
    before ``flatten_offset_aligned``."""
    plain = columns.vector_epilogue
    with mock.patch.object(tile_stores, "vector_epilogue",
                           lambda k, c, plan, masks=False, aligned=False: plain(k, c, plan,
                                                                                masks)):
        yield


@contextmanager
def no_prologue_rule() -> Iterator[None]:
    """Remaps a contraction reduces along (``transpose(k)`` in the scores) left yellow."""
    with mock.patch.object(fuse_module, "_reads_runs", lambda *a: False):
        yield


@contextmanager
def before() -> Iterator[None]:
    """The code before these changes: no ``run_rule`` (the head splits' cells yellow, so left
    unfused without a measurement) and lane-by-lane stores."""
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(fuse_module, "run_rule", lambda *a, **k: None))
        stack.enter_context(lanes_only())
        yield


def _session(model: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def projection(seq: int, hidden: int, heads: int
               ) -> tuple[str, dict[str, Callable[[], object]]]:
    """The Q projection with its head split at one shape: its label and the timed callables."""
    rng = np.random.default_rng(0)
    depth = hidden // heads
    x = rng.standard_normal((1, seq, hidden)).astype(np.float32)
    w = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    b = rng.standard_normal(hidden).astype(np.float32)

    def ops() -> list[kg.Op]:
        mm = kg.matmul(kg.tensor("x", x.shape), kg.constant("w", w))
        biased = kg.add(mm, kg.tensor("b", b.shape))
        split = kg.reshape(biased, (1, seq, heads, depth))
        return [mm, biased, split, kg.transpose(split, [0, 2, 1, 3])]

    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["biased"]),
             helper.make_node("Reshape", ["biased", "shape"], ["split"]),
             helper.make_node("Transpose", ["split"], ["y"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(
        nodes, "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array([1, seq, heads, depth], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session = _session(model.SerializeToString())
    feeds = {"x": x, "b": b}
    want = session.run(None, feeds)[0]
    runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, feeds)}
    with before():  # the head split's edge yellow: the split cuts there
        old = kg.fuse(*ops())
        lanes = old.emit_kernel("opencl", tuning="none")
        split = compile_split(old, kg.backends.get("opencl"), tuning=NO_TUNING)
    assert split is not None and len(split.kernels) == 2
    variants = {"default": kg.fuse(*ops()).emit_kernel("opencl", tuning="none"),
                "lane by lane": lanes, "split": split}
    assert "kg_sums" not in variants["default"].source and "kg_sums" in lanes.source
    for name, kernel in variants.items():
        np.testing.assert_allclose(kernel(x, b), want, rtol=1e-4, atol=1e-4, err_msg=name)
        runs[name] = runner(kernel, x, b)
    return f"Q projection {seq}x{hidden}, {heads} heads of {depth}", runs


def scores(seq: int, heads: int, depth: int = 64) -> tuple[str, dict[str, Callable[[], object]]]:
    """Attention's scores from the projections' outputs, ``transpose(q) · transpose(k) / 8``
    with ``q, k: (1, seq, heads, depth)``: one kernel reading both through their remaps
    (the prologue rule's block) against the two transposes and the product split."""
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((1, seq, heads, depth)).astype(np.float32) for _ in range(2))

    def ops() -> list[kg.Op]:
        qh = kg.transpose(kg.tensor("q", q.shape), [0, 2, 1, 3])
        kt = kg.transpose(kg.tensor("k", k.shape), [0, 2, 3, 1])
        mm = kg.matmul(qh, kt)
        return [qh, kt, mm, kg.div(mm, kg.constant("s", np.array(8.0, np.float32)))]

    nodes = [helper.make_node("Transpose", ["q"], ["qh"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["qh", "kt"], ["mm"]),
             helper.make_node("Div", ["mm", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "scores",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, q.shape) for n in ("q", "k")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(8.0, np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session = _session(model.SerializeToString())
    feeds = {"q": q, "k": k}
    want = session.run(None, feeds)[0]
    runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, feeds)}
    with no_prologue_rule():
        split = compile_split(kg.fuse(*ops()), kg.backends.get("opencl"), tuning=NO_TUNING)
    assert split is not None and len(split.kernels) == 3
    variants = {"default": kg.fuse(*ops()).emit_kernel("opencl", tuning="none"),
                "split": split}
    for name, kernel in variants.items():
        np.testing.assert_allclose(kernel(q, k), want, rtol=1e-4, atol=1e-4, err_msg=name)
        runs[name] = runner(kernel, q, k)
    return f"scores transpose(q) transpose(k) / 8, {heads} heads x {seq} x {depth}", runs


def bert_layer() -> tuple[str, dict[str, Callable[[], object]]]:
    """The encoder layer, planned and compiled both ways (DNNFusion's plan), and
    onnxruntime."""
    proto, shapes, feeds = bert_inputs()
    session = _session(proto.SerializeToString())
    want = session.run(None, feeds)[0]
    runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, feeds)}
    launches = {}
    for name, switch in (("default", ExitStack()), ("epilogues only", no_prologue_rule()),
                         ("before", before())):
        with switch:
            model = kg.compile_model(proto, backend="opencl", fusion="dnnfusion",
                                     input_shapes=shapes)
        np.testing.assert_allclose(model.run(None, feeds)[0], want, rtol=1e-3, atol=1e-3)
        runs[name] = (lambda m=model: m.run(None, feeds))
        launches[name] = len(model.plan.launches)
    return ("BERT-style encoder layer (hidden 256, 4 heads, sequence 128; launches: "
            + ", ".join(f"{n} {k}" for n, k in launches.items()) + ")"), runs


def measure(label: str, runs: dict[str, Callable[[], object]], rounds: int, repeat: int
            ) -> dict[str, object]:
    medians: dict[str, list[float]] = {name: [] for name in runs}
    ours = [name for name in runs if name != "onnxruntime"]
    for r in range(rounds):
        # kernelgen's variants in rotating order, then onnxruntime
        order = ours[r % len(ours):] + ours[:r % len(ours)] + ["onnxruntime"]
        time.sleep(0.05)
        for name in order:
            medians[name].append(statistics.median(timed(runs[name], repeat)))
    row: dict[str, object] = {"case": label, **{f"{n}_ms": round(statistics.median(v), 4)
                                                for n, v in medians.items()}}
    # ratios paired within each round, then their median: the machine's drift from one round
    # to the next (2x on a shared host) cancels in a round's ratio
    for name in ours[1:] + ["onnxruntime"]:
        row[f"{name}_over_default"] = round(statistics.median(
            a / b for a, b in zip(medians[name], medians["default"])), 2)
    print(f"{label}: " + ", ".join(f"{n} {row[f'{n}_ms']} ms" for n in runs) + "; "
          + ", ".join(f"{n} / default {row[f'{n}_over_default']}"
                      for n in ours[1:] + ["onnxruntime"]), flush=True)
    return row


def main() -> int:
    return case_main(__doc__, lambda: [projection(*shape) for shape in SHAPES]
                     + [scores(seq, heads) for seq, heads in SCORES] + [bert_layer()], measure)


if __name__ == "__main__":
    raise SystemExit(main())
