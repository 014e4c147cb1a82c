"""``python -m kernelgen [run CHAIN.json] [--backend opencl|neon|triton]``: fuse a chain of
operators, show the mapping types, the fusion decisions and the generated source, check the fused
kernel against the unfused one, and time fused vs unfused."""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .. import backends
from ..api import fuse
from ..compile import unfused
from ..errors import KernelgenError
from ..graph.chain import split_blocks
from ..measure import bench, pipeline_io
from ..version import __version__
from .chain import DEFAULT_CHAIN, load_chain


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
    from ..backends.opencl import runtime
    found = runtime.list_devices()
    print("OpenCL devices (KERNELGEN_OPENCL_DEVICE=<part of a name> picks one):")
    for name in found or ["none found"]:
        print(f"  {name}")
    if found:
        print(f"\nkernelgen uses: {runtime.device().info.describe()}")
    return 0


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run; the exit status: 0 ok, 1 the fused result differs from the
    unfused one, 2 bad input (a usage error, a chain file that cannot be used)."""
    parser = argparse.ArgumentParser(prog="kernelgen", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kernelgen {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands")
    p_run = sub.add_parser("run", help="fuse and run a chain file (default: the bundled one)",
                           description=run.__doc__)
    p_run.add_argument("chain", nargs="?", default=str(DEFAULT_CHAIN),
                       help="a JSON chain file: {\"inputs\": {name: {\"shape\": [...], "
                            "\"dtype\": ...}}, \"ops\": [{\"op\": ONNX type, \"inputs\": "
                            "[names], \"attrs\": {...}, \"name\": ...}]} (default: the "
                            "bundled attention-score epilogue)")
    p_run.add_argument("--force", action="store_true",
                       help="fuse pairs that DNNFusion's table refuses (red) too")
    p_run.add_argument("--repeat", type=_positive, default=20, metavar="N",
                       help="timed runs per measurement; the median is shown (default: 20)")
    p_run.add_argument("--backend", default=backends.DEFAULT, choices=backends.names(),
                       help=f"where the kernels run (default: {backends.DEFAULT}); triton "
                            "needs a CUDA GPU or TRITON_INTERPRET=1 (slow)")
    sub.add_parser("devices", help="list the OpenCL devices and what kernelgen generates for",
                   description=devices.__doc__)
    args = parser.parse_args(argv)
    try:
        if args.command == "devices":
            return devices()
        if args.command in (None, "run"):
            return run(getattr(args, "chain", str(DEFAULT_CHAIN)), getattr(args, "force", False),
                       getattr(args, "repeat", 20), getattr(args, "backend", backends.DEFAULT))
    except KernelgenError as exc:
        print(f"kernelgen: error: {exc}", file=sys.stderr)
        return 2
    parser.print_help()
    return 2
