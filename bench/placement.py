"""Compiled models with PoCL's worker threads placed by kernelgen (``placement.py``: spread
or packed, whichever the model ran faster with at compile time) against left where Linux put
them (``KERNELGEN_OPENCL_PLACEMENT=off``), beside onnxruntime (2 threads). Each measurement
is a process of its own (the threads' placement is the process's), the two settings
alternating; latency is ``kernelgen bench``'s median of 40 runs (dnnfusion, rewrites on).

    python bench/placement.py [--models bert_layer,mobilenet_v2,...] [--rounds 2] [--json F]
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
from kernelgen.cli.model import bench_model
shapes = json.loads(sys.argv[2]) or None
r = bench_model(sys.argv[1], "opencl", planners=("dnnfusion",), rewrites=(True,), repeat=40,
                shapes=shapes)
print(json.dumps({"ms": r.rows[0].latency_ms, "ort_ms": r.onnxruntime_ms}))
"""


def measure(path: Path, shapes: dict[str, list[int]], placed: bool) -> dict[str, float]:
    env = dict(os.environ)
    if not placed:
        env["KERNELGEN_OPENCL_PLACEMENT"] = "off"
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), json.dumps(shapes)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert_layer,mobilenet_v2,squeezenet,shufflenet,"
                                        "inception_v1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            make, shape_args = MODELS[name]
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(make(), str(path))
            shapes = parse_shapes(shape_args)
            for _ in range(args.rounds):
                row = {"model": name}
                for placed in (False, True):
                    r = measure(path, shapes, placed)
                    key = "placed" if placed else "left"
                    row[f"{key}_ms"], row[f"{key}_vs_ort"] = r["ms"], r["ort_ms"] / r["ms"]
                print(f"{name}: left {row['left_ms']:.3f} ms (x{row['left_vs_ort']:.2f} "
                      f"onnxruntime), placed {row['placed_ms']:.3f} ms "
                      f"(x{row['placed_vs_ort']:.2f})", flush=True)
                rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"command": "python " + " ".join(sys.argv),
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
