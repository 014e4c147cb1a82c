"""Every MaxPool of ResNet-50, SqueezeNet 1.1, ShuffleNet and Inception v1 (GoogLeNet) at
224x224, and DenseNet-121's transition AveragePools, on OpenCL: the default kernel (a pooling
window, ``backends/opencl/window.py``, on a CPU) round-robin with the 'item' schedule it
replaced and a copy of the input (the bandwidth a pool that reads its input once could reach)
and the window with each rows-per-item choice, against onnxruntime (2 threads) timed right
before and after. Each output is checked against onnxruntime's.

    python bench/pooling.py [--repeat 100] [--only AveragePool] [--json bench/results/pooling.json]

With ``--models squeezenet,inception_v1``, instead: each model's DNNFusion plan compiled twice
in one process, with its MaxPools as pooling windows (the default) and as 'item' kernels (the
windows' recogniser switched off), then whole runs of both round-robin
(``scheduling.whole_runs``, 15 rounds, median ms).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ContextManager

import numpy as np
from onnx import helper

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.opencl import window
from kernelgen.compile import copy_kernel
from kernelgen.graph.scheduling import whole_runs
from kernelgen.measure import bench_interleaved

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conv import time_ort  # noqa: E402
from models.model_zoo import light  # noqa: E402
from patterns import Pattern, ort_runner  # noqa: E402

# (channels, input side, kernel, stride, pad, ceil_mode, model[, op])
POOLS: tuple[tuple, ...] = (
    (64, 112, 3, 2, 1, 0, "ResNet-50"),
    (64, 111, 3, 2, 0, 0, "SqueezeNet 1.1"), (128, 55, 3, 2, 0, 0, "SqueezeNet 1.1"),
    (256, 27, 3, 2, 0, 0, "SqueezeNet 1.1"),
    (24, 112, 3, 2, 1, 0, "ShuffleNet"),
    (64, 112, 3, 2, 0, 1, "Inception v1"), (192, 56, 3, 2, 0, 1, "Inception v1"),
    (192, 28, 3, 1, 1, 0, "Inception v1"), (256, 28, 3, 1, 1, 0, "Inception v1"),
    (480, 28, 3, 2, 0, 1, "Inception v1"), (480, 14, 3, 1, 1, 0, "Inception v1"),
    (512, 14, 3, 1, 1, 0, "Inception v1"), (528, 14, 3, 1, 1, 0, "Inception v1"),
    (832, 14, 2, 2, 0, 1, "Inception v1"), (832, 7, 3, 1, 1, 0, "Inception v1"),
    (128, 56, 2, 2, 0, 0, "DenseNet-121", "AveragePool"),
    (256, 28, 2, 2, 0, 0, "DenseNet-121", "AveragePool"),
    (512, 14, 2, 2, 0, 0, "DenseNet-121", "AveragePool"),
)


def row(c: int, side: int, k: int, stride: int, pad: int, ceil: int, model: str,
        op: str = "MaxPool", *, repeat: int, rng: np.random.Generator) -> dict[str, object]:
    shape = (1, c, side, side)
    attrs = {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [pad] * 4,
             "ceil_mode": ceil}
    x = rng.standard_normal(shape).astype(np.float32)
    pool = (kg.max_pool if op == "MaxPool" else kg.average_pool)(kg.tensor("x", shape), **attrs)
    ort_run, ref = ort_runner(Pattern(op.lower(), op, [helper.make_node(
        op, ["x"], ["y"], **attrs)], [pool], {"x": x}, "y"))
    fused = kg.fuse(pool)
    kernels = {"default": fused.emit("opencl", tuning="none"),
               "item": fused.emit("opencl", tuning="none", schedule="item")}
    plan = window.opencl_window(fused.lower(), backends.get("opencl").caps.vector_widths)
    for rows in plan.row_choices if plan is not None else ():
        kernels[f"{rows} rows"] = fused.emit("opencl", tuning="none", schedule="window",
                                             window_rows=rows)
    for kernel in kernels.values():  # a max is exact; a mean's sums may round in another order
        np.testing.assert_allclose(kernel(x), ref, rtol=1e-6 if op == "MaxPool" else 1e-5)
    times, ort_ms = time_with_copy_and_ort(kernels, x, ort_run, repeat)
    default = kernels["default"].metadata["tunables"]
    return {"pool": f"{'' if op == 'MaxPool' else 'avg '}{k}x{k}/{stride} {c}x{side}x{side}"
            + (f" pad {pad}" if pad else "")
            + (" ceil" if ceil else ""), "model": model, "onnxruntime_ms": ort_ms,
            "ms": times, "schedule": default["schedule"],
            "window_rows": default.get("window_rows"),
            "default_vs_ort": ort_ms / times["default"],
            "item_over_default": times["item"] / times["default"],
            "copy_over_default": times["copy of the input"] / times["default"]}


def time_with_copy_and_ort(kernels: dict[str, Any], x: np.ndarray, ort_run: Callable[[], None],
                           repeat: int) -> tuple[dict[str, float], float]:
    """Median ms of each OpenCL kernel of ``x`` and of a copy of ``x`` ('copy of the input'),
    launched round-robin, and onnxruntime's median over runs right before and after them."""
    timed = {name: (kernel, [x]) for name, kernel in kernels.items()}
    timed["copy of the input"] = (copy_kernel(x.shape, backend="opencl"), [x])
    before = time_ort(ort_run, repeat)
    times = {name: t.median_ms for name, t in bench_interleaved(timed, 3, repeat).items()}
    return times, float(np.median(before + time_ort(ort_run, repeat)))


