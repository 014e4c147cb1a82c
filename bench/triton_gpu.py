"""The real-model patterns of bench/patterns.py on a CUDA GPU: kernelgen's fused Triton kernel
against PyTorch's eager operators (cuBLAS, its own fused softmax and copy kernels) on the same
device tensors, and a device-to-device copy of the largest tensor for the bandwidth ceiling.
Run where a GPU is (not under TRITON_INTERPRET); each output is checked against PyTorch first.

    python bench/triton_gpu.py [--repeat 50] [--json out.json]

Times are medians of CUDA-synchronised calls after warm-up, in ms. "torch / ours" above 1:
kernelgen faster. "of copy bandwidth": the bytes the pattern moves (inputs once, output once)
per ms over the copy's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from patterns import PATTERNS, Pattern  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.measure import runner  # noqa: E402


def torch_version(p: Pattern) -> Callable[[], object]:
    """The pattern in PyTorch eager on device copies of its arrays."""
    import torch
    t = {n: torch.from_numpy(a).cuda() for n, a in p.arrays.items()}
    x = t.get("x")
    if p.family == "transpose":
        return lambda: torch.relu(x.t() + t["b"]).contiguous()
    if p.family == "nchw-to-nhwc":
        return lambda: torch.relu(x.permute(0, 2, 3, 1)).contiguous()
    if p.family == "channel-shuffle":
        n, c, h, w = x.shape
        return lambda: x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
    if p.family == "attention":
        return lambda: torch.softmax(t["q"] @ t["k"].transpose(-1, -2) * t["s"], -1) @ t["v"]
    if p.family == "softmax":
        return lambda: torch.softmax(x * t["s"] + t["mask"], -1)
    raise ValueError(p.family)


def timed(f: Callable[[], object], repeat: int) -> float:
    import torch
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def measure(p: Pattern, repeat: int) -> dict[str, object]:
    import torch
    fused = kg.fuse(*p.ops, force=True)
    kernel = fused.emit("triton")
    arrays = [p.arrays[v.name] for v in fused.inputs]
    ref = torch_version(p)
    want = ref().cpu().numpy()
    got = kernel(*arrays)
    err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    biggest = max(p.arrays.values(), key=lambda a: a.size)
    src = torch.from_numpy(biggest).cuda()
    dst = torch.empty_like(src)
    copy_ms = timed(lambda: dst.copy_(src), repeat)
    ours, theirs = timed(runner(kernel, *arrays), repeat), timed(ref, repeat)
    moved = kernel.loop.bytes_moved() if hasattr(kernel, "loop") else 0
    row = {"pattern": p.label, "schedule": kernel.metadata.get("schedule"),
           "rel_error": err, "kernelgen_ms": round(ours, 4), "torch_ms": round(theirs, 4),
           "torch_over_ours": round(theirs / ours, 2),
           "of_copy": round((moved / ours) / (2 * biggest.nbytes / copy_ms), 2) if moved else None}
    print(f"{p.label}: kernelgen {ours:.4f} ms, torch {theirs:.4f} ms "
          f"(x{row['torch_over_ours']}), {row['of_copy']} of copy, error {err:.1e}", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import torch
    rows = []
    for family, builds in PATTERNS.items():
        for build in builds:
            try:
                rows.append(measure(build(), args.repeat))
            except Exception as exc:  # noqa: BLE001 - one failing pattern must not hide the rest
                print(f"{family}: {type(exc).__name__}: {exc}", flush=True)
                rows.append({"pattern": family, "error": f"{type(exc).__name__}: {exc}"})
    out = {"device": torch.cuda.get_device_name(), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
