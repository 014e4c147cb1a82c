"""Contraction operands whose rows are a multiple of 4 KiB long (they alias in the L1 cache)
are read from copies with longer rows on OpenCL (``kernelgen/compile/padding.py``) when the block
does not pack its right operand in panels: the result equals NumPy's, a constant operand is
padded when the program is built, other rows, other backends and packed blocks are left alone."""
from __future__ import annotations

import numpy as np
from conftest import assert_close, require

import kernelgen as kg
from kernelgen.exec import Kernel
from kernelgen.compile.padding import PAD_ELEMENTS, aliased_operands
from kernelgen.exec import Program

rng = np.random.default_rng(17)


def test_only_long_float_rows_a_multiple_of_4_kib_are_padded() -> None:
    a, b = kg.tensor("a", (256, 1024)), kg.tensor("b", (1024, 48))  # 4 KiB rows, 1 MiB
    assert [v.name for v in aliased_operands(kg.fuse(kg.matmul(a, b)))] == ["a"]
    small = kg.tensor("small", (64, 1024))  # 4 KiB rows, but 256 KiB in all
    assert aliased_operands(kg.fuse(kg.matmul(small, b))) == []
    odd = kg.tensor("odd", (256, 1000))
    assert aliased_operands(kg.fuse(kg.matmul(odd, kg.tensor("c", (1000, 48))))) == []
    assert aliased_operands(kg.fuse(kg.relu(a))) == []  # no contraction


def test_padded_operands_give_numpy_s_product() -> None:
    """A MatMul with a bias and ReLU epilogue, its right operand not packed: ``a`` (4 KiB
    rows) is copied by a Pad kernel, the constant ``w`` (8 KiB rows) padded at build time; the
    block reads both through a Slice folded into its loads."""
    require("opencl")
    m, k, n = 259, 1024, 2048
    a = rng.standard_normal((m, k), np.float32)
    w = rng.standard_normal((k, n), np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    mm = kg.matmul(kg.tensor("a", (m, k)), kg.constant("w", w))
    out = kg.relu(kg.add(mm, kg.constant("bias", bias)))
    fused = kg.fuse(mm, out.inputs[0], out)
    program = fused.emit("opencl", tuning="none", pack=False)
    assert isinstance(program, Program) and len(program.kernels) == 2
    assert program.metadata["padded"] == ["a", "w"]
    assert program.metadata["folded_constants"] == ["w_padded"]
    assert f"{k + PAD_ELEMENTS} * " in program.kernels[0].source  # the copy's rows
    assert f"{n + PAD_ELEMENTS} * " in program.kernels[1].source  # the GEMM reads w's copy
    want = np.maximum(a.astype(np.float64) @ w + bias, 0).astype(np.float32)
    assert_close(program(a, w, bias), want, scale=30)


def test_other_backends_short_rows_and_several_outputs_stay_one_kernel() -> None:
    require("opencl")
    require("neon")
    a, b = kg.tensor("a", (256, 1024)), kg.tensor("b", (1024, 48))
    fused = kg.fuse(kg.matmul(a, b))
    assert isinstance(fused.emit("neon", tuning="none"), Kernel)
    odd = kg.fuse(kg.matmul(kg.tensor("a", (256, 1000)), kg.tensor("b", (1000, 48))))
    assert isinstance(odd.emit("opencl", tuning="none"), Kernel)
    mm = kg.matmul(a, b)  # two outputs: one kernel returns both
    both = kg.fuse(mm, kg.relu(mm), outputs=[mm])
    assert isinstance(both.emit("opencl", tuning="none"), Kernel)


def test_a_block_that_packs_its_right_operand_is_not_padded() -> None:
    """The same sizes packed by default (many row tiles read ``w``): one kernel, whose panels
    do not alias, reading ``a`` and ``w`` as they are."""
    require("opencl")
    m, k, n = 259, 1024, 2048
    a = rng.standard_normal((m, k), np.float32)
    w = rng.standard_normal((k, n), np.float32)
    kernel = kg.fuse(kg.matmul(kg.tensor("a", (m, k)), kg.constant("w", w))).emit(
        "opencl", tuning="none")
    assert isinstance(kernel, Kernel) and kernel.metadata["tunables"]["pack"]
    assert_close(kernel(a, w), (a.astype(np.float64) @ w).astype(np.float32), scale=30)