def plans_with_and_without(names: list[str], labels: tuple[str, str],
                           switched_off: Callable[[], ContextManager[object]]) -> None:
    """Each light model's DNNFusion plan, as it is and switched off (``both_ways``), printed
    with the gain."""
    for name in names:
        print(gain_line(name, both_ways(light(name), labels, switched_off), labels),
              flush=True)


def both_ways(proto: Any, labels: tuple[str, str],
              switched_off: Callable[[], ContextManager[object]],
              shapes: dict[str, tuple[int, ...]] | None = None, rounds: int = 15
              ) -> dict[str, float]:
    """``proto``'s DNNFusion plan compiled as it is (``labels[0]``) and inside
    ``switched_off()`` (``labels[1]``) in one process, whole runs of both round-robin
    (``rounds``, median ms by label)."""
    on = kg.compile_model(proto, backend="opencl", fusion="dnnfusion", input_shapes=shapes)
    with switched_off():
        off = kg.compile_model(proto, backend="opencl", fusion="dnnfusion", input_shapes=shapes)
    return whole_runs({labels[0]: on.model, labels[1]: off.model}, rounds=rounds)


def gain_line(name: str, ms: dict[str, float], labels: tuple[str, str]) -> str:
    """``name``: both medians and the first's gain over the second."""
    on, off = labels
    return (f"{name}: {on} {ms[on]:.3f} ms, {off} {ms[off]:.3f} ms: "
            f"{ms[off] / ms[on]:.2f}x")


def compared_row(name: str, runs: dict[str, Callable[[], object]], labels: tuple[str, str],
                 rounds: int, timer: Any) -> dict[str, object]:
    """The two ``runs`` (keyed by ``labels``) timed round-robin over ``rounds`` by
    ``timer.timed`` (their kernels' device ms, ``wide_tiles.DeviceTimes``): the medians,
    printed by ``gain_line``, as a table row with the first's gain over the second."""
    times: dict[str, list[float]] = {label: [] for label in labels}
    for _ in range(rounds):
        for label in labels:
            times[label].append(timer.timed(runs[label]))
    ms = {label: float(np.median(t)) for label, t in times.items()}
    print(gain_line(name, ms, labels), flush=True)
    return {"block": name, **{f"{k}_ms": v for k, v in ms.items()},
            "gain": ms[labels[1]] / ms[labels[0]]}


def write_rows(path: Path | None, rows: list[dict[str, object]]) -> None:
    """The table's rows and the command that measured them as JSON at ``path`` (if given)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "rows": rows},
                                   indent=1) + "\n")


@contextlib.contextmanager
def _item_pools() -> Iterator[None]:
    """The pooling-window recogniser switched off: pools run as 'item' kernels."""
    recognise = window.pooling
    window.pooling = lambda kernel: None  # type: ignore[assignment]
    window.opencl_window.cache_clear()
    try:
        yield
    finally:
        window.pooling = recognise
        window.opencl_window.cache_clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", default=None, help="the pools of this op type or model only")
    ap.add_argument("--models", default=None,
                    help="comma-separated light models (squeezenet, inception_v1, resnet50)")
    args = ap.parse_args()
    if args.models:
        plans_with_and_without(args.models.split(","), ("MaxPools as windows", "as 'item'"),
                               _item_pools)
        return 0
    rng = np.random.default_rng(0)
    print(f"{'pool':28s} {'model':15s} {'ORT ms':>7s} {'default':>8s} {'item':>7s} "
          f"{'copy':>7s} {'vs ORT':>7s} {'item/def':>8s}")
    rows = []
    for shape in POOLS:
        model, op = (*shape[6:], "MaxPool")[:2]
        if args.only and args.only not in (model, op):
            continue
        r = row(*shape, repeat=args.repeat, rng=rng)
        rows.append(r)
        ms = r["ms"]
        print(f"{r['pool']:28s} {r['model']:15s} {r['onnxruntime_ms']:7.3f} "
              f"{ms['default']:8.3f} {ms['item']:7.3f} {ms['copy of the input']:7.3f} "
              f"{r['default_vs_ort']:6.2f}x {r['item_over_default']:7.2f}x  "
              + " ".join(f"{k} {v:.3f}" for k, v in ms.items() if k.endswith("rows")),
              flush=True)
    ratios = [r["item_over_default"] for r in rows]
    print(f"geometric mean, item / default: {float(np.exp(np.mean(np.log(ratios)))):.2f}x; "
          f"default vs onnxruntime: "
          f"{float(np.exp(np.mean(np.log([r['default_vs_ort'] for r in rows])))):.2f}x")
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
