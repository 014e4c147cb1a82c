"""The OpenCL benchmarks on each CPU OpenCL implementation installed, one run each, and a table of
them side by side: the fused elementwise chain against the copy kernel, the transcendental
table, GEMM 1024^3 and 2048^3 against OpenBLAS, the three convolutions against onnxruntime, and
the cost of a call from NumPy.

    python bench/implementations.py [--impls "pocl 3.1,intel,pocl 3.0"] [--quick]
                                    [--tune-s 120] [--only transcendentals,...]

Each benchmark script runs in its own process with ``KERNELGEN_OPENCL_DEVICE`` naming the
implementation (the device is chosen once per process) and writes
``bench/results/<impl>/<bench>.json``; the table (markdown, for docs/benchmarks.md) is printed
and written to ``bench/results/implementations.md``. ``--quick`` cuts repeats and tuning time
(a smoke run, not numbers to publish).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
IMPLS = {"pocl 3.1": "Debian PoCL 3.1 (LLVM 15)", "intel": "Intel CPU runtime 2026.2",
         "pocl 3.0": "pip PoCL 3.0 (LLVM 14, generic x86-64)"}


def scripts(quick: bool, tune_s: float) -> dict[str, list[str]]:
    """Benchmark name -> its command line (before ``--json``)."""
    repeat = ["--repeat", "5"] if quick else []
    return {
        "elementwise_chain": ["elementwise_chain.py", "--backends", "opencl",
                              *(["--rounds", "2"] if quick else []), *repeat],
        "transcendentals": ["transcendentals.py", "--backends", "opencl", *repeat],
        "gemm": ["gemm.py", "--opencl-only", "--sizes", "1024,2048",
                 "--tune-s", "10" if quick else str(tune_s), *(["--repeat", "2"] if quick else [])],
        "conv": ["conv.py", "--backends", "opencl", "--tune-s", "10" if quick else str(tune_s),
                 *repeat],
        "call_overhead": ["call_overhead.py", *repeat],
    }


def slug(impl: str) -> str:
    return impl.replace(" ", "-").replace(".", "")


def run(impl: str, quick: bool, tune_s: float, only: set[str] | None = None) -> dict[str, Any]:
    """Each benchmark on ``impl`` (those in ``only``; the others' last results are read)."""
    out_dir = RESULTS / slug(impl)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KERNELGEN_OPENCL_DEVICE": impl, "OPENBLAS_NUM_THREADS": "2"}
    results: dict[str, Any] = {}
    for name, cmd in scripts(quick, tune_s).items():
        path = out_dir / f"{name}.json"
        if only is not None and name not in only:
            results[name] = json.loads(path.read_text()) if path.exists() else None
            continue
        start = time.time()
        done = subprocess.run([sys.executable, str(HERE / cmd[0]), *cmd[1:], "--json",
                               str(path)], env=env, capture_output=True, text=True)
        took = time.time() - start
        if done.returncode != 0 or not path.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            print(f"  {impl} / {name}: FAILED after {took:.0f} s: {' | '.join(tail)}")
            results[name] = None
            continue
        print(f"  {impl} / {name}: {took:.0f} s", flush=True)
        results[name] = json.loads(path.read_text())
    return results


def _chain(r: Any) -> str:
    if not r:
        return "-"
    row = next(b for b in r["backends"] if b["backend"] == "opencl")
    return f"{row['fused_vs_copy']:.2f}"


def _transcendentals(r: Any) -> str:
    """The slowest op against the copy kernel, and SiLU's and GELU's chains."""
    if not r:
        return "-"
    ops = next(b for b in r["backends"] if b["backend"] == "opencl")["ops"]
    worst = min(ops, key=lambda row: row["vs_copy"])
    chains = ", ".join(f"{row['op']} {row['vs_copy']:.2f}" for row in ops
                       if row["op"].endswith("chain"))
    return f"min {worst['vs_copy']:.2f} ({worst['op']}); {chains}"


def _gemm(r: Any, n: int) -> str:
    if not r:
        return "-"
    row = next((row for row in r["rows"] if row["n"] == n), None)
    return f"{row['kernelgen_gflops']:.0f} GFLOP/s ({row['ratio']:.2f}x)" if row else "-"


def _conv(r: Any) -> str:
    """The best algorithm's ratio to onnxruntime, per convolution."""
    if not r:
        return "-"
    cells = [f"{row['opencl_best_vs_ort']:.2f}x" for row in r.get("rows", [])
             if "opencl_best_vs_ort" in row]
    return ", ".join(cells) or "-"


def _call(r: Any) -> str:
    if not r:
        return "-"
    row = r["results"][0]
    aligned = row.get("kernel(aligned x) / launch")
    return f"{row['kernel(x) / launch']:.2f}x" + (f" ({aligned:.2f}x aligned)" if aligned else "")


def table(all_results: dict[str, dict[str, Any]]) -> str:
    head = ["implementation", "chain / copy", "transcendentals / copy", "GEMM 1024³ (vs BLAS)",
            "GEMM 2048³ (vs BLAS)", "convs vs ORT", "kernel(x) / launch (abs 16M)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for impl, r in all_results.items():
        cells = [IMPLS.get(impl, impl), _chain(r.get("elementwise_chain")),
                 _transcendentals(r.get("transcendentals")), _gemm(r.get("gemm"), 1024),
                 _gemm(r.get("gemm"), 2048), _conv(r.get("conv")), _call(r.get("call_overhead"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None,
                    help="run only these benchmarks (comma-separated), reuse the others' JSON")
    ap.add_argument("--tune-s", type=float, default=120.0,
                    help="the tuning budget per GEMM size and per convolution block")
    args = ap.parse_args()
    all_results = {}
    for impl in [i.strip() for i in args.impls.split(",") if i.strip()]:
        print(f"{IMPLS.get(impl, impl)}:", flush=True)
        all_results[impl] = run(impl, args.quick, args.tune_s,
                                set(args.only.split(",")) if args.only else None)
    text = table(all_results)
    print("\n" + text)
    (RESULTS / "implementations.md").write_text(
        f"Command: python bench/implementations.py --impls \"{args.impls}\""
        f"{' --quick' if args.quick else ''} --tune-s {args.tune_s:g}"
        f"{f' --only {args.only}' if args.only else ''}; "
        f"load average {os.getloadavg()[0]:.2f}\n\n"
        + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
