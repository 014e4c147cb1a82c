"""A compiled model's launches timed one by one (each launch, then a wait for the device), per
planner: where a plan's time goes, and how much of a model's latency is launches overlapping
in the queue (the model's own run waits once, at the end).

    python bench/model_launches.py [--model mobilenet_v2] [--backend opencl] [--repeat 5] \
        [--planners none,tvm,dnnfusion] [--top 5]

prints, per planner, the sum of the launches' median times and the slowest launches.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from models.model_zoo import bert_layer, light, mobilenet_v2  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.exec.program import Program  # noqa: E402
from kernelgen.graph.planners import PLANNERS  # noqa: E402

MODELS = {  # name: (model, input shapes)
    "mobilenet_v2": (lambda: mobilenet_v2(size=112), None),
    "bert_layer": (lambda: bert_layer(hidden=256, heads=4), {"x": (1, 128, 256),
                                                             "mask": (1, 128)}),
    "squeezenet": (lambda: light("squeezenet"), None),
    "inception_v1": (lambda: light("inception_v1"), None),
    "shufflenet": (lambda: light("shufflenet"), None),
}


def launches(session: kg.Session, feeds: dict[str, np.ndarray], repeat: int
             ) -> list[tuple[float, str]]:
    """(median seconds, kernel name with its output shapes and schedule) of each launch of the
    session's plan, in plan order."""
    model = session.model
    handles = model.bind(feeds)
    times: list[list[float]] = [[] for _ in model.plan.launches]
    for _ in range(repeat):
        for k, launch in enumerate(model.plan.launches):
            start = time.perf_counter()
            model.executables[launch.kernel].launch(*(handles[a] for a in launch.args),
                                                    wait=False)
            if model.runtime is not None:
                model.runtime.sync()
            times[k].append(time.perf_counter() - start)
    return [(statistics.median(t), _described(model.executables[launch.kernel]))
            for t, launch in zip(times, model.plan.launches)]


def _described(exe: kg.Kernel | Program) -> str:
    """The name, output shapes and schedule of each kernel of ``exe``."""
    kernels = exe.kernels if isinstance(exe, Program) else (exe,)
    return " + ".join(
        f"{k.name} ({', '.join('x'.join(map(str, b.shape)) for b in k.loop.outputs)}; "
        f"{k.metadata.get('schedule', '-')})" for k in kernels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet_v2", choices=sorted(MODELS))
    ap.add_argument("--backend", default="opencl")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--planners", default=",".join(PLANNERS))
    ap.add_argument("--top", type=int, default=5, help="how many of the slowest launches to print")
    args = ap.parse_args()
    make, shapes = MODELS[args.model]
    proto = make()
    graph = kg.import_onnx(proto, shapes)
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype.numpy) if v.dtype.is_float
             else np.ones(v.shape, v.dtype.numpy) for v in graph.inputs}
    for fusion in args.planners.split(","):
        session = kg.compile_model(proto, backend=args.backend, fusion=fusion,
                                   input_shapes=shapes)
        timed = launches(session, feeds, args.repeat)
        print(f"{args.model} on {args.backend}, {fusion}: {len(timed)} launches, "
              f"{sum(t for t, _ in timed) * 1e3:.3f} ms launch by launch")
        for t, name in sorted(timed, reverse=True)[:args.top]:
            print(f"  {t * 1e3:8.3f} ms  {name}")


if __name__ == "__main__":
    main()
