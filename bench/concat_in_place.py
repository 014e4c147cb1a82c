"""In-place Concats against Concat blocks, one process: the DNNFusion plan of each model
compiled twice, once as planned (each Concat whose parts are contiguous assembled in place by
its inputs' kernels) and once with no Concat in place (the Concat fused with the branches'
last operators into a copy kernel, as before), then whole runs of both, round-robin
(``scheduling.whole_runs``, 15 rounds, median ms).

    python bench/concat_in_place.py [--models squeezenet,inception_v1] [--backend opencl]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from models.model_zoo import light  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.graph import dnnfusion  # noqa: E402
from kernelgen.graph.scheduling import whole_runs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="squeezenet,inception_v1")
    ap.add_argument("--backend", default="opencl")
    args = ap.parse_args()
    for name in args.models.split(","):
        proto = light(name)
        on = kg.compile_model(proto, backend=args.backend, fusion="dnnfusion")
        planned = dnnfusion.in_place_concats
        dnnfusion.in_place_concats = lambda graph: []  # type: ignore[assignment]
        try:
            off = kg.compile_model(proto, backend=args.backend, fusion="dnnfusion")
        finally:
            dnnfusion.in_place_concats = planned
        ms = whole_runs({"in place": on.model, "concat blocks": off.model}, rounds=15)
        print(f"{name} on {args.backend}: in place {ms['in place']:.3f} ms "
              f"({len(on.plan.launches)} launches), concat blocks {ms['concat blocks']:.3f} ms "
              f"({len(off.plan.launches)} launches): {ms['concat blocks'] / ms['in place']:.2f}x")


if __name__ == "__main__":
    main()
