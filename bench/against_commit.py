"""Whole models compiled by this working tree and by an earlier commit in one process, whole
runs of both round-robin: a change's effect on models without a switch to turn it off. The
commit's ``kernelgen`` package is extracted (``git archive``) under another name
(``kernelgen_<commit>``; the package imports itself relatively), so both compile and run side
by side, each with its own OpenCL context on the same device; their outputs are compared first.

    python bench/against_commit.py COMMIT [--models squeezenet,shufflenet] [--rounds 30]

prints, per model, both medians (ms) and the working tree's gain.
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from models.model_zoo import light, mobilenet_v2  # noqa: E402

import kernelgen as kg  # noqa: E402
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


def model(name: str):
    return mobilenet_v2(size=224) if name == "mobilenet_v2" else light(name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("commit")
    ap.add_argument("--models", default="squeezenet,shufflenet,mobilenet_v2")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--fusion", default="dnnfusion")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kernelgen-at-") as tmp:
        before = package_at(args.commit, Path(tmp))
        for name in args.models.split(","):
            proto = model(name)
            rng = np.random.default_rng(0)
            feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype.numpy)
                     for v in kg.import_onnx(proto).inputs}
            sessions = {label: pkg.compile_model(proto, backend="opencl", fusion=args.fusion)
                        for label, pkg in ((args.commit, before), ("working tree", kg))}
            outs = [s.run(None, feeds)[0] for s in sessions.values()]
            np.testing.assert_allclose(outs[1], outs[0], rtol=1e-3, atol=1e-4)
            times = round_robin({label: (lambda s=s, f=feeds: s.run(None, f))
                                 for label, s in sessions.items()}, 3, args.rounds)
            old, new = (float(np.median(times[label])) for label in sessions)
            print(f"{name}: {args.commit} {old:.3f} ms, working tree {new:.3f} ms: "
                  f"{old / new:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
