"""Yellow cells of DNNFusion's table, measured: blocks from real models whose fusion crosses a
yellow edge (a Shuffle or Reorganize next to a contraction or a reduction), each timed as one
fused kernel against its split alternative (``kernelgen.measure_fusion``: the block cut at its
yellow edges) at three shapes, on one backend, in one run.

    python bench/yellow_cells.py [--backend opencl] [--rounds 3] [--repeat 15]
                                 [--only scores,merge] [--json bench/results/yellow_cells.json]
    python bench/yellow_cells.py --models bert_layer,mobilenet_v2 [--repeat 60]

``--models``: whole models (``tests/models/model_zoo.py``) planned by TVM's planner, by
DNNFusion's with no verdicts (yellow cells unfused) and by DNNFusion's with its yellow cells
measured (``tuning='measure-fusion'``, a scratch database), run round-robin in one process.

Each round measures afresh (nothing is read from the Fast-Run database; a scratch database is
used) with fused and split timed round-robin; the table gives per block the medians over rounds
of both times, the winner and by how much. Both variants are checked against the loop-IR
interpreter before they are timed.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import kernelgen as kg
from kernelgen.fastrun import FastRunDB
from kernelgen.graph import compile_model
from kernelgen.measure_fusion import measure_fusion
from kernelgen.tune import MeasureFusion

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from models.model_zoo import bert_layer, light, mobilenet_v2  # noqa: E402


def scores(heads: int, seq: int, depth: int) -> tuple[str, list[kg.Op]]:
    """Attention scores Q . transpose(K) * s: Shuffle -> Many-to-Many."""
    q, k = kg.tensor("q", (heads, seq, depth)), kg.tensor("k", (heads, seq, depth))
    kt = kg.transpose(k, (0, 2, 1))
    s = kg.matmul(q, kt)
    return f"{heads} heads x {seq} x {depth}", [kt, s, kg.mul(s, kg.tensor("scale", (1,)))]


def split_heads(seq: int, hidden: int, heads: int) -> tuple[str, list[kg.Op]]:
    """A projection split into heads, (x W + b) -> Reshape -> Transpose: Many-to-Many ->
    Reorganize."""
    x, w, b = (kg.tensor("x", (seq, hidden)), kg.tensor("w", (hidden, hidden)),
               kg.tensor("b", (hidden,)))
    mm = kg.matmul(x, w)
    a = kg.add(mm, b)
    r = kg.reshape(a, (seq, heads, hidden // heads))
    return f"{seq} x {hidden}, {heads} heads", [mm, a, r, kg.transpose(r, (1, 0, 2))]


def merge_heads(seq: int, hidden: int, heads: int) -> tuple[str, list[kg.Op]]:
    """The heads merged and projected, Transpose -> Reshape -> MatMul: Shuffle ->
    Many-to-Many."""
    ctx = kg.tensor("ctx", (heads, seq, hidden // heads))
    t = kg.transpose(ctx, (1, 0, 2))
    r = kg.reshape(t, (seq, hidden))
    return f"{seq} x {hidden}, {heads} heads", [t, r, kg.matmul(r, kg.tensor("w", (hidden,
                                                                                  hidden)))]


def transposed_softmax(rows: int, cols: int) -> tuple[str, list[kg.Op]]:
    """softmax(transpose(x)) over the transposed rows: Shuffle -> Many-to-Many."""
    t = kg.transpose(kg.tensor("x", (cols, rows)), (1, 0))
    return f"{rows} x {cols}", [t, kg.softmax(t, 1)]


def shuffle_conv(c: int, hw: int) -> tuple[str, list[kg.Op]]:
    """ShuffleNet's channel shuffle (groups 2) into a 1x1 convolution: Reorganize ->
    Many-to-Many."""
    x = kg.tensor("x", (1, c, hw, hw))
    r1 = kg.reshape(x, (1, 2, c // 2, hw, hw))
    t = kg.transpose(r1, (0, 2, 1, 3, 4))
    r2 = kg.reshape(t, (1, c, hw, hw))
    conv = kg.conv(r2, kg.constant("w", np.random.default_rng(c).standard_normal(
        (c, c, 1, 1)).astype(np.float32) * 0.1))
    return f"{c} channels at {hw}x{hw}", [r1, t, r2, conv]


FAMILIES: dict[str, tuple[Callable[..., tuple[str, list[kg.Op]]], list[tuple[int, ...]]]] = {
    # BERT-base, the attention, BERT-large
    "scores": (scores, [(12, 128, 64), (8, 256, 64), (16, 384, 64)]),
    "split": (split_heads, [(128, 768, 12), (256, 512, 8), (384, 1024, 16)]),
    "merge": (merge_heads, [(128, 768, 12), (256, 512, 8), (384, 1024, 16)]),
    # rows of a transposed (channels, positions) map
    "softmax": (transposed_softmax, [(1024, 128), (4096, 256), (512, 2048)]),
    # ShuffleNetV2 1.0x stages 2-4
    "shuffle-conv": (shuffle_conv, [(116, 28), (232, 14), (464, 7)]),
}


def run(backend: str, only: list[str], rounds: int, repeat: int) -> list[dict[str, object]]:
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        db = FastRunDB(Path(scratch) / "fastrun.sqlite")
        for family, (build, shapes) in FAMILIES.items():
            if only and family not in only:
                continue
            for shape in shapes:
                label, ops = build(*shape)
                block = kg.fuse(*ops)
                if not block.needs_measurement:  # green by ``run_rule``: whole runs kept
                    why = next(e.rule.reason for e in block.edges if "runs" in e.rule.reason)
                    print(f"{family:<13} {label:<26} green: {why}")
                    continue
                verdicts = [measure_fusion(block, backend, db=db, use_cache=False,
                                           repeat=repeat) for _ in range(rounds)]
                fused = float(np.median([v.fused_ms for v in verdicts]))
                split = float(np.median([v.split_ms for v in verdicts]))
                row = {"family": family, "shape": label, "fused_ms": fused, "split_ms": split,
                       "winner": "fused" if fused <= split else "split",
                       "by": max(fused, split) / min(fused, split),
                       "split_kernels": len(verdicts[0].parts),
                       "rounds_fused_won": sum(v.fused for v in verdicts),
                       "cut": list(verdicts[0].edges)}
                rows.append(row)
                print(f"{family:<13} {label:<26} fused {fused:8.3f} ms  split "
                      f"({row['split_kernels']}) {split:8.3f} ms  {row['winner']} by "
                      f"{row['by']:.2f}x ({row['rounds_fused_won']}/{rounds} rounds fused)",
                      flush=True)
    return rows


# the models of docs/benchmarks.md "Whole models", with their fixed input shapes
MODELS = {"bert_layer": (lambda: bert_layer(batch=1, seq=128, hidden=256, heads=4),
                         {"x": (1, 128, 256), "mask": (1, 128)}),
          "mobilenet_v2": (lambda: mobilenet_v2(size=112), {}),
          "shufflenet": (lambda: light("shufflenet"), {}),
          "squeezenet": (lambda: light("squeezenet"), {})}


def run_models(backend: str, names: list[str], repeat: int) -> list[dict[str, object]]:
    rows = []
    for name in names:
        build, shapes = MODELS[name]
        model = build()
        rng = np.random.default_rng(0)
        sessions, compile_s = {}, {}
        with tempfile.TemporaryDirectory() as scratch:
            db = FastRunDB(Path(scratch) / "fastrun.sqlite")
            for label, fusion, tuning in (("tvm", "tvm", "stored"),
                                          ("dnnfusion, yellow unfused", "dnnfusion", "none"),
                                          ("dnnfusion, yellow measured", "dnnfusion",
                                           MeasureFusion(db))):
                start = time.perf_counter()
                sessions[label] = compile_model(model, backend, fusion=fusion, tuning=tuning,
                                                input_shapes=shapes)
                compile_s[label] = round(time.perf_counter() - start, 1)
        feeds = {}
        for info in next(iter(sessions.values())).get_inputs():
            feeds[info.name] = (np.ones(info.shape, np.int64) if "int" in info.dtype else
                                rng.standard_normal(info.shape).astype(np.float32))
        want = next(iter(sessions.values())).run(None, feeds)[0]
        times: dict[str, list[float]] = {label: [] for label in sessions}
        for _ in range(repeat):
            for label, session in sessions.items():
                t0 = time.perf_counter()
                session.run(None, feeds)
                times[label].append((time.perf_counter() - t0) * 1e3)
        for label, session in sessions.items():
            got = session.run(None, feeds)[0]
            row = {"model": name, "plan": label, "kernels": len(session.blocks),
                   "median_ms": float(np.median(times[label])),
                   "compile_s": compile_s[label],
                   "max_abs_diff_vs_tvm": float(np.max(np.abs(got - want))),
                   "yellow_fused": [b.note.split("; yellow cells fused, ")[1]
                                    for b in session.blocks if "yellow cells fused" in b.note]}
            rows.append(row)
            print(f"{name:<13} {label:<28} {row['kernels']:3d} kernels  "
                  f"{row['median_ms']:7.3f} ms  compile {row['compile_s']} s", flush=True)
            for note in row["yellow_fused"]:
                print(f"    yellow cells fused: {note}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="opencl")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--only", default="", help="comma-separated families: "
                        + ", ".join(FAMILIES))
    parser.add_argument("--models", default="", help="comma-separated whole models instead: "
                        + ", ".join(MODELS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.models:
        names = [m for m in args.models.split(",") if m]
        if any(m not in MODELS for m in names):
            parser.error(f"unknown models in {names}; known: {', '.join(MODELS)}")
    only = [f for f in args.only.split(",") if f]
    unknown = [f for f in only if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    start = time.time()
    rows = (run_models(args.backend, names, args.repeat) if args.models else
            run(args.backend, only, args.rounds, args.repeat))
    if args.json:
        args.json.write_text(json.dumps({
            "command": "python bench/yellow_cells.py " + " ".join(
                f"--{k} {v}" for k, v in vars(args).items() if v and k != "json"),
            "backend": args.backend, "machine": platform.processor() or platform.machine(),
            "seconds": round(time.time() - start, 1), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
