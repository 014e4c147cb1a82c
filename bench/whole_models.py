"""Whole models: each planner (``none``, ``tvm``, ``dnnfusion``), with and without the
math-property rewrites, on OpenCL and NEON C, beside onnxruntime (CPU, all graph optimisations,
2 threads), through ``kernelgen bench`` (``kernelgen/cli/model.py``: ``bench_model``).

Each (model, backend, planner, rewrite) runs in a process of its own with an empty kernel
cache (a fresh ``XDG_CACHE_HOME``, which holds PoCL's and kernelgen's caches), so its first
compile is cold and the second one, in the same process, is warm. The models are the ones the
model tests check against onnxruntime (``tests/models/model_zoo.py``), at larger sizes: the
BERT-style encoder layer (hidden 256, 4 heads, sequence 128), the MobileNetV2 stack (112x112),
and onnx's light SqueezeNet, ShuffleNet and Inception v1 (224x224) with random weights; the
other light models (ResNet-50, Inception v2, DenseNet-121, VGG-19, AlexNet, ZFNet-512) when
named in ``--models``.
ResNet-50 (``--resnet``) is timed for compiling only: cold, then saved and loaded again (in
a new process with the compile's kernel cache, and with an empty one).

    python bench/whole_models.py [--models bert_layer,mobilenet_v2] [--backends opencl,neon] \\
        [--repeat 20] [--json bench/results/models.json] [--plot docs/img/models.png] [--resnet]

prints each run's table and writes every row as JSON, and a bar chart of latency over
onnxruntime's per model and backend.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from models.model_zoo import bert_layer, light, mobilenet_v2  # noqa: E402

from kernelgen.graph.planners import PLANNERS  # noqa: E402

MODELS = {
    "bert_layer": (lambda: bert_layer(hidden=256, heads=4), ["x=1,128,256", "mask=1,128"]),
    "mobilenet_v2": (lambda: mobilenet_v2(size=112), []),
    "squeezenet": (lambda: light("squeezenet"), []),
    "shufflenet": (lambda: light("shufflenet"), []),
    "inception_v1": (lambda: light("inception_v1"), []),
}
DEFAULT = tuple(MODELS)  # about 25 minutes; the other light models are bigger, asked for by name
for _name in ("resnet50", "inception_v2", "densenet121", "vgg19", "bvlc_alexnet", "zfnet512"):
    MODELS[_name] = (lambda name=_name: light(name), [])


def _one(path: Path, shapes: list[str], backend: str, fusion: str, rewrite: str,
         repeat: int) -> dict:
    """``kernelgen bench`` for one configuration, in a fresh process and kernel cache."""
    with tempfile.TemporaryDirectory(prefix="kg-bench-cache-") as cache, \
            tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = dict(os.environ, XDG_CACHE_HOME=cache, TRITON_CACHE_DIR=f"{cache}/triton")
        cmd = [sys.executable, "-m", "kernelgen", "bench", str(path), "--backend", backend,
               "--fusion", fusion, "--rewrite", rewrite, "--repeat", str(repeat),
               "--json", out.name, *(f"--shape={s}" for s in shapes)]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{run.stdout}\n{run.stderr}")
        print(run.stdout, flush=True)
        return json.loads(Path(out.name).read_text())


def resnet_compile(directory: Path) -> dict:
    """ResNet-50 (random weights) under DNNFusion's plan on OpenCL: a cold compile in a fresh
    process, then that session saved and loaded in another process."""
    path = directory / "resnet50.onnx"
    onnx.save(light("resnet50"), str(path))
    saved = directory / "resnet50.kg"
    script = (  # timed from before ``import kernelgen``, which loads the model layer lazily
        "import time\n"
        "start = time.perf_counter()\n"
        "import kernelgen as kg\n"
        "t = time.perf_counter()\n"
        f"s = kg.compile_model({str(path)!r}, backend='opencl', fusion='dnnfusion')\n"
        "print(time.perf_counter() - t, len(s.plan.launches), time.perf_counter() - start)\n"
        f"s.save({str(saved)!r})\n")
    load = ("import time\n"
            "start = time.perf_counter()\n"
            "import kernelgen as kg\n"
            "t = time.perf_counter()\n"
            f"s = kg.load_model({str(saved)!r})\n"
            "print(time.perf_counter() - t, time.perf_counter() - start)\n")
    with tempfile.TemporaryDirectory(prefix="kg-bench-cache-") as cache:
        env = dict(os.environ, XDG_CACHE_HOME=cache)
        compiled = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                  capture_output=True, text=True).stdout.split()
        # on the machine that compiled it, PoCL's cache holds the built kernels
        warm = subprocess.run([sys.executable, "-c", load], env=env, check=True,
                              capture_output=True, text=True).stdout.split()
    with tempfile.TemporaryDirectory(prefix="kg-bench-cache-") as cache:
        env = dict(os.environ, XDG_CACHE_HOME=cache)  # elsewhere: every kernel built again
        cold = subprocess.run([sys.executable, "-c", load], env=env, check=True,
                              capture_output=True, text=True).stdout.split()
    return {"model": "resnet50", "backend": "opencl", "fusion": "dnnfusion",
            "cold_compile_s": float(compiled[0]), "kernels": int(compiled[1]),
            "cold_import_and_compile_s": float(compiled[2]),
            "load_s": float(warm[0]), "load_with_import_s": float(warm[1]),
            "load_empty_cache_s": float(cold[0])}


def plot(results: list[dict], path: Path) -> None:
    """Latency over onnxruntime's, per model, backend and planner (the model as imported:
    each process's first configuration)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(r, row) for r in results for row in r["rows"] if not row["rewrite"]]
    groups = sorted({(Path(r["model"]).stem, r["backend"]) for r, _ in rows})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 + 1.3 * len(groups)), 3.6))
    width = 0.8 / len(PLANNERS)
    for k, fusion in enumerate(PLANNERS):
        values = []
        for model, backend in groups:
            match = [row["latency_ms"] / r["onnxruntime_ms"] for r, row in rows
                     if (Path(r["model"]).stem, r["backend"]) == (model, backend)
                     and row["fusion"] == fusion]
            values.append(match[0] if match else 0.0)
        ax.bar([g + (k - 1) * width for g in range(len(groups))], values, width, label=fusion)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), [f"{m}\n{b}" for m, b in groups], fontsize=8)
    ax.set_ylabel("latency / onnxruntime's")
    ax.set_title("kernelgen planners vs onnxruntime (all optimisations), 2 threads; lower is "
                 "better", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT),
                    help=f"of {', '.join(MODELS)}")
    ap.add_argument("--backends", default="opencl,neon")
    ap.add_argument("--fusion", default=",".join(PLANNERS))
    ap.add_argument("--rewrite", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", default="bench/results/models.json")
    ap.add_argument("--plot", default="docs/img/models.png")
    ap.add_argument("--resnet", action="store_true", help="time ResNet-50's cold compile and "
                    "its saved session's load too")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="run nothing: merge these "
                    "files (of earlier runs) into --json and plot them")
    args = ap.parse_args()
    if args.merge:
        runs = [json.loads(Path(f).read_text()) for f in args.merge]
        merged = [r for run in runs for r in run["results"]]
        Path(args.json).write_text(json.dumps({
            "command": [run["command"] for run in runs], "results": merged,
            "compile": [c for run in runs for c in run["compile"]],
            "seconds": sum(run["seconds"] for run in runs)}, indent=1) + "\n")
        if args.plot:
            plot(merged, Path(args.plot))
        return
    unknown = [n for n in filter(None, args.models.split(",")) if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    results = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kg-bench-models-") as tmp:
        for name in filter(None, args.models.split(",")):
            make, shapes = MODELS[name]
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(make(), str(path))
            for backend in args.backends.split(","):
                for fusion in args.fusion.split(","):
                    result = _one(path, shapes, backend, fusion, args.rewrite, args.repeat)
                    result["model"] = name
                    results.append(result)
        extra = [resnet_compile(Path(tmp))] if args.resnet else []
    merged = _merge(results)
    Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "results": merged,
                                           "compile": extra,
                                           "seconds": round(time.time() - started)},
                                          indent=1) + "\n")
    if args.plot:
        plot(merged, Path(args.plot))
    for e in extra:
        print(f"resnet50 on opencl (dnnfusion): cold compile {e['cold_compile_s']:.1f} s "
              f"({e['cold_import_and_compile_s']:.1f} s with the import), "
              f"{e['kernels']} kernels; saved session loads in {e['load_s']:.2f} s "
              f"({e['load_with_import_s']:.2f} s with the import) "
              f"({e['load_empty_cache_s']:.2f} s with an empty kernel cache)")


def _merge(results: list[dict]) -> list[dict]:
    """One entry per (model, backend), its planners' rows together."""

    merged: dict[tuple[str, str], dict] = {}
    for r in results:
        key = (r["model"], r["backend"])
        if key not in merged:
            merged[key] = {**r, "rows": [], "onnxruntime_runs_ms": []}
        merged[key]["rows"] += r["rows"]
        merged[key]["onnxruntime_runs_ms"].append(r["onnxruntime_ms"])
    for m in merged.values():  # onnxruntime was timed in each process: their median
        m["onnxruntime_ms"] = statistics.median(m["onnxruntime_runs_ms"])
    return list(merged.values())


if __name__ == "__main__":
    main()
