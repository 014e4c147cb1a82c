"""AGO's intensive fusion in the DNNFusion planner, measured on a model: the model planned with
``tuning='measure-fusion'`` into a fresh Fast-Run database (every yellow cell and every
intensive pair timed fused against split, launched and waited for alone), each pair's verdict
listed, and then the plan as measured timed against the same plan with its intensive pairs
kept apart (its yellow cells decided alike), whole runs round-robin in one process (medians
in ms).

    python bench/intensive_plans.py [--model mobilenet_v2] [--backend neon] [--rounds 200] \\
        [--json FILE]
"""
from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling import write_rows  # noqa: E402
from whole_models import MODELS  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.cli.model import _feeds, parse_shapes  # noqa: E402
from kernelgen.compile import Stored  # noqa: E402
from kernelgen.fastrun import FastRunDB  # noqa: E402
from kernelgen.graph import import_onnx  # noqa: E402
from kernelgen.graph.dnnfusion import plan_dnnfusion  # noqa: E402
from kernelgen.graph.intensive import INTENSIVE  # noqa: E402
from kernelgen.measure import round_robin  # noqa: E402
from kernelgen.measure_fusion import fusion_verdict  # noqa: E402
from kernelgen.tune import MeasureFusion  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet_v2", choices=sorted(MODELS))
    ap.add_argument("--backend", default="opencl")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    build, shape_args = MODELS[args.model]
    proto, shapes = build(), parse_shapes(shape_args) or None
    with tempfile.TemporaryDirectory() as tmp:
        db = FastRunDB(Path(tmp) / "fastrun.sqlite")
        measured = kg.compile_model(proto, backend=args.backend, fusion="dnnfusion",
                                    input_shapes=shapes, tuning=MeasureFusion(db))

        def yellow_only(block: kg.FusedBlock):  # the stored verdicts, no intensive pair
            return None if block.forced else fusion_verdict(block, args.backend, Stored(db))

        apart = kg.compile_model(proto, backend=args.backend, input_shapes=shapes,
                                 fusion=functools.partial(plan_dnnfusion, decide=yellow_only))
    rows: list[dict[str, object]] = []
    for block in measured.blocks:
        for stop in block.stops:  # a pair's reason follows the rule that stopped its edge
            why = stop.rule[stop.rule.rfind(INTENSIVE):]
            if INTENSIVE in stop.rule and "relaxes this cell" not in why:
                print(f"apart  {stop.producer} -> {stop.consumer}: {why}")
                rows.append({"pair": [stop.producer, stop.consumer], "merged": False,
                             "why": why})
        if f"{INTENSIVE}, measured" in block.note:
            why = block.note[block.note.rfind(INTENSIVE):]
            print(f"merged {' + '.join(block.names)}: {why}")
            rows.append({"pair": list(block.names), "merged": True, "why": why})
    feeds = _feeds(import_onnx(proto, shapes), None)
    for a, b in zip(measured.run(None, feeds), apart.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    sessions = {"as measured": measured, "intensive pairs apart": apart}
    times = round_robin({name: functools.partial(s.run, None, feeds)
                         for name, s in sessions.items()}, warmup=5, repeat=args.rounds)
    for name, ts in times.items():
        ms, p20, p80 = (float(np.percentile(ts, q)) for q in (50, 20, 80))
        launches = len(sessions[name].plan.launches)
        print(f"{name}: {launches} launches, {ms:.3f} ms (p20 {p20:.3f}, p80 {p80:.3f})")
        rows.append({"model": args.model, "backend": args.backend, "plan": name,
                     "launches": launches, "ms": round(ms, 4), "p20": round(p20, 4),
                     "p80": round(p80, 4)})
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
