"""``python -m kernelgen run|plan|emit|bench|devices``.

- ``run MODEL.onnx``: compile a model, check it against onnxruntime on random (or ``--inputs``)
  inputs and time it; ``run`` alone runs the bundled MobileNetV2 stack.
- ``plan MODEL.onnx``: the fusion report (``--json``).
- ``emit MODEL.onnx -o DIR``: every kernel's source, the launch order, the buffers and the
  constants as files with one manifest.json.
- ``bench MODEL.onnx``: every planner with and without the rewrites, timed beside onnxruntime.
- ``run CHAIN.json``: fuse a chain of operators, show the mapping types, the fusion decisions
  and the generated source, check the fused kernel against the unfused one, and time fused vs
  unfused.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .. import backends
from ..api import fuse
from ..backends.opencl import runtime as opencl_runtime
from ..compile import unfused
from ..errors import KernelgenError
from ..graph.chain import split_blocks
from ..graph.planners import PLANNERS
from ..measure import bench, pipeline_io
from ..version import __version__
from .chain import load_chain
from .model import DEFAULT_MODEL, bench_command, emit_model, parse_shapes, plan_model, run_model


def run(path: str, force: bool, repeat: int, backend: str = backends.DEFAULT) -> int:
    """Fuse the chain, show the mapping types, the fusion decisions and the generated source,
    check the fused kernel against the unfused ones and time both."""
    chain = load_chain(path)
    print(f"chain: {path}\n  {chain.description}\n")
    print("operators and mapping types:")
    for op in chain.ops:
        print(f"  {op.name:<10} {op.kind:<10} {str(op.shape):<18} {op.mapping_type}")
    fused = fuse(*chain.ops, force=force)
    print("\nfusion decisions (DNNFusion Table 3):")
    for line in fused.report().splitlines():
        print("  " + line)
    kernel = fused.emit(backend)
    print(f"\ngenerated {backend} source ({kernel.metadata['schedule']} schedule, launch "
          f"{kernel.metadata['launch']}):\n")
    print(kernel.source)

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(v.shape).astype(v.dtype.numpy) for v in chain.inputs]
    by_name = dict(zip((v.name for v in chain.inputs), arrays))
    separate = unfused(chain.ops, backend)
    values = dict(by_name)
    for k in separate:
        values[k.loop.outputs[0].name] = np.asarray(k(*(values[b.name] for b in k.loop.inputs)))
    got = np.asarray(kernel(*(by_name[v.name] for v in fused.inputs)))
    err = float(np.max(np.abs(got - values[chain.ops[-1].name])))
    print(f"max |fused - unfused| = {err:.3g}")

    plans = {"all fused": [chain.ops]} if not fused.needs_measurement else {
        "all fused (yellow edges fused)": [chain.ops],
        "green edges only": split_blocks(chain.ops),
    }
    plans["unfused"] = [[op] for op in chain.ops]
    print(f"\ntimings (medians of {repeat} runs, device-resident buffers, "
          f"{kernel.metadata['backend']}):")
    results = {}
    for label, blocks in plans.items():
        kernels = [fuse(*b, force=force).emit_kernel(backend) for b in blocks]
        chain_inputs, _ = pipeline_io(kernels)
        results[label] = bench(kernels, *(by_name[b.name] for b in chain_inputs), repeat=repeat)
        print(f"  {label:<32} {len(kernels)} kernel(s)  {results[label]}")
    best = min(results, key=lambda k: results[k].median_ms)
    base = results["unfused"].median_ms
    print(f"fastest: {best}, {base / results[best].median_ms:.2f}x the unfused chain "
          f"(load average {results[best].loadavg:.2f})")
    return 0 if err < 1e-4 else 1


def devices() -> int:
    """List the OpenCL devices this process sees and what kernels are generated for on the one
    kernelgen uses (``KERNELGEN_OPENCL_DEVICE`` chooses another)."""
    found = opencl_runtime.list_devices()
    print("OpenCL devices (KERNELGEN_OPENCL_DEVICE=<part of a name> picks one):")
    for name in found or ["none found"]:
        print(f"  {name}")
    if found:
        print(f"\nkernelgen uses: {opencl_runtime.device().info.describe()}")
    return 0


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _model_options(parser: argparse.ArgumentParser, backend: bool = True,
                   fusion: str | None = "dnnfusion") -> None:
    """The options the model commands share."""
    if backend:
        parser.add_argument("--backend", default=backends.DEFAULT, choices=backends.names(),
                            help=f"where the kernels run (default: {backends.DEFAULT}); triton "
                                 "needs a CUDA GPU or TRITON_INTERPRET=1 (slow)")
    parser.add_argument("--fusion", default=fusion, choices=sorted(PLANNERS),
                        help="the fusion planner for an ONNX model (default: "
                             + (fusion or "every planner's blocks are listed") + ")")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                        help="fix an ONNX model input's symbolic dimensions (repeatable)")
    parser.add_argument("--rewrite", action="store_true",
                        help="apply the math-property rewrites (identities, constant folding, "
                             "BatchNormalization folding, DNNFusion Table 4) first")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelgen", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kernelgen {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands")
    p_run = sub.add_parser("run", help="run an ONNX model (checked against onnxruntime, timed; "
                           "default: the bundled MobileNetV2 stack) or fuse and run a chain "
                           "file",
                           description=f"{run_model.__doc__}\n\nA chain file: {run.__doc__}")
    p_run.add_argument("chain", nargs="?", default=str(DEFAULT_MODEL),
                       help="an ONNX model (MODEL.onnx; default: the bundled MobileNetV2 "
                            "stack, examples/mobilenet_v2.onnx) or a JSON chain file: "
                            "{\"inputs\": {name: {\"shape\": [...], \"dtype\": ...}}, "
                            "\"ops\": [{\"op\": ONNX type, \"inputs\": [names], \"attrs\": "
                            "{...}, \"name\": ...}]} (examples/default_chain.json: an "
                            "attention-score epilogue)")
    p_run.add_argument("--force", action="store_true",
                       help="fuse pairs that DNNFusion's table refuses (red) too (chains)")
    p_run.add_argument("--repeat", type=_positive, default=20, metavar="N",
                       help="timed runs per measurement; the median is shown (default: 20)")
    _model_options(p_run)
    p_run.add_argument("--inputs", metavar="FILE.npz",
                       help="the model's inputs by name (default: seeded random ones)")
    p_run.add_argument("--rtol", type=float, default=1e-3,
                       help="relative tolerance against onnxruntime (default: 1e-3)")
    p_run.add_argument("--atol", type=float, default=1e-4,
                       help="absolute tolerance against onnxruntime (default: 1e-4)")
    p_run.add_argument("--schedule", default="auto",
                       choices=["auto", "ios", "greedy", "sequential"],
                       help="the stages the kernels run in: 'auto' (default) measures the "
                            "sequential, greedy and IOS schedules' stages and runs whichever "
                            "is fastest in whole runs; 'sequential' measures nothing")
    p_run.add_argument("--profile", type=_positive, default=None, metavar="N",
                       help="also time each launch of an ONNX model on its own and list the "
                            "N slowest (device time where the runtime counts it, and the "
                            "host's round trip from the launch to the end of the wait)")
    p_run.add_argument("--tuning", default="stored",
                       choices=["stored", "none", "measure", "measure-fusion"],
                       help="kernel tunables and DNNFusion's yellow cells (fused or split): "
                            "the Fast-Run database's (default), the defaults (yellow cells "
                            "unfused), measured now (slow), or the stored tunables with the "
                            "yellow cells measured now")
    p_plan = sub.add_parser("plan", help="the fusion report of an ONNX model (nothing is "
                            "compiled), or with --schedule its measured IOS schedules",
                            description=plan_model.__doc__)
    p_plan.add_argument("model", help="an ONNX model file")
    p_plan.add_argument("--json", action="store_true", help="print the report as JSON")
    p_plan.add_argument("--schedule", action="store_true",
                        help="compile the model (fusion default: dnnfusion), measure its "
                             "stages and print the sequential, greedy and IOS schedules")
    p_plan.add_argument("--backend", default=backends.DEFAULT, choices=backends.names(),
                        help=f"where --schedule measures, and whose stored yellow-cell "
                             f"verdicts the plan uses (default: {backends.DEFAULT})")
    _model_options(p_plan, backend=False, fusion=None)
    p_emit = sub.add_parser("emit", help="write an ONNX model's kernels, plan and constants "
                            "as files", description=emit_model.__doc__)
    p_emit.add_argument("model", help="an ONNX model file")
    p_emit.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="the directory to write (created if need be)")
    _model_options(p_emit)
    p_bench = sub.add_parser("bench", help="time an ONNX model under every planner, with and "
                             "without the rewrites, beside onnxruntime",
                             description=bench_command.__doc__)
    p_bench.add_argument("model", help="an ONNX model file")
    p_bench.add_argument("--backend", default=backends.DEFAULT, choices=backends.names(),
                         help=f"where the kernels run (default: {backends.DEFAULT})")
    p_bench.add_argument("--fusion", action="append", choices=sorted(PLANNERS),
                         help="a planner to time (repeatable; default: all of them)")
    p_bench.add_argument("--rewrite", choices=["no", "yes", "both"], default="both",
                         help="time the model as imported, after the math-property rewrites, "
                              "or both (default)")
    p_bench.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                         help="fix an ONNX model input's symbolic dimensions (repeatable)")
    p_bench.add_argument("--repeat", type=_positive, default=20, metavar="N",
                         help="timed runs per configuration; the median is shown (default: 20)")
    p_bench.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    sub.add_parser("devices", help="list the OpenCL devices and what kernelgen generates for",
                   description=devices.__doc__)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run; the exit status: 0 ok, 1 a result differs from its reference
    (the unfused chain, onnxruntime), 2 bad input (a usage error, a chain file or model that
    cannot be used)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "devices":
            return devices()
        if args.command == "plan":
            return plan_model(args.model, args.fusion, args.json, parse_shapes(args.shape),
                              args.rewrite, args.schedule, args.backend)
        if args.command == "bench":
            rewrites = {"no": (False,), "yes": (True,), "both": (False, True)}[args.rewrite]
            return bench_command(args.model, args.backend, args.fusion, rewrites=rewrites,
                                 repeat=args.repeat, shapes=parse_shapes(args.shape),
                                 as_json=args.json)
        if args.command == "emit":
            return emit_model(args.model, args.output, args.backend, args.fusion,
                              parse_shapes(args.shape), args.rewrite)
        if args.command == "run" and args.chain.lower().endswith(".onnx"):
            return run_model(args.chain, args.backend, args.fusion, inputs=args.inputs,
                             repeat=args.repeat, shapes=parse_shapes(args.shape),
                             rtol=args.rtol, atol=args.atol, tuning=args.tuning,
                             rewrite=args.rewrite, profile=args.profile,
                             schedule=None if args.schedule == "sequential" else args.schedule)
        if args.command == "run":
            return run(args.chain, args.force, args.repeat, args.backend)
    except KernelgenError as exc:
        print(f"kernelgen: error: {exc}", file=sys.stderr)
        return 2
    parser.print_help()
    return 2
