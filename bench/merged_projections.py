"""Attention's Q, K and V projections merged into one MatMul (``graph/projections.py``, a graph
pass of the rewrites), on OpenCL: BERT-style encoder layers (``tests/models/model_zoo.py``)
under DNNFusion's plan

- with the rewrites (``rewrite=True``: the projections merged; the default row),
- with the rewrites but not the merge (``simplify.PASSES`` emptied),
- as imported (no rewrites),

and onnxruntime (all graph optimisations, 2 threads) on the same inputs. Every variant is
checked against onnxruntime, then whole runs are timed round-robin in the same rounds,
onnxruntime last in each; medians in ms, and each variant's time over the default's as the
median of the rounds' ratios (``kept_runs.measure``).

    python bench/merged_projections.py [--rounds 7] [--repeat 30] [--json FILE]
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kept_runs import _session, measure  # noqa: E402
from models.model_zoo import bert_layer  # noqa: E402
from vector_casts import case_main  # noqa: E402

import kernelgen as kg  # noqa: E402

simplify_module = importlib.import_module("kernelgen.graph.simplify")  # not the function

# (sequence, hidden, heads): this repo's BERT-style layer, BERT-base, ViT-S/16 (197 tokens)
LAYERS = ((128, 256, 4), (128, 768, 12), (197, 384, 6))


def layer(seq: int, hidden: int, heads: int) -> tuple[str, dict[str, Callable[[], object]]]:
    """One encoder layer compiled three ways, and onnxruntime: the label and timed calls."""
    proto = bert_layer(batch=1, seq=seq, hidden=hidden, heads=heads)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, seq, hidden)).astype(np.float32),
             "mask": np.ones((1, seq), np.int64)}
    feeds["mask"][:, -seq // 8:] = 0  # the last positions padding
    shapes = {name: a.shape for name, a in feeds.items()}
    session = _session(proto.SerializeToString())
    want = session.run(None, feeds)
    runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, feeds)}
    launches = {}
    variants = (("default", True, ExitStack()),
                ("unmerged", True, mock.patch.dict(simplify_module.PASSES, clear=True)),
                ("as imported", False, ExitStack()))
    for name, rewrite, switch in variants:
        with switch:
            model = kg.compile_model(proto, backend="opencl", fusion="dnnfusion",
                                     input_shapes=shapes, rewrite=rewrite)
        merged = any(a.rule == "merge_projections" for a in model.rewrites)
        assert merged == (name == "default"), name
        for got, ref in zip(model.run(None, feeds), want):
            np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3, err_msg=name)
        runs[name] = (lambda m=model: m.run(None, feeds))
        launches[name] = len(model.plan.launches)
    return (f"encoder layer, hidden {hidden}, {heads} heads, sequence {seq} (launches: "
            + ", ".join(f"{n} {k}" for n, k in launches.items()) + ")"), runs


def main() -> int:
    return case_main(__doc__, lambda: [layer(*shape) for shape in LAYERS], measure)


if __name__ == "__main__":
    raise SystemExit(main())
