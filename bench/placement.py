"""Compiled models under each setting of PoCL's worker threads (``placement.py``): ``auto``
(kernelgen times spread, packed and packed-polled at compile time and keeps the fastest),
``off`` (left where Linux puts them), or one placement forced
(``KERNELGEN_OPENCL_PLACEMENT``), beside onnxruntime (2 threads). Each measurement is a
process of its own (the threads' placement is the process's), the settings alternating;
latency is the median of 40 runs (dnnfusion, rewrites on), onnxruntime's of 40 in the same
process, and ``auto``'s choice is printed.

    python bench/placement.py [--models bert_layer,mobilenet_v2,...] [--rounds 2]
                              [--settings off,auto] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from kernelgen.cli.model import parse_shapes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from whole_models import MODELS  # noqa: E402

CHILD = """
import json, sys
import onnx
import kernelgen as kg
from kernelgen.cli.model import _feeds, _median_ms, _onnxruntime_ms
proto = onnx.load(sys.argv[1])
graph = kg.import_onnx(proto, json.loads(sys.argv[2]) or None)
feeds = _feeds(graph, None)
session = kg.compile_model(graph, backend="opencl", fusion="dnnfusion", rewrite=True)
ms = _median_ms(lambda: session.run(None, feeds), 40)
print(json.dumps({"ms": ms, "ort_ms": _onnxruntime_ms(proto, feeds, 40, threads=2),
                  "chosen": session.model.placement}))
"""


def measure(path: Path, shapes: dict[str, list[int]], setting: str) -> dict:
    env = dict(os.environ)
    env.pop("KERNELGEN_OPENCL_PLACEMENT", None)
    if setting != "auto":
        env["KERNELGEN_OPENCL_PLACEMENT"] = setting
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), json.dumps(shapes)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert_layer,mobilenet_v2,squeezenet,shufflenet,"
                                        "inception_v1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settings", default="off,auto",
                    help="comma-separated: auto, off, spread, packed, packed-polled")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    settings = args.settings.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            make, shape_args = MODELS[name]
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(make(), str(path))
            shapes = parse_shapes(shape_args)
            for _ in range(args.rounds):
                row: dict = {"model": name}
                for setting in settings:
                    r = measure(path, shapes, setting)
                    row[setting] = {"ms": round(r["ms"], 4), "ort_ms": round(r["ort_ms"], 4),
                                    "vs_ort": round(r["ort_ms"] / r["ms"], 3),
                                    "chosen": r["chosen"]}
                print(f"{name}: " + ", ".join(
                    f"{k} {v['ms']:.3f} ms (x{v['vs_ort']:.2f} onnxruntime"
                    + (f", chose {v['chosen']})" if k == "auto" else ")")
                    for k, v in row.items() if k != "model"), flush=True)
                rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"command": "python " + " ".join(sys.argv),
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
