"""Where the time goes, kernelgen beside onnxruntime: each launch of a compiled model timed on
its own (``Session.profile``; each includes a launch-and-wait round trip) and onnxruntime's
own per-node profile (``SessionOptions.enable_profiling``: each node's kernel time, no
launch cost; CPU provider, all graph optimisations, 2 threads), the slowest of each listed.

    python bench/launch_profile.py [--models squeezenet,bert_layer] [--top 12] [--rounds 40]
                                   [--rewrite] [--json bench/results/launch-profile.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from whole_models import MODELS  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.cli.model import parse_shapes  # noqa: E402


def onnxruntime_nodes(model: bytes, feeds: dict[str, np.ndarray], rounds: int
                      ) -> tuple[list[dict], float]:
    """onnxruntime's nodes (name, op type, median kernel time in ms), slowest first, and
    their median sum per run."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
        options.enable_profiling, options.profile_file_prefix = True, f"{tmp}/ort"
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        for _ in range(rounds):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[(e["name"].removesuffix("_kernel_time"), e["args"]["op_name"])].append(
                e["dur"] / 1e3)
    nodes = sorted(({"node": n, "op": op, "ms": statistics.median(t)}
                    for (n, op), t in times.items()), key=lambda r: -r["ms"])
    return nodes, sum(r["ms"] for r in nodes)


def profile_model(name: str, rounds: int, top: int, rewrite: bool) -> dict:
    build, shapes = MODELS[name]
    proto = build()
    graph = kg.import_onnx(proto, parse_shapes(shapes))
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype.numpy)
             for v in graph.inputs}
    session = kg.compile_model(graph, backend="opencl", fusion="dnnfusion", rewrite=rewrite)
    prof = session.profile(feeds, rounds=rounds)
    nodes, ort_sum = onnxruntime_nodes(proto.SerializeToString(), feeds, rounds)
    print(f"== {name}: kernelgen (dnnfusion{', rewrites' if rewrite else ''}, OpenCL)")
    print(prof.table(top))
    print(f"-- onnxruntime's nodes, kernel time ({len(nodes)} nodes, {ort_sum:.3f} ms summed)")
    for r in nodes[:top]:
        print(f"{r['ms']:>8.3f} {r['ms'] / ort_sum:>6.1%}  {r['op']:<14} {r['node']}")
    return {"model": name, "rewrite": rewrite, "run_ms": round(prof.run_ms, 4),
            "launches": [{"launch": t.launch, "ops": list(t.ops), "schedule": t.schedule,
                          "ms": round(t.ms, 4), "gflops": round(t.gflops, 1)}
                         for t in prof.launches],
            "onnxruntime_nodes": [{**r, "ms": round(r["ms"], 4)} for r in nodes],
            "onnxruntime_sum_ms": round(ort_sum, 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="squeezenet")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rewrite", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = [profile_model(m, args.rounds, args.top, args.rewrite)
            for m in args.models.split(",")]
    if args.json:
        from kernelgen.backends.opencl.runtime import device
        args.json.write_text(json.dumps({"command": "python " + " ".join(sys.argv),
                                         "machine": platform.processor() or platform.machine(),
                                         "device": device().info.name, "models": rows},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
