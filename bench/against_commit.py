"""Whole models compiled by this working tree and by an earlier commit in one process, whole
runs of both round-robin: a change's effect on models without a switch to turn it off. The
commit's ``kernelgen`` package is extracted (``git archive``) under another name
(``kernelgen_<commit>``; the package imports itself relatively), so both compile and run side
by side, each with its own OpenCL context on the same device; their outputs are compared first.

    python bench/against_commit.py COMMIT [--models bundled,squeezenet,shufflenet] \
        [--rounds 30] [--rewrite] [--onnxruntime] [--json FILE]

prints, per model, both medians (ms) and the working tree's gain (with ``--onnxruntime``,
onnxruntime's median of runs just before and after the rounds beside them).
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "kernelgen" / "cli" / "examples" / "mobilenet_v2.onnx"
sys.path.insert(0, str(ROOT / "tests"))

from models.model_zoo import bert_layer, light, mobilenet_v2  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.cli.model import _ort_session  # noqa: E402
from kernelgen.measure import round_robin  # noqa: E402


def package_at(commit: str, into: Path) -> ModuleType:
    """``kernelgen`` as of ``commit``, imported as ``kernelgen_<commit>`` from ``into``."""
    name = "kernelgen_" + "".join(ch for ch in commit if ch.isalnum())
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "kernelgen"],
                             check=True, capture_output=True).stdout
    tar = into / "pkg.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    (into / "kernelgen").rename(into / name)
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


BERT_SHAPES = {"x": (1, 128, 256), "mask": (1, 128)}


def model(name: str) -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]] | None]:
    """``name``'s model and its input shapes: 'bundled' is the CLI's default MobileNetV2
    (32x32), 'mobilenet_v2' the stack of the model tests at 224x224 ('mobilenet_v2_112' at
    112x112), 'bert_layer' the model tests' encoder layer (hidden 256, 4 heads, 128 tokens),
    the others onnx's light models with random weights."""
    if name == "bundled":
        return onnx.load(BUNDLED), None
    if name.startswith("mobilenet_v2"):
        size = int(name.removeprefix("mobilenet_v2_")) if name != "mobilenet_v2" else 224
        return mobilenet_v2(size=size), None
    if name == "bert_layer":
        return bert_layer(hidden=256, heads=4), BERT_SHAPES
    return light(name), None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("commit")
    ap.add_argument("--models", default="squeezenet,shufflenet,mobilenet_v2")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--fusion", default="dnnfusion")
    ap.add_argument("--rewrite", action="store_true", help="compile after the rewrites")
    ap.add_argument("--onnxruntime", action="store_true",
                    help="time onnxruntime (2 threads, all graph optimisations) just before "
                         "and after the rounds, as the other benchmarks do")
    ap.add_argument("--json", help="write the medians here")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.commit],
                            check=True, capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kernelgen-at-") as tmp:
        before = package_at(args.commit, Path(tmp))
        for name in args.models.split(","):
            proto, shapes = model(name)
            rng = np.random.default_rng(0)
            feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype.numpy)
                     if v.dtype.is_float else np.ones(v.shape, v.dtype.numpy)
                     for v in kg.import_onnx(proto, shapes).inputs}
            sessions = {label: pkg.compile_model(proto, backend="opencl", fusion=args.fusion,
                                                 input_shapes=shapes, rewrite=args.rewrite)
                        for label, pkg in ((args.commit, before), ("working tree", kg))}
            outs = [s.run(None, feeds)[0] for s in sessions.values()]
            np.testing.assert_allclose(outs[1], outs[0], rtol=1e-3, atol=1e-4)
            ort_run = _onnxruntime(proto, feeds) if args.onnxruntime else None
            ort_times = _timed(ort_run, args.rounds) if ort_run else []
            times = round_robin({label: (lambda s=s, f=feeds: s.run(None, f))
                                 for label, s in sessions.items()}, 3, args.rounds)
            ort_times += _timed(ort_run, args.rounds) if ort_run else []
            old, new = (float(np.median(times[label])) for label in sessions)
            row = {"model": name, "commit": commit, "commit_ms": old,
                   "working_tree_ms": new, "gain": old / new, "rounds": args.rounds}
            line = (f"{name}: {args.commit} {old:.3f} ms, working tree {new:.3f} ms: "
                    f"{old / new:.2f}x")
            if ort_times:
                row["onnxruntime_ms"] = ort = float(np.median(ort_times))
                line += f"; onnxruntime {ort:.3f} ms (onnxruntime / working tree {ort / new:.2f})"
            rows.append(row)
            print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv),
                                               "rows": rows}, indent=1) + "\n")
    return 0


def _onnxruntime(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    session = _ort_session(proto, optimise=True, threads=2)
    return lambda: session.run(None, feeds)


def _timed(f, repeat: int) -> list[float]:
    """``repeat`` back-to-back runs of ``f`` after three warm-ups, in milliseconds."""
    return round_robin({"f": f}, 3, repeat)["f"]


if __name__ == "__main__":
    sys.exit(main())
