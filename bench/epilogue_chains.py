"""Elementwise chains as the contraction's epilogue, one process: each model's DNNFusion plan
compiled twice, once as planned (a chain that a contraction feeds, directly or through
elementwise operators nothing else reads, is its epilogue: BERT's GELU after the first
feed-forward MatMul's bias Add and Erf, the ReLU after a convolution's BatchNormalization) and
once with only directly fed chains given to the contraction
(``dnnfusion.EPILOGUE_THROUGH_ELEMENTWISE`` off, the rule before), then whole runs of both,
round-robin (``scheduling.whole_runs``, median ms).

    python bench/epilogue_chains.py [--models bert_layer,mobilenet_v2,resnet50] [--rounds 25]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from models.model_zoo import bert_layer, light, mobilenet_v2  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.graph import dnnfusion  # noqa: E402
from kernelgen.graph.scheduling import whole_runs  # noqa: E402

BUILT = {  # the models the tests build with onnx.helper, at the sizes of bench/whole_models.py
    "bert_layer": (lambda: bert_layer(hidden=256, heads=4),
                   {"x": (1, 128, 256), "mask": (1, 128)}),
    "mobilenet_v2": (mobilenet_v2, None),
}


def _names(session: kg.Session) -> set[tuple[str, ...]]:
    return {tuple(op.name for op in block.ops) for block in session.blocks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert_layer,mobilenet_v2,resnet50")
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args()
    for name in args.models.split(","):
        build, shapes = BUILT.get(name, (lambda name=name: light(name), None))
        proto = build()
        now = kg.compile_model(proto, backend="opencl", fusion="dnnfusion", input_shapes=shapes)
        dnnfusion.EPILOGUE_THROUGH_ELEMENTWISE = False
        try:
            before = kg.compile_model(proto, backend="opencl", fusion="dnnfusion",
                                      input_shapes=shapes)
        finally:
            dnnfusion.EPILOGUE_THROUGH_ELEMENTWISE = True
        moved = len(_names(now) - _names(before))
        ms = whole_runs({"now": now.model, "before": before.model}, rounds=args.rounds)
        print(f"{name} on opencl: chains through elementwise operators {ms['now']:.3f} ms, "
              f"directly fed only {ms['before']:.3f} ms ({moved} of {len(now.blocks)} blocks "
              f"differ): {ms['before'] / ms['now']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
