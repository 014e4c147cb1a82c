"""One model compiled several times in one process (the first compile cold, the others from
the caches; with ``--rewrite``, every second one after the math-property rewrites), the
sessions checked equal and then timed round-robin, one whole run of each per round (medians
in ms). Whether a later session of the same plan runs slower than the first, as
``bench/whole_models.py``'s second configuration in a process did, is then told apart from the
machine's drift between the two timings.

    python bench/sessions_interleaved.py [--model bert_layer] [--fusion dnnfusion] \\
        [--sessions 3] [--rewrite] [--rounds 40]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from whole_models import MODELS  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.cli.model import _feeds  # noqa: E402
from kernelgen.graph import import_onnx  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert_layer", choices=sorted(MODELS))
    ap.add_argument("--fusion", default="dnnfusion")
    ap.add_argument("--backend", default="opencl")
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--rewrite", action="store_true", help="every second session rewritten")
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    build, shape_args = MODELS[args.model]
    proto = build()
    shapes = {name: tuple(int(d) for d in dims.split(","))
              for name, dims in (s.split("=") for s in shape_args)}
    feeds = _feeds(import_onnx(proto, shapes or None), None)
    sessions = {}
    for i in range(args.sessions):
        rewrite = args.rewrite and i % 2 == 1
        start = time.perf_counter()
        sessions[f"session {i + 1}{' (rewritten)' if rewrite else ''}"] = kg.compile_model(
            proto, backend=args.backend, fusion=args.fusion, input_shapes=shapes or None,
            rewrite=rewrite)
        print(f"session {i + 1}: compiled in {time.perf_counter() - start:.2f} s", flush=True)
    outputs = [s.run(None, feeds) for s in sessions.values()]
    for got in outputs[1:]:
        for a, b in zip(outputs[0], got):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(args.rounds):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds)
            times[name].append((time.perf_counter() - start) * 1e3)
    for name, ts in times.items():
        print(f"{name}: {np.median(ts):.3f} ms (p20 {np.percentile(ts, 20):.3f}, "
              f"p80 {np.percentile(ts, 80):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
