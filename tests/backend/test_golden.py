"""Golden emitted sources for every backend: an emitter change shows up as a reviewable diff.

Regenerate after an intended change with
``KERNELGEN_UPDATE_GOLDEN=1 pytest tests/backend/test_golden.py`` and review tests/golden/.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kernelgen as kg
from kernelgen import backends

GOLDEN = Path(__file__).parent.parent / "golden"


def _named(op: kg.Op, name: str) -> kg.Op:
    op.name = name  # stable buffer names in the source
    return op


def bias_gelu() -> kg.FusedOp:
    x, b = kg.tensor("x", (129, 257)), kg.tensor("b", (257,))
    a = _named(kg.add(x, b), "a")
    return kg.fuse(a, _named(kg.gelu(a), "y"))


def transpose_reshape_exp() -> kg.FusedOp:
    x = kg.tensor("x", (3, 5, 7))
    t = _named(kg.transpose(x, [2, 0, 1]), "t")
    r = _named(kg.reshape(t, [7, 15]), "r")
    return kg.fuse(t, r, _named(kg.exp(r), "y"))


def pad_concat() -> kg.FusedOp:
    x, y = kg.tensor("x", (4, 5)), kg.tensor("y", (4, 3))
    p = _named(kg.pad(x, [0, 1, 0, 2], 0.5), "p")
    return kg.fuse(p, _named(kg.concat([p, y], 1), "c"))


def row_softmax() -> kg.FusedOp:
    x = kg.tensor("x", (64, 1000))
    return kg.fuse(_named(kg.softmax(x, 1), "y"))


def column_sum_group() -> kg.FusedOp:
    x = kg.tensor("x", (4096, 3))
    return kg.fuse(_named(kg.reduce_sum(x, [0], 0), "y"))


def gather_rows() -> kg.FusedOp:
    d, i = kg.tensor("d", (10, 6)), kg.tensor("i", (7,), "int64")
    g = _named(kg.gather(d, i, 0), "g")
    return kg.fuse(g, _named(kg.relu(g), "y"))


def gemm_bias_relu() -> kg.FusedOp:
    a, b, c = kg.tensor("a", (33, 17)), kg.tensor("b", (17, 9)), kg.tensor("c", (9,))
    g = _named(kg.gemm(a, b, c), "g")
    return kg.fuse(g, _named(kg.relu(g), "y"))


def _relu_depthwise_sigmoid() -> list[kg.Op]:
    x = kg.tensor("x", (1, 4, 13, 16))
    w = kg.constant("w", np.linspace(-1, 1, 36, dtype=np.float32).reshape(4, 1, 3, 3))
    pre = _named(kg.relu(x), "pre")
    conv = _named(kg.conv(pre, w, pads=[1, 1, 1, 1], group=4), "conv")
    return [pre, conv, _named(kg.sigmoid(conv), "y")]


def depthwise_window() -> kg.FusedOp:
    """OpenCL's 'window' schedule, NEON's 'columns'."""
    return kg.fuse(*_relu_depthwise_sigmoid())


def maxpool_window() -> kg.FusedOp:
    """A MaxPool (3x3, stride 2, padded) after a ReLU: OpenCL's 'window' with a max over the
    taps."""
    pre = _named(kg.relu(kg.tensor("x", (1, 4, 13, 21))), "r")
    return kg.fuse(pre, _named(kg.max_pool(pre, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                               "y"))


def _conv3x3_relu(x_shape: tuple[int, ...], m: int) -> list[kg.Op]:
    x = kg.tensor("x", x_shape)
    c = x_shape[1]
    w = kg.constant("w", np.linspace(-1, 1, m * c * 9, dtype=np.float32).reshape(m, c, 3, 3))
    conv = _named(kg.conv(x, w, pads=[1, 1, 1, 1]), "conv")
    return [conv, _named(kg.relu(conv), "y")]


def conv_im2col() -> kg.FusedOp:
    """im2col as one kernel: the contraction packs the patches (the packing tile or launch)."""
    return kg.fuse(*_conv3x3_relu((1, 5, 9, 11), 7))


def conv_winograd() -> kg.FusedOp:
    """Winograd F(2x2, 3x3): a Program of the input transform, batched GEMM and output
    transform (the filter transform folded at build time)."""
    return kg.fuse(*_conv3x3_relu((1, 4, 8, 8), 6))


def ago_conv_1x1() -> kg.FusedOp:
    """AGO: conv 3x3 + ReLU feeding a 1x1 conv, one contraction computing its producer."""
    x, w1, w2 = (kg.tensor("x", (1, 5, 9, 11)), kg.tensor("w1", (7, 5, 3, 3)),
                 kg.tensor("w2", (6, 7, 1, 1)))
    p = _named(kg.conv(x, w1, pads=[1, 1, 1, 1]), "p")
    r = _named(kg.relu(p), "r")
    return kg.fuse(p, r, _named(kg.conv(r, w2), "y"), force=True)


def staged_attention() -> kg.FusedOp:
    """MatMul -> Softmax -> MatMul with each score row staged once per query."""
    q, k, v = kg.tensor("q", (16, 8)), kg.tensor("k", (8, 10)), kg.tensor("v", (10, 4))
    s = _named(kg.matmul(q, k), "s")
    p = _named(kg.softmax(s, 1), "p")
    return kg.fuse(s, p, _named(kg.matmul(p, v), "y"), force=True)


def gemm_packed() -> kg.FusedOp:
    """A GEMM whose packed operand's panels are filled first (by a first launch on OpenCL)."""
    return gemm_bias_relu()


