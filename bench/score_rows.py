"""softmax(Q Kᵀ * s + mask) written out, as a model that outputs its attention weights runs it:
one kernel that stages each score row once per query (``lower/staging.py:
_stage_row_producer``, what the DNNFusion planner's intensive fusion merges where measured)
against the two kernels the planner runs otherwise (the scores with their scale and mask, then
the Softmax), timed round-robin in one process (``measure.round_robin``: each call launches
and waits, medians in ms), onnxruntime (MatMul, Mul, Add, Softmax; 2 threads) apart. With
``--before``, also the one kernel as lowered before the staged score row
(``staging.STAGE_ROW_PRODUCERS`` off: each output element recomputed its row's scores for the
max and again for the sum), timed a few times on the first shape only.

    python bench/score_rows.py [--backend opencl|neon] [--repeat 100] [--before] [--json FILE]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kernelgen as kg
from kernelgen.lower import staging
from kernelgen.measure import round_robin, runner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv import two_thread_session  # noqa: E402
from pooling import write_rows  # noqa: E402

# (heads, sequence, depth): the bench's BERT layer, BERT-base, longer sequences
SHAPES = ((4, 128, 64), (12, 128, 64), (8, 256, 64), (4, 512, 64))
ORT = "onnxruntime"


def _ops(heads: int, seq: int, depth: int) -> list[kg.Op]:
    q, kt = kg.tensor("q", (heads, seq, depth)), kg.tensor("kt", (heads, depth, seq))
    scores = kg.matmul(q, kt)
    scaled = kg.mul(scores, kg.tensor("s", (1,)))
    masked = kg.add(scaled, kg.tensor("mask", (seq,)))
    return [scores, scaled, masked, kg.softmax(masked, 2)]


def _ort(heads: int, seq: int, depth: int):
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["a"]),
             helper.make_node("Mul", ["a", "s"], ["b"]),
             helper.make_node("Add", ["b", "mask"], ["c"]),
             helper.make_node("Softmax", ["c"], ["p"], axis=-1)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (
        ("q", (heads, seq, depth)), ("kt", (heads, depth, seq)), ("mask", (seq,)))]
    graph = helper.make_graph(nodes, "scores", inputs,
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(
                                  np.array([depth ** -0.5], np.float32), "s")])
    return two_thread_session(graph)


def row(heads: int, seq: int, depth: int, backend: str, repeat: int, before: bool
        ) -> dict[str, object]:
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((heads, seq, depth)).astype(np.float32),
             "kt": rng.standard_normal((heads, depth, seq)).astype(np.float32),
             "s": np.array([depth ** -0.5], np.float32),
             "mask": np.where(rng.random(seq) < 0.1, -1e4, 0.0).astype(np.float32)}
    ops = _ops(heads, seq, depth)
    one = kg.fuse(*ops, force=True)
    scores, soft = kg.fuse(*ops[:3]), kg.fuse(ops[3])
    kernel = one.emit(backend, tuning="none")
    first = scores.emit(backend, tuning="none")
    second = soft.emit(backend, tuning="none")
    args = [feeds[v.name] for v in one.inputs]
    sess = _ort(heads, seq, depth)
    want = sess.run(None, {n: feeds[n] for n in ("q", "kt", "mask")})[0]
    np.testing.assert_allclose(kernel(*args), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(second(first(*[feeds[v.name] for v in scores.inputs])), want,
                               rtol=1e-4, atol=1e-6)
    calls = {"one kernel": runner(kernel, *args),
             "two kernels": runner([first, second], *[feeds[v.name] for v in scores.inputs])}
    times = {name: float(np.median(t)) for name, t in round_robin(
        calls, 3, repeat, apart={ORT: lambda: sess.run(None, {n: feeds[n] for n in
                                                                ("q", "kt", "mask")})}).items()}
    out: dict[str, object] = {
        "block": f"{heads} heads x {seq} x {depth}", "backend": backend,
        "schedule": kernel.metadata["schedule"],
        **{f"{k}_ms": round(v, 4) for k, v in times.items()},
        "two_over_one": round(times["two kernels"] / times["one kernel"], 2),
        "ort_over_one": round(times[ORT] / times["one kernel"], 2)}
    if before:
        staging.STAGE_ROW_PRODUCERS = False
        try:  # a block of its own: lowering is cached per block
            inlined = kg.fuse(*ops, force=True).emit(backend, tuning="none")
        finally:
            staging.STAGE_ROW_PRODUCERS = True
        out["before_schedule"] = inlined.metadata["schedule"]
        inlined(*args)
        spent = []
        for _ in range(3):
            start = time.perf_counter()
            inlined(*args)
            spent.append((time.perf_counter() - start) * 1e3)
        out["before_ms"] = round(float(np.median(spent)), 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="opencl", choices=("opencl", "neon"))
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--before", action="store_true",
                    help="also the unstaged kernel, on the first shape")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for k, shape in enumerate(SHAPES):
        r = row(*shape, args.backend, args.repeat, args.before and k == 0)
        rows.append(r)
        print("  ".join(f"{key} {value}" for key, value in r.items()), flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
