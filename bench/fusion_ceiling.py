"""How much faster than one kernel per operator any fusion could make a model that keeps its
contractions' kernels: the unfused plan's launches timed one by one (``Session.profile``:
device time), split into those that run a contraction (Conv, ConvTranspose, MatMul, Gemm)
and the rest, beside whole runs of the unfused and the DNNFusion plan.

If fusion removed every launch that runs no contraction, with its memory traffic and launch
cost, and the contractions cost what they cost unfused, a run would take the contractions'
summed time: the unfused run over that sum is the most fusion alone can gain (the ceiling).
DNNFusion's achieved gain is printed beside it, and its own launches' time split the same
way (its contraction kernels carry the fused epilogues).

    python bench/fusion_ceiling.py [--models squeezenet,bert_layer] [--backend opencl] \\
        [--rounds 20] [--json bench/results/fusion-ceiling.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from whole_models import DEFAULT, MODELS  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.cli.model import parse_shapes  # noqa: E402
from kernelgen.graph import Profile  # noqa: E402

CONTRACTIONS = ("Conv(", "ConvTranspose(", "MatMul(", "Gemm(")


def _split(prof: Profile) -> tuple[float, float, int]:
    """(ms in launches that run a contraction, ms in the others, count of the others)."""
    heavy: list[float] = []
    light: list[float] = []
    for t in prof.launches:
        (heavy if any(o.startswith(CONTRACTIONS) for o in t.ops) else light).append(t.ms)
    return sum(heavy), sum(light), len(light)


def ceiling(name: str, backend: str, rounds: int) -> dict:
    build, shapes = MODELS[name]
    graph = kg.import_onnx(build(), parse_shapes(shapes))
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype.numpy) if v.dtype.is_float
             else np.ones(v.shape, v.dtype.numpy) for v in graph.inputs}
    sessions = {f: kg.compile_model(graph, backend=backend, fusion=f)
                for f in ("none", "dnnfusion")}
    profiles = {f: s.profile(feeds, rounds=rounds) for f, s in sessions.items()}
    runs: dict[str, list[float]] = {f: [] for f in sessions}
    for _ in range(3):  # whole runs again, the two plans alternating
        for f, p in ((f, s.profile(feeds, rounds=max(rounds // 4, 3)))
                     for f, s in sessions.items()):
            runs[f].append(p.run_ms)
    run = {f: statistics.median([profiles[f].run_ms, *runs[f]]) for f in sessions}
    heavy, light, n_light = _split(profiles["none"])
    fused_heavy, fused_light, fused_n_light = _split(profiles["dnnfusion"])
    row = {"model": name, "backend": backend, "none_ms": round(run["none"], 4),
           "dnnfusion_ms": round(run["dnnfusion"], 4),
           "none_contraction_ms": round(heavy, 4), "none_other_ms": round(light, 4),
           "none_launches": len(profiles["none"].launches), "none_other_launches": n_light,
           "dnnfusion_contraction_ms": round(fused_heavy, 4),
           "dnnfusion_other_ms": round(fused_light, 4),
           "dnnfusion_launches": len(profiles["dnnfusion"].launches),
           "dnnfusion_other_launches": fused_n_light,
           "ceiling": round(run["none"] / heavy, 3) if heavy else None,
           "achieved": round(run["none"] / run["dnnfusion"], 3)}
    print(f"{name} on {backend}: none {run['none']:.3f} ms ({row['none_launches']} launches: "
          f"contractions {heavy:.3f} ms, {n_light} others {light:.3f} ms); dnnfusion "
          f"{run['dnnfusion']:.3f} ms ({row['dnnfusion_launches']} launches: contractions "
          f"{fused_heavy:.3f} ms, {fused_n_light} others {fused_light:.3f} ms); most fusion "
          f"can gain {row['ceiling']}x, DNNFusion gained {row['achieved']}x", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT), help=f"of {', '.join(MODELS)}")
    ap.add_argument("--backend", default="opencl")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    unknown = [n for n in args.models.split(",") if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    rows = [ceiling(m, args.backend, args.rounds) for m in args.models.split(",")]
    if args.json:
        args.json.write_text(json.dumps({"command": "python " + " ".join(sys.argv),
                                         "machine": platform.processor() or platform.machine(),
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
