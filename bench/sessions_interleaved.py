"""One model compiled several times in one process (the first compile cold, the others from
the caches; with ``--rewrite``, every second one after the math-property rewrites), the
sessions checked equal and then timed round-robin, one whole run of each per round (medians
in ms). Whether a later session of the same plan runs slower than the first, as
``bench/whole_models.py``'s second configuration in a process did, is then told apart from the
machine's drift between the two timings. onnxruntime (all graph optimisations, 2 threads) is
timed in five blocks of its own, before, between and after shares of the rounds
(``measure.round_robin``'s ``apart``): its spinning thread pool slows the run after its own.
``--onnxruntime-in-rounds`` gives it a turn in every round instead, as this script did before.

    python bench/sessions_interleaved.py [--model bert_layer] [--fusion dnnfusion] \\
        [--sessions 3] [--rewrite] [--rounds 40] [--onnxruntime-in-rounds] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling import write_rows  # noqa: E402
from whole_models import MODELS  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.cli.model import _feeds, _ort_session, parse_shapes  # noqa: E402
from kernelgen.graph import import_onnx  # noqa: E402
from kernelgen.measure import round_robin  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert_layer", choices=sorted(MODELS))
    ap.add_argument("--fusion", default="dnnfusion", help="planners, comma-separated")
    ap.add_argument("--backend", default="opencl")
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--rewrite", action="store_true", help="every second session rewritten")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--onnxruntime-in-rounds", action="store_true",
                    help="onnxruntime takes its turn in every round (as before 2026-12-03)")
    ap.add_argument("--json", type=Path, default=None, help="the rows, appended to the file's")
    args = ap.parse_args()
    build, shape_args = MODELS[args.model]
    proto = build()
    shapes = parse_shapes(shape_args)
    feeds = _feeds(import_onnx(proto, shapes or None), None)
    sessions = {}
    for fusion in args.fusion.split(","):
        for i in range(args.sessions):
            rewrite = args.rewrite and i % 2 == 1
            name = f"{fusion} {i + 1}{' (rewritten)' if rewrite else ''}"
            start = time.perf_counter()
            sessions[name] = kg.compile_model(proto, backend=args.backend, fusion=fusion,
                                              input_shapes=shapes or None, rewrite=rewrite)
            print(f"{name}: compiled in {time.perf_counter() - start:.2f} s, "
                  f"{len(sessions[name].plan.launches)} launches", flush=True)
    outputs = [s.run(None, feeds) for s in sessions.values()]
    for got in outputs[1:]:
        for a, b in zip(outputs[0], got):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    runs = {name: partial(session.run, None, feeds) for name, session in sessions.items()}
    ort = _ort_session(proto, optimise=True, threads=2)
    apart = {}
    if ort is not None:
        apart["onnxruntime"] = partial(ort.run, None, dict(feeds))
        for a, b in zip(outputs[0], apart["onnxruntime"]()):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    if args.onnxruntime_in_rounds:
        runs.update(apart)
        apart = {}
    times = round_robin(runs, warmup=1, repeat=args.rounds, apart=apart, blocks=5)
    ort_ms = float(np.median(times["onnxruntime"])) if ort is not None else None
    rows = []
    for name, ts in times.items():
        ms, p20, p80 = (float(np.percentile(ts, q)) for q in (50, 20, 80))
        ratio = f", onnxruntime / this {ort_ms / ms:.2f}" if ort_ms else ""
        print(f"{name}: {ms:.3f} ms (p20 {p20:.3f}, p80 {p80:.3f}){ratio}")
        launches = len(sessions[name].plan.launches) if name in sessions else None
        rows.append({"model": args.model, "backend": args.backend, "session": name,
                     "launches": launches, "ms": round(ms, 4), "p20": round(p20, 4),
                     "p80": round(p80, 4),
                     "onnxruntime": "in the rounds" if args.onnxruntime_in_rounds else "apart",
                     "onnxruntime_over_this": round(ort_ms / ms, 3) if ort_ms else None})
    if args.json is not None and args.json.exists():
        rows = json.loads(args.json.read_text())["rows"] + rows
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
