"""The NEON kernels on real AArch64 semantics: cross-compiled statically with
aarch64-linux-gnu-gcc and run under qemu-aarch64 as a Cortex-A53 (ARMv8.0), against ONNX's
reference. A subset of the operator matrix (one case per operator kind, plus neighbours and
the reduction schedules), as one harness run."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import assert_close, require
from reference import evaluate_chain, reference
from test_fusion import NEIGHBOUR_CASES, neighbour_block
from test_ops import CASES, _ints_in_range

import kernelgen as kg


def _subset() -> list:
    seen, picked = set(), []
    for case in CASES:
        kind = case.name.split("(")[0].split("-")[0]
        if kind not in seen:
            seen.add(kind)
            picked.append(case)
    return picked


def test_neon_kernels_on_aarch64(tmp_path: Path) -> None:
    require("aarch64")
    from kernelgen.backends.neon import aarch64

    kernels, inputs, wants, names = [], [], [], []
    for case in _subset():
        values, arrays = case.inputs()
        _ints_in_range(case, arrays, values)
        op = case.build(*values)
        fused = kg.fuse(op)
        kernels.append(fused.emit("neon"))
        feeds = dict(zip((v.name for v in values), arrays))
        inputs.append([feeds[v.name] for v in fused.inputs])
        wants.append(case.ref(*arrays) if case.ref else reference(op, *arrays))
        names.append(case.name)
    for case in NEIGHBOUR_CASES[::3]:
        values, arrays, ops = neighbour_block(case)
        fused = kg.fuse(*ops, force=True)
        feeds = dict(zip((v.name for v in values), arrays))
        kernels.append(fused.emit("neon"))
        inputs.append([feeds[v.name] for v in fused.inputs])
        wants.append(evaluate_chain(ops, feeds)[ops[-1].name])
        names.append(f"neighbours-{case.name}")
    from test_nn import CASES as NN_CASES
    for case in NN_CASES:  # the tiled contraction template and the generic reductions on ARM
        if case.name in ("MatMul", "Gemm-trans", "Conv-stride2-bias", "Conv-depthwise",
                         "MaxPool", "LayerNormalization"):
            values, arrays = case.inputs()
            op = case.build(*values)
            fused = kg.fuse(op)
            feeds = dict(zip((v.name for v in values), arrays))
            kernels.append(fused.emit("neon"))
            inputs.append([feeds[v.name] for v in fused.inputs])
            wants.append(reference(op, *arrays))
            names.append(f"nn-{case.name}")
    x = kg.tensor("x", (300, 37))  # multi-threaded row softmax, ragged vector tails
    X = np.random.default_rng(5).standard_normal((300, 37)).astype(np.float32)
    sm = kg.softmax(x, 1)
    kernels.append(kg.fuse(sm).emit("neon"))
    inputs.append([X])
    wants.append(reference(sm, X))
    names.append("softmax-threads")
    rng = np.random.default_rng(6)
    # the 'columns' schedule: guard masks from lane numbers (a ReLU prologue's padding), and a
    # stride-2 window's deinterleaving loads up to the input's very end
    for shape, strides, pads in (((1, 3, 9, 37), [1, 1], [1, 1, 1, 1]),
                                 ((1, 2, 3, 17), [2, 2], [0, 0, 0, 0])):
        feeds = {"x": rng.standard_normal(shape).astype(np.float32),
                 "w": rng.standard_normal((shape[1], 1, 3, 3)).astype(np.float32)}
        pre = kg.relu(kg.tensor("x", shape))
        window = kg.conv(pre, kg.constant("w", feeds["w"]), pads=pads, group=shape[1],
                         strides=strides)
        kernel = kg.fuse(pre, window).emit("neon")
        assert kernel.metadata["schedule"] == "columns"
        kernels.append(kernel)
        inputs.append([feeds["x"], feeds["w"]])
        wants.append(evaluate_chain([pre, window], feeds)[window.name])
        names.append(f"columns-stride{strides[0]}")
    # im2col in blocks: the packed template gathering patches through padding (ReLU prologue
    # as lane masks, stride 2 deinterleaving), 2 panels a block
    for strides in ([1, 1], [2, 2]):
        feeds = {"x": rng.standard_normal((2, 5, 9, 11)).astype(np.float32),
                 "w": rng.standard_normal((6, 5, 3, 3)).astype(np.float32)}
        pre = kg.relu(kg.tensor("x", (2, 5, 9, 11)))
        conv = kg.conv(pre, kg.constant("w", feeds["w"]), pads=[1, 1, 1, 1], strides=strides)
        kernel = kg.fuse(pre, conv).emit("neon", algorithm="im2col", tuning="none",
                                         pack_block_kib=3)
        assert kernel.metadata["pack_panels"] == 2
        kernels.append(kernel)
        inputs.append([feeds["x"], feeds["w"]])
        wants.append(evaluate_chain([pre, conv], feeds)[conv.name])
        names.append(f"im2col-blocks-stride{strides[0]}")
    # AGO conv3x3 + ReLU -> 1x1 with the producer packed, 21 channels in two groups of 11
    feeds = {"x": rng.standard_normal((1, 5, 9, 11)).astype(np.float32),
             "w1": rng.standard_normal((21, 5, 3, 3)).astype(np.float32),
             "w2": rng.standard_normal((6, 21, 1, 1)).astype(np.float32)}
    producer = kg.conv(kg.tensor("x", (1, 5, 9, 11)), kg.tensor("w1", (21, 5, 3, 3)),
                       pads=[1, 1, 1, 1])
    ago = [producer, kg.relu(producer)]
    ago.append(kg.conv(ago[-1], kg.tensor("w2", (6, 21, 1, 1))))
    fused_ago = kg.fuse(*ago, force=True)
    kernels.append(fused_ago.emit("neon", tuning="none"))
    inputs.append([feeds[v.name] for v in fused_ago.inputs])
    wants.append(evaluate_chain(ago, feeds)[ago[-1].name])
    names.append("ago-conv-1x1")
    # the tiled contraction's epilogue as vectors: GELU's erf along a tile row, 13 rows
    feeds = {"x": rng.standard_normal((13, 37)).astype(np.float32),
             "w": (rng.standard_normal((37, 44)) / 6).astype(np.float32)}
    mm = kg.matmul(kg.tensor("x", (13, 37)), kg.tensor("w", (37, 44)))
    gelu = [mm, kg.gelu(mm)]
    kernel = kg.fuse(*gelu).emit("neon", tuning="none")
    assert "kg_acc_v" in kernel.source
    kernels.append(kernel)
    inputs.append([feeds["x"], feeds["w"]])
    wants.append(evaluate_chain(gelu, feeds)[gelu[-1].name])
    names.append("gemm-gelu-vector-epilogue")
    # remapped reads as 4 x 4 register-transposed tiles (vtrnq_f32), sides cut by primes:
    # a 2-D transpose with its bias and NCHW -> NHWC
    for shape, perm in (((37, 29), (1, 0)), ((2, 13, 7, 11), (0, 2, 3, 1))):
        x = rng.standard_normal(shape).astype(np.float32)
        t = kg.transpose(kg.tensor("x", shape), perm)
        b = rng.standard_normal(t.shape[-1]).astype(np.float32)
        biased = kg.add(t, kg.tensor("b", b.shape))
        kernel = kg.fuse(t, biased, kg.relu(biased)).emit("neon", tuning="none")
        assert kernel.metadata["transposed_reads"] == ["x"]
        kernels.append(kernel)
        inputs.append([x, b])
        wants.append(np.maximum(np.transpose(x, perm) + b, 0))
        names.append(f"transposed-tiles-{len(shape)}d")

    exe = aarch64.build_harness(kernels, tmp_path)
    results = aarch64.run(exe, kernels, inputs, tmp_path, cpu="cortex-a53")
    for name, (got,), want in zip(names, results, wants):
        try:
            assert_close(got, np.asarray(want).astype(got.dtype), scale=20)
        except AssertionError as exc:
            raise AssertionError(f"{name} on AArch64:\n{exc}") from None
    assert len(results) == len(kernels) > 60
