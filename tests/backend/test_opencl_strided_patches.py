"""Stride-2 patches in OpenCL's tiled contraction (``columns.column_plan``): on a CPU whose
output rows take 16-lane vectors, a stride-2 conv's patches are read as every second float
(``kg_vload_even16``), packed in the tiles by im2col (one kernel) or read in place by the
implicit GEMM; narrower rows keep im2col's patch matrix and GEMM. Generated for a declared
AVX-512 CPU and for AVX2, run here against ONNX's reference on awkward shapes: asymmetric pads,
prime widths, two images, a 7x7 stem and a strided 1x1."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, require, require_vectors_of
from reference import evaluate_chain

import kernelgen as kg
from kernelgen import backends
from kernelgen.exec import Kernel, Program

rng = np.random.default_rng(61)


def _block(x_shape: tuple[int, ...], w_shape: tuple[int, ...], **attrs: object
           ) -> tuple[kg.FusedOp, list[kg.Op], dict[str, np.ndarray]]:
    """relu -> stride-2 Conv (constant weights and bias) -> sigmoid."""
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "w": (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(
                 np.float32),
             "b": rng.standard_normal(w_shape[0]).astype(np.float32)}
    pre = kg.relu(kg.tensor("x", x_shape))
    conv = kg.conv(pre, kg.constant("w", feeds["w"]), kg.constant("b", feeds["b"]),
                   strides=[2, 2], **attrs)  # type: ignore[arg-type]
    ops = [pre, conv, kg.sigmoid(conv)]
    return kg.fuse(*ops), ops, feeds


def _target(name: str):
    return backends.REGISTRY["opencl"].for_device(name)  # type: ignore[attr-defined]


WIDE = {  # output rows of 16 columns and more
    "3x3-asym-pads-2-images": ((2, 5, 9, 69), (6, 5, 3, 3), {"pads": [1, 2, 0, 1]}),
    "7x7-stem": ((1, 3, 23, 63), (8, 3, 7, 7), {"pads": [3, 3, 3, 3]}),
    "1x1-prime-width": ((1, 7, 6, 67), (5, 7, 1, 1), {}),
}


@pytest.mark.parametrize("algorithm", ["im2col", "implicit_gemm"])
@pytest.mark.parametrize("name", WIDE)
def test_wide_strided_rows_read_every_second_float(name: str, algorithm: str) -> None:
    require("opencl")
    x_shape, w_shape, attrs = WIDE[name]
    fused, ops, feeds = _block(x_shape, w_shape, **attrs)
    kernel = fused.emit(_target("cpu-avx512"), tuning="none", algorithm=algorithm)
    # one kernel: im2col's pack gathers the patches, the implicit GEMM reads them in place
    assert isinstance(kernel, Kernel) and "kg_vload_even16(x + " in kernel.source
    reads = "packed_operand_reads" if algorithm == "im2col" else "right_operand_reads"
    assert kernel.metadata[reads] == ["x"]
    require_vectors_of(kernel.source)
    assert_close(kernel(feeds["x"]), evaluate_chain(ops, feeds)[ops[-1].name], scale=20)


def test_narrow_strided_rows_keep_the_patch_matrix() -> None:
    """Output rows of 11 columns (8-lane runs), and any row on AVX2: the patch matrix and a
    GEMM, as before."""
    require("opencl")
    fused, ops, feeds = _block((1, 3, 9, 21), (4, 3, 3, 3), pads=[1, 1, 1, 1])
    want = evaluate_chain(ops, feeds)[ops[-1].name]
    program = fused.emit(_target("cpu-avx512"), tuning="none", algorithm="im2col")
    assert isinstance(program, Program) and len(program.kernels) == 2
    assert "kg_vload_even" not in program.kernels[1].source
    require_vectors_of(program.kernels[1].source)
    assert_close(program(feeds["x"]), want, scale=20)
    wide, _, _ = _block(*WIDE["3x3-asym-pads-2-images"][:2], pads=[1, 2, 0, 1])
    avx2 = wide.emit(_target("cpu-avx2"), tuning="none", algorithm="im2col")
    assert isinstance(avx2, Program) and len(avx2.kernels) == 2
