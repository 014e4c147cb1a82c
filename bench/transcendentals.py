"""Transcendental operators over 16M float32, each alone and in two fused chains, as effective
GB/s (the input read once, the output written once) and as a ratio to a plain copy kernel of
the same backend timed round-robin with them in the same run.

    python bench/transcendentals.py [--repeat 15] [--rounds 3] [--library] \
        [--json bench/results/transcendentals.json]

Ops: abs (a control: no arithmetic to speak of), exp, log, tanh, sigmoid, erf, GELU (erf),
GELU (tanh), softplus, SiLU, Mish, expm1, log1p; the chains are SiLU and GELU(erf) of
``x * scale + shift`` (scale and shift broadcast along rows). Every kernel's output is checked
against a float64 NumPy reference before it is timed. NEON runs through SIMDe on x86: its
figures say nothing of ARM speed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from elementwise_chain import BACKEND_LABELS, timeable_backends  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen import backends  # noqa: E402
from kernelgen.backends import Backend  # noqa: E402
from kernelgen.backends.opencl.runtime import device  # noqa: E402
from kernelgen.compile import copy_kernel  # noqa: E402
from kernelgen.ir.expr import Call, Cast, Select, call, walk  # noqa: E402
from kernelgen.ir.loop import LoopKernel  # noqa: E402
from kernelgen.measure import bench_interleaved  # noqa: E402
from kernelgen.ops.common import broadcast_read, make_op  # noqa: E402

N = 4096  # 4096 x 4096 = 16M float32
CHECKED = 1 << 18  # leading elements compared with the float64 reference


def _primitive(fn: str, x: kg.Value) -> kg.Op:
    """An operator whose body is one IR primitive (expm1 and log1p have no ONNX operator)."""
    return make_op(fn, [x], x.shape, x.dtype, call(fn, broadcast_read(0, x, x.shape)))


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _gelu64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + _erf64(x / math.sqrt(2)))


def _softplus64(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x)


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


# name -> (ops on x, float64 reference, input domain: 'real' or 'positive')
Builder = Callable[[kg.Value], list[kg.Op]]
UNARY: dict[str, tuple[Builder, Callable[[np.ndarray], np.ndarray], str]] = {
    "abs": (lambda x: [kg.abs(x)], np.abs, "real"),
    "exp": (lambda x: [kg.exp(x)], np.exp, "real"),
    "log": (lambda x: [kg.log(x)], np.log, "positive"),
    "tanh": (lambda x: [kg.tanh(x)], np.tanh, "real"),
    "sigmoid": (lambda x: [kg.sigmoid(x)], _sigmoid64, "real"),
    "erf": (lambda x: [kg.erf(x)], _erf64, "real"),
    "gelu (erf)": (lambda x: [kg.gelu(x)], _gelu64, "real"),
    "gelu (tanh)": (lambda x: [kg.gelu(x, approximate="tanh")],
                    lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                                     (x + 0.044715 * x**3))), "real"),
    "softplus": (lambda x: [kg.softplus(x)], _softplus64, "real"),
    "silu": (lambda x: _silu(x), lambda x: x * _sigmoid64(x), "real"),
    "mish": (lambda x: [kg.mish(x)], lambda x: x * np.tanh(_softplus64(x)), "real"),
    "expm1": (lambda x: [_primitive("expm1", x)], np.expm1, "real"),
    "log1p": (lambda x: [_primitive("log1p", x)], np.log1p, "positive"),
}


def _silu(x: kg.Value) -> list[kg.Op]:
    s = kg.sigmoid(x)
    return [s, kg.mul(x, s)]


def _affine(x: kg.Value, scale: kg.Value, shift: kg.Value) -> list[kg.Op]:
    a = kg.mul(x, scale)
    return [a, kg.add(a, shift)]


def chains() -> dict[str, tuple[Callable[..., list[kg.Op]], Callable[..., np.ndarray]]]:
    """MatMul-free stand-ins for an MLP's activation: f(x * scale + shift)."""
    def silu_chain(x: kg.Value, scale: kg.Value, shift: kg.Value) -> list[kg.Op]:
        ops = _affine(x, scale, shift)
        return ops + _silu(ops[-1])

    def gelu_chain(x: kg.Value, scale: kg.Value, shift: kg.Value) -> list[kg.Op]:
        ops = _affine(x, scale, shift)
        return ops + [kg.gelu(ops[-1])]

    def affine64(x: np.ndarray, s: np.ndarray, b: np.ndarray) -> np.ndarray:
        return x.astype(np.float64) * s + b

    return {"silu chain": (silu_chain, lambda x, s, b: (lambda a: a * _sigmoid64(a))(
                affine64(x, s, b))),
            "gelu (erf) chain": (gelu_chain, lambda x, s, b: _gelu64(affine64(x, s, b)))}


def _inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, n)) * 2).astype(np.float32)
    return {"real": x, "positive": np.abs(x) + np.float32(1e-3),
            "scale": (1 + 0.1 * rng.standard_normal(n)).astype(np.float32),
            "shift": (0.1 * rng.standard_normal(n)).astype(np.float32)}


