"""IOS schedules on multi-branch models: the latency of the sequential, greedy and IOS schedules
of the same DNNFusion blocks, on OpenCL and NEON C, in one run; and IOS's search time for two
pruning settings (r = blocks per group, s = groups per stage).

Models: onnx's light Inception v1 and v2 and SqueezeNet (random weights, 224x224), one
Inception module (GoogLeNet's 3a: 192 channels at 28x28, four branches) and a RandWire-style
random graph (12 nodes, each a weighted sum of its predecessors, ReLU and a separable 3x3
convolution, 32 channels at 28x28), both built with ``onnx.helper``.

For each model and backend: compile once (sequential), search each pruning setting with an
empty Fast-Run database (so the search time includes measuring every stage it prices), then
compile each schedule and time whole runs (``session.run``, inputs copied in and outputs out)
in interleaved rounds, median per schedule.

    python bench/schedules.py [--models inception_module,squeezenet] [--backends opencl,neon] \\
        [--rounds 7] [--json bench/results/schedules.json]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from models.model_zoo import light  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.fastrun import FastRunDB  # noqa: E402
from kernelgen.graph import import_onnx  # noqa: E402
from kernelgen.graph.executor import compile_plan  # noqa: E402
from kernelgen.graph.scheduling import schedule_model  # noqa: E402

PRUNING = ((1, 3), (3, 8))  # (r, s): IOS's README compares these two


class _Builder:
    """A small ONNX graph under construction: convolutions with random He-normal weights."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def _name(self, base: str) -> str:
        return f"{base}_{len(self.nodes)}"

    def conv(self, x: str, cin: int, cout: int, k: int, group: int = 1, relu: bool = True
             ) -> str:
        w = self.rng.standard_normal((cout, cin // group, k, k)).astype(np.float32)
        w *= np.sqrt(2.0 / (cin // group * k * k))
        wn, bn = self._name("w"), self._name("b")
        self.inits += [numpy_helper.from_array(w, wn),
                       numpy_helper.from_array(np.zeros(cout, np.float32), bn)]
        y = self._name("conv")
        p = k // 2
        self.nodes.append(helper.make_node("Conv", [x, wn, bn], [y], kernel_shape=[k, k],
                                           pads=[p, p, p, p], group=group))
        return self.op("Relu", [y]) if relu else y

    def op(self, kind: str, inputs: list[str], **attrs: Any) -> str:
        y = self._name(kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [y], **attrs))
        return y

    def model(self, name: str, x: str, shape: list[int], y: str, out: list[int]
              ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, out)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def inception_module() -> onnx.ModelProto:
    """GoogLeNet's inception (3a): 192 channels at 28x28 into 64 + 128 + 32 + 32."""
    b = _Builder(0)
    x = "x"
    one = b.conv(x, 192, 64, 1)
    three = b.conv(b.conv(x, 192, 96, 1), 96, 128, 3)
    five = b.conv(b.conv(x, 192, 16, 1), 16, 32, 5)
    pool = b.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    proj = b.conv(pool, 192, 32, 1)
    y = b.op("Concat", [one, three, five, proj], axis=1)
    return b.model("inception_3a", x, [1, 192, 28, 28], y, [1, 256, 28, 28])


def randwire(nodes: int = 12, channels: int = 32, size: int = 28, seed: int = 1
             ) -> onnx.ModelProto:
    """A RandWire-style random DAG: node i reads each earlier node with probability 0.3 (the
    input where none), sums them with weights, then ReLU and a separable 3x3 convolution;
    the sinks are averaged."""
    rng = random.Random(seed)
    b = _Builder(seed)
    x = b.conv("x", 3, channels, 3)
    outs: list[str] = []
    used: set[int] = set()
    for i in range(nodes):
        preds = [j for j in range(i) if rng.random() < 0.3]
        used.update(preds)
        if not preds:
            agg = x
        else:
            terms = []
            for j in preds:
                scale = f"s{i}_{j}"
                b.inits.append(numpy_helper.from_array(
                    np.array(rng.uniform(0.5, 1.0), np.float32), scale))
                terms.append(b.op("Mul", [outs[j], scale]))
            agg = terms[0]
            for t in terms[1:]:
                agg = b.op("Add", [agg, t])
        h = b.op("Relu", [agg])
        h = b.conv(h, channels, channels, 3, group=channels, relu=False)
        outs.append(b.conv(h, channels, channels, 1, relu=False))
    sinks = [outs[i] for i in range(nodes) if i not in used]
    y = sinks[0]
    for s in sinks[1:]:
        y = b.op("Add", [y, s])
    return b.model("randwire", "x", [1, 3, size, size], y, [1, channels, size, size])


MODELS = {
    "inception_module": inception_module,
    "randwire": randwire,
    "squeezenet": lambda: light("squeezenet"),
    "inception_v1": lambda: light("inception_v1"),
    "inception_v2": lambda: light("inception_v2"),
}


def bench(name: str, backend: str, rounds: int) -> dict[str, Any]:
    graph = import_onnx(MODELS[name]())
    start = time.perf_counter()
    session = kg.compile_model(graph, backend=backend, fusion="dnnfusion")
    compile_s = time.perf_counter() - start
    x = graph.inputs[0]
    feeds = {x.name: np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)}
    searches, report = [], None
    for r, s in PRUNING:
        with tempfile.TemporaryDirectory(prefix="kg-ios-db-") as tmp:
            start = time.perf_counter()
            report = schedule_model(graph, session.blocks, session.model, r=r, s=s,
                                    db=FastRunDB(Path(tmp) / "fastrun.sqlite"))
            searches.append({"r": r, "s": s, "search_s": time.perf_counter() - start,
                             "measured_stages": report.measured,
                             "ios_stages": len(report.schedules["ios"].stages),
                             "ios_estimate_ms": report.schedules["ios"].latency_ms})
    assert report is not None  # the last search, r=3 s=8: the schedules timed below
    models = {}
    want = session.model.run(feeds)
    for sched in report.schedules.values():
        g, blocks, stages = report.applied(graph, session.blocks, sched.name)
        models[sched.name] = compile_plan(g, blocks, backend, schedule=stages)
        got = models[sched.name].run(feeds)
        err = max(float(np.abs(got[k] - want[k]).max()) for k in want)
        assert err <= 1e-4 * max(float(np.abs(w).max()) for w in want.values()), (name, err)
    samples: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(rounds):  # interleaved, so that drift on a shared machine hits all alike
        for k, m in models.items():
            m.run(feeds)
            start = time.perf_counter()
            m.run(feeds)
            samples[k].append((time.perf_counter() - start) * 1e3)
    ms = {k: statistics.median(v) for k, v in samples.items()}
    row = {"model": name, "backend": backend, "device": kg.backends.get(backend).device_identity(),
           "blocks": len(session.blocks),
           "compile_s": compile_s, "latency_ms": ms,
           "estimate_ms": {k: s.latency_ms for k, s in report.schedules.items()},
           "stages": {k: len(s.stages) for k, s in report.schedules.items()},
           "merges": sum(st.strategy == "merge" for st in report.schedules["ios"].stages),
           "concurrent_stages": sum(len(st.groups) > 1
                                    for st in report.schedules["ios"].stages),
           "ios_over_sequential": ms["sequential"] / ms["ios"], "search": searches}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--backends", default="opencl,neon")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=str(HERE / "results" / "schedules.json"))
    args = ap.parse_args()
    rows = []
    print(f"{'model':18s} {'backend':8s} {'blocks':>6s} {'sequential':>10s} {'greedy':>8s} "
          f"{'ios':>8s} {'ios/seq':>7s} {'merges':>6s} {'conc.':>5s} {'search r1s3':>11s} "
          f"{'search r3s8':>11s}")
    for name in args.models.split(","):
        for backend in args.backends.split(","):
            row = bench(name, backend, args.rounds)
            rows.append(row)
            ms = row["latency_ms"]
            print(f"{name:18s} {backend:8s} {row['blocks']:6d} {ms['sequential']:10.3f} "
                  f"{ms['greedy']:8.3f} {ms['ios']:8.3f} {row['ios_over_sequential']:7.2f} "
                  f"{row['merges']:6d} {row['concurrent_stages']:5d} "
                  f"{row['search'][0]['search_s']:10.1f}s {row['search'][1]['search_s']:10.1f}s",
                  flush=True)
    Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows},
                                          indent=1))
    print(f"written {args.json}")


if __name__ == "__main__":
    main()