def gemm_pack_in_tile() -> kg.FusedOp:
    """OpenCL: each column tile's work-item packs its own panel, then sweeps every row tile."""
    return gemm_bias_relu()


# name -> (block, {backend: emit options}); a backend missing from the options is not checked
Case = tuple[Callable[[], kg.FusedOp], dict[str, dict[str, Any]]]
_EVERY: dict[str, dict[str, Any]] = {name: {} for name in backends.names()}
CASES: dict[str, Case] = {f.__name__: (f, _EVERY) for f in (
    bias_gelu, transpose_reshape_exp, pad_concat, row_softmax, column_sum_group, gather_rows,
    gemm_bias_relu, depthwise_window, maxpool_window, ago_conv_1x1, staged_attention)}
CASES.update({
    "depthwise_window": (depthwise_window, {b: {"algorithm": "direct"} for b in _EVERY}),
    "conv_im2col": (conv_im2col, {b: {"algorithm": "im2col"} for b in _EVERY}),
    "conv_winograd": (conv_winograd, {b: {"algorithm": "winograd"} for b in _EVERY}),
    "conv_winograd_4x4": (conv_winograd, {"opencl": {"algorithm": "winograd_4x4"}}),
    "gemm_packed": (gemm_packed, {"opencl": {"pack": True, "pack_in_tile": False},
                                  "neon": {"pack": True}, "triton": {"pack": True}}),
    "gemm_pack_in_tile": (gemm_pack_in_tile, {"opencl": {"pack": True, "pack_in_tile": True}}),
})




def _stable_names(kernel: Any) -> str:
    """The source with the tensors that a program's stages name from a process-wide counter
    (``winogradinput_76``) renumbered by first appearance, so the file does not depend on how
    many operators the process built before."""
    source = kernel.source
    stages = kernel.metadata.get("stages", [kernel.metadata])
    counted = {a["name"] for m in stages for a in m["args"] if re.search(r"_\d+$", a["name"])}
    order = sorted(counted, key=source.find)
    for k, name in enumerate(order):
        source = re.sub(rf"\b{name}\b", f"{name.rsplit('_', 1)[0]}_#{k}", source)
    return source
PARAMS = [(name, b) for name, (_, options) in CASES.items() for b in backends.names()
          if b in options]


def _fixed_target(backend_name: str) -> str | backends.Backend:
    """The backend generating for one declared device, so the files do not depend on which
    OpenCL device runs the tests (its vector widths and limits shape the code)."""
    if backend_name == "opencl":
        return backends.REGISTRY["opencl"].for_device("cpu-avx512")  # type: ignore[attr-defined]
    return backend_name


@pytest.mark.parametrize(("name", "backend_name"), PARAMS)
def test_golden_source(name: str, backend_name: str) -> None:
    block, options = CASES[name]
    source = _stable_names(block().emit(_fixed_target(backend_name), tuning="none",
                                        **options[backend_name]))
    path = GOLDEN / backend_name / f"{name}.{backends.get(backend_name).suffix}"
    if os.environ.get("KERNELGEN_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    assert path.exists(), f"missing golden file {path}; run with KERNELGEN_UPDATE_GOLDEN=1"
    assert source == path.read_text(), f"emitted source for {name} changed; review and update"


def test_index_width_follows_tensor_size() -> None:
    """int indices while every buffer fits in 2**31 elements, long beyond (source only: 2**32
    floats would need 16 GiB to run)."""
    # one point a work-item: whether the live device takes a vector of points instead comes
    # from a timed probe (device.probed_elementwise), measured again in each test session's
    # fresh cache and noisy beside a busy core (CI's other worker), which had made this
    # source a 'long kg_chunk' loop now and then
    small = kg.fuse(kg.relu(kg.tensor("x", (2**15, 2**15)))).emit("opencl", vectors=False)
    big = kg.fuse(kg.relu(kg.tensor("x", (2**16, 2**16)))).emit("opencl", vectors=False)
    assert small.metadata["tunables"]["index_type"] == "int"
    assert big.metadata["tunables"]["index_type"] == "long"
    assert "const long o0 = (long)get_global_id(0);" in big.source


@pytest.mark.parametrize(("name", "backend_name"), PARAMS)
def test_tunables_reproduce_the_source(name: str, backend_name: str) -> None:
    """A kernel's metadata['tunables'] is its schedule record: passed back as options, they
    give the same source (every stage of a program, each with its own)."""
    block, options = CASES[name]
    first = block().emit(backend_name, tuning="none", **options[backend_name])
    stages = getattr(first, "kernels", [first])
    for kernel in stages:
        again = kg.compile_loop(kernel.loop, backend_name, tuning=kg.NO_TUNING,
                                **kernel.metadata["tunables"])
        assert again.source == kernel.source, f"{kernel.name}: {kernel.metadata['tunables']}"