def _checked(kernel: kg.Kernel, args: list[np.ndarray], want: np.ndarray, name: str) -> None:
    """Correctness before speed: the kernel against the float64 reference."""
    got = np.asarray(kernel(*args)).reshape(-1)[:CHECKED].astype(np.float64)
    np.testing.assert_allclose(got, want.reshape(-1)[:CHECKED], rtol=2e-5, atol=1e-6,
                               err_msg=f"{kernel.name} ({name})")


# with --library: these ops again as the OpenCL library's calls (exp(), erf(), ...), the way
# kernelgen emitted them before its math library, timed in the same rounds
LIBRARY = ("exp", "log", "tanh", "sigmoid", "erf", "gelu (erf)")


def library_calls(backend: str) -> Backend:
    """``backend`` with nothing expanded but pow's constant exponents."""
    bound = backends.get(backend)
    return replace(bound, caps=replace(bound.caps, fast_math=frozenset({"pow"})))


def variants(backend: str, arrays: dict[str, np.ndarray], library: bool = False
             ) -> dict[str, tuple]:
    """name -> (kernel, input arrays), the copy kernel first, each checked."""
    out: dict[str, tuple] = {"copy": (copy_kernel(arrays["real"].shape, backend=backend),
                                      [arrays["real"]])}
    head = slice(0, CHECKED // N)
    for name, (build, ref, domain) in UNARY.items():
        x = kg.tensor("x", arrays[domain].shape)
        targets = {name: backends.get(backend)}
        if library and name in LIBRARY:
            targets[f"{name} [library]"] = library_calls(backend)
        for label, target in targets.items():
            kernel = kg.fuse(*build(x)).emit(target)
            OPERATIONS[label] = operations(target.expand(kernel.loop))
            _checked(kernel, [arrays[domain]], ref(arrays[domain][head].astype(np.float64)),
                     label)
            out[label] = (kernel, [arrays[domain]])
    for name, (build, ref) in chains().items():
        x, s, b = kg.tensor("x", (N, N)), kg.tensor("scale", (N,)), kg.tensor("shift", (N,))
        kernel = kg.fuse(*build(x, s, b)).emit(backend)
        OPERATIONS[name] = operations(backends.get(backend).expand(kernel.loop))
        args = [arrays["real"], arrays["scale"], arrays["shift"]]
        _checked(kernel, args, ref(arrays["real"][head], arrays["scale"], arrays["shift"]), name)
        out[name] = (kernel, args)
    return out


def operations(loop: LoopKernel) -> int:
    """Arithmetic, compare, select and cast nodes per element of ``loop``'s stores (shared
    nodes once): the work of one element once the math library is expanded."""
    nodes = {id(n): n for st in loop.stores for n in walk(st.value)}
    return sum(isinstance(n, (Call, Select, Cast)) for n in nodes.values())


# label -> operations per element of the kernel timed under it (filled by ``variants``)
OPERATIONS: dict[str, int] = {}


def run_backend(backend: str, arrays: dict[str, np.ndarray], repeat: int, rounds: int,
                library: bool = False) -> dict:
    timed = variants(backend, arrays, library)
    per_round = [bench_interleaved(timed, repeat=repeat) for _ in range(rounds)]
    rows = []
    for name in timed:
        if name == "copy":
            continue
        ratios = [m[name].gbps / m["copy"].gbps for m in per_round]
        mid = sorted(range(rounds), key=lambda k: ratios[k])[rounds // 2]  # the median round
        m = per_round[mid]
        rows.append({"op": name, "operations": OPERATIONS[name], "ms": m[name].median_ms,
                     "gbps": m[name].gbps,
                     "copy_gbps": m["copy"].gbps, "vs_copy": ratios[mid],
                     "vs_copy_rounds": ratios, "loadavg": m[name].loadavg})
    return {"backend": backend, "label": BACKEND_LABELS[backend],
            "copy_gbps_rounds": [m["copy"].gbps for m in per_round], "ops": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15, help="timed runs per round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds; each op's round with the median ratio is shown")
    parser.add_argument("--backends", default=",".join(timeable_backends()))
    parser.add_argument("--library", action="store_true",
                        help=f"also time {', '.join(LIBRARY)} as library calls")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    arrays = _inputs(N)
    load = os.getloadavg()[0]
    results = [run_backend(b, arrays, args.repeat, args.rounds, args.library)
               for b in args.backends.split(",")]
    print(f"OpenCL device: {device().name}; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {args.rounds} rounds of {args.repeat} interleaved "
          f"runs of every op and a copy kernel; device-resident buffers, 16M float32")
    for r in results:
        copy = r["copy_gbps_rounds"]
        print(f"\n{r['label']}: copy {min(copy):.1f}-{max(copy):.1f} GB/s over the rounds")
        print(f"{'op':<21} {'ops':>4} {'ms':>8} {'GB/s':>7} {'vs copy':>8} {'rounds':>16}")
        for row in r["ops"]:
            spread = "-".join(f"{v:.2f}" for v in (min(row["vs_copy_rounds"]),
                                                   max(row["vs_copy_rounds"])))
            print(f"{row['op']:<21} {row['operations']:>4} {row['ms']:>8.3f} {row['gbps']:>7.1f} "
                  f"{row['vs_copy']:>8.2f} {spread:>16}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "opencl_device": device().name, "host": platform.machine(),
            "loadavg_before": load, "loadavg_after": os.getloadavg()[0],
            "repeat": args.repeat, "rounds": args.rounds, "elements": N * N,
            "backends": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
