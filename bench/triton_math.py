"""Triton's float32 math on a CUDA GPU: kernelgen's own library (``lower/fastmath.py``) with
division and square roots rounded once (``tl.div_rn``, ``tl.sqrt_rn``), as the backend prints
it, against the printing it replaced (``tl.exp``, ``tl.erf``, "/" and ``tl.sqrt``, which are
tens of ulps off near exp's overflow and flush subnormals), timed round-robin in one process on
bandwidth-bound kernels. Run where a GPU is (TRITON_INTERPRET=0):

    TRITON_INTERPRET=0 python bench/triton_math.py [--repeat 30] [--json out.json]

Medians in ms of synchronised calls on device-resident buffers (``kg.measure.runner``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

os.environ.setdefault("TRITON_INTERPRET", "0")

import kernelgen as kg  # noqa: E402
from kernelgen.backends import triton as triton_backend  # noqa: E402
from kernelgen.backends.triton import language  # noqa: E402
from kernelgen.measure import bench_interleaved  # noqa: E402

N, ROWS = (1 << 24,), (4096, 1024)


def blocks() -> dict[str, tuple[kg.FusedOp, tuple[int, ...]]]:
    x, r = kg.tensor("x", N), kg.tensor("x", ROWS)
    return {"gelu 16M": (kg.fuse(kg.gelu(x)), N), "sigmoid 16M": (kg.fuse(kg.sigmoid(x)), N),
            "tanh 16M": (kg.fuse(kg.tanh(x)), N), "exp 16M": (kg.fuse(kg.exp(x)), N),
            "softmax 4096x1024": (kg.fuse(kg.softmax(r, 1)), ROWS)}


def built_ins() -> None:
    """The backend as it printed before: no expansion but pow's, plain "/" and tl.sqrt."""
    backend = triton_backend.BACKEND
    object.__setattr__(backend, "caps",
                       dataclasses.replace(backend.caps, fast_math=frozenset({"pow"})))
    language.ROUNDED.clear()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    library = {name: f.emit("triton", tuning="none") for name, (f, _) in blocks().items()}
    built_ins()
    previous = {name: f.emit("triton", tuning="none") for name, (f, _) in blocks().items()}
    rng = np.random.default_rng(0)
    rows = {}
    for name, (_, shape) in blocks().items():
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        m = bench_interleaved({"library": (library[name], [x]),
                               "built-ins": (previous[name], [x])}, warmup=5,
                              repeat=args.repeat)
        rows[name] = {k: round(v.median_ms, 4) for k, v in m.items()}
        print(f"{name:20s} library {rows[name]['library']:.4f} ms   "
              f"built-ins {rows[name]['built-ins']:.4f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["python", "bench/triton_math.py", *sys.argv[1:]]),
                       "medians_ms": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
