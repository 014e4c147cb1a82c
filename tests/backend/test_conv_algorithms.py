"""Convolution algorithms (direct, implicit GEMM, im2col + GEMM, Winograd F(2x2,3x3) and F(4x4,3x3))
on every backend against ONNX's reference, each with a fused prologue and epilogue, on awkward
shapes: odd channels, batch 2, sizes that leave partial Winograd tiles, asymmetric pads, stride 2,
1x1 and 7x7 kernels, 1-D, dilation, weights that are not constants. Then the choice between them:
the heuristic, the measured choice stored in the Fast-Run database, and a wrong candidate that the
tuner must discard."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import sympy
from conftest import assert_close, require
from reference import evaluate_chain

import kernelgen as kg
import kernelgen.tune
from kernelgen import backends, fastrun
from kernelgen.backends import Config
from kernelgen.backends.opencl import OpenCL
from kernelgen.compile.conv_algorithms import ALGORITHMS, WINOGRAD_TILES, applicable, heuristic
from kernelgen.compile.winograd import (WINOGRAD4_AT, WINOGRAD4_BT, WINOGRAD4_G, WINOGRAD_BT,
                                        _bt_row)
from kernelgen.exec import Kernel, Program
from kernelgen.tune import tune, tune_algorithm

BACKENDS = ["opencl", "neon", "triton"]


@dataclass(frozen=True)
class ConvCase:
    name: str
    x: tuple[int, ...]
    w: tuple[int, ...]
    attrs: dict
    bias: bool = True
    constant_w: bool = True

    def build(self) -> tuple[list[kg.Op], dict[str, np.ndarray], kg.Op]:
        """relu prologue -> Conv -> sigmoid and a residual-free broadcast multiply epilogue."""
        rng = np.random.default_rng(len(self.name))
        arrays = {"x": rng.standard_normal(self.x).astype(np.float32),
                  "w": (rng.standard_normal(self.w) / 3).astype(np.float32),
                  "b": rng.standard_normal(self.w[0]).astype(np.float32)}
        x = kg.tensor("x", self.x)
        w = kg.constant("w", arrays["w"]) if self.constant_w else kg.tensor("w", self.w)
        b = [kg.constant("b", arrays["b"])] if self.bias else []
        pre = kg.relu(x)
        conv = kg.conv(pre, w, *b, **self.attrs)
        post = kg.sigmoid(conv)
        return [pre, conv, post], arrays, conv


CASES = [
    ConvCase("3x3-pad-asym-odd", (2, 5, 7, 9), (6, 5, 3, 3), {"pads": [1, 0, 1, 2]}),
    ConvCase("3x3-valid-partial-tiles", (1, 3, 5, 4), (4, 3, 3, 3), {}, bias=False),
    ConvCase("3x3-tensor-weights", (1, 2, 6, 7), (3, 2, 3, 3), {"pads": [1, 1, 1, 1]},
             constant_w=False),
    ConvCase("1x1-stride2", (2, 7, 5, 6), (3, 7, 1, 1), {"strides": [2, 2]}),
    ConvCase("7x7-stride2", (1, 3, 11, 11), (2, 3, 7, 7),
             {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ConvCase("3x3-dilation", (1, 2, 9, 7), (3, 2, 3, 3),
             {"dilations": [2, 1], "pads": [2, 1, 2, 1]}),
    ConvCase("1d", (2, 3, 17), (4, 3, 5), {"pads": [2, 2]}),
]


def _check(case: ConvCase, backend: str, algorithm: str) -> kg.FusedOp:
    ops, arrays, _ = case.build()
    want = evaluate_chain(ops, arrays)[ops[-1].name]
    fused = kg.fuse(*ops)
    program = fused.emit(backend, algorithm=algorithm)
    got = program(*(arrays[v.name] for v in fused.inputs))
    assert_close(got, want, scale=50)
    return fused


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_applicable_algorithm(case: ConvCase, backend: str) -> None:
    require(backend)
    ops, _, _ = case.build()
    usable = [a for a, why in applicable(kg.fuse(*ops)).items() if why is None]
    assert {"direct", "implicit_gemm", "im2col"} <= set(usable)
    square_unit = case.w[2:] == (3, 3) and "strides" not in case.attrs \
        and "dilations" not in case.attrs
    assert ("winograd" in usable) == ("winograd_4x4" in usable) == square_unit
    for algorithm in usable:
        _check(case, backend, algorithm)


@pytest.mark.parametrize("backend", BACKENDS)
def test_program_shape(backend: str) -> None:
    """im2col is one kernel on every backend, whose pack gathers the patches into panels
    (implicit GEMM reads them in place). Winograd is three kernels once the constant filter
    transform is folded; the metadata says which algorithm ran and lists every stage. F(4x4)
    runs (4+2)^2 = 36 GEMMs on 4x4 output tiles."""
    require(backend)
    ops, _, conv = CASES[0].build()
    n, m, oh, ow = conv.shape
    fused = kg.fuse(*ops)
    im2col = fused.emit(backend, algorithm="im2col")
    # one kernel: its pack gathers the patches (on Triton the left operand, on the others the
    # right one)
    assert isinstance(im2col, Kernel) and im2col.metadata["packed_operand_reads"] == ["x"]
    implicit = fused.emit(backend, algorithm="implicit_gemm")
    assert "packed_operand_reads" not in implicit.metadata
    if backend != "neon":  # panels in a scratch buffer; the implicit GEMM has none
        assert im2col.metadata["launch"]["scratch_bytes"] > 0
        assert "scratch_bytes" not in implicit.metadata["launch"]
    for algorithm, tile in WINOGRAD_TILES.items():
        winograd = fused.emit(backend, algorithm=algorithm)
        assert isinstance(winograd, Program) and len(winograd.kernels) == 3
        assert winograd.metadata["algorithm"] == algorithm
        gemm = winograd.metadata["stages"][1]
        assert gemm["schedule"] == "tiled"
        assert gemm["args"][-1]["shape"] == [tile + 2, tile + 2, m, n, -(-oh // tile),
                                             -(-ow // tile)]
        assert any(name.startswith("winogradfilter")
                   for name in winograd.metadata["folded_constants"])
        assert "stage 2" in winograd.source


@pytest.mark.parametrize("strides", [[1, 1], [2, 2], [3, 2]])
def test_neon_im2col_packs_patches_in_cache_sized_blocks(strides: list[int]) -> None:
    """NEON's im2col is one kernel whose pack gathers the patches (prologue applied) of a
    block of output pixels at a time. With 3 KiB blocks (2 panels of 8 pixels x 45 taps),
    the 36 panels of a batch-2 conv run in 18 blocks (at stride 2, 11 panels in 6, the last
    partial), and panels cross images and output rows (11 or 6 pixels a row: vectors of 4
    and single lanes). A stride of 3 along the row does not vectorise, so the weights would
    be the packed operand: im2col then runs as the patch matrix and a GEMM."""
    require("neon")
    case = ConvCase("blocks", (2, 5, 13, 11), (6, 5, 3, 3), {"pads": [1, 1, 1, 1],
                                                             "strides": strides})
    ops, arrays, _ = case.build()
    want = evaluate_chain(ops, arrays)[ops[-1].name]
    fused = kg.fuse(*ops)
    got = fused.emit("neon", algorithm="im2col", tuning="none", pack_block_kib=3)
    if strides[1] == 3:
        assert isinstance(got, Program)
    else:
        assert isinstance(got, Kernel) and got.metadata["pack_panels"] == 2
        assert "kg_p0 += 2)" in got.source
    assert_close(got(*(arrays[v.name] for v in fused.inputs)), want, scale=50)


def test_winograd_input_transform_rows_are_lavin_grays() -> None:
    """The input transform's taps and signs, folded into index arithmetic, rebuild Bᵀ."""
    for a in range(4):
        row = np.zeros(4, np.float32)
        for column, negative in _bt_row(sympy.Integer(a)):
            row[int(column)] += -1.0 if negative else 1.0
        np.testing.assert_array_equal(row, WINOGRAD_BT[a])


def test_winograd_4x4_matrices_compute_a_correlation() -> None:
    """F(4x4,3x3)'s G, Bᵀ and Aᵀ give the 4x4 valid correlation of a 6x6 tile, against NumPy
    in float64 (the matrices are Lavin & Gray's at the points 0, +-1, +-2)."""
    rng = np.random.default_rng(4)
    g, bt, at = (m.astype(np.float64) for m in (WINOGRAD4_G, WINOGRAD4_BT, WINOGRAD4_AT))
    for _ in range(3):
        d, k = rng.standard_normal((6, 6)), rng.standard_normal((3, 3))
        want = np.array([[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(4)] for i in range(4)])
        got = at @ ((g @ k @ g.T) * (bt @ d @ bt.T)) @ at.T
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_winograd_4x4_error_on_a_deep_conv() -> None:
    """F(4x4)'s transforms scale values by up to 8 and 1/24, so its float32 error is larger
    than F(2x2)'s: on 512 input channels (4608-term sums) it must stay within 1e-4 of the
    output's scale against a float64 NumPy correlation (measured: 1.7e-5; F(2x2) 8.7e-7)."""
    require("opencl")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 512, 12, 16)).astype(np.float32)
    w = (rng.standard_normal((8, 512, 3, 3)) / np.sqrt(9 * 512)).astype(np.float32)
    fused = kg.fuse(kg.conv(kg.tensor("x", x.shape), kg.constant("w", w), pads=[1, 1, 1, 1]))
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(np.einsum("mc,nchw->nmhw", w[:, :, i, j].astype(np.float64),
                         padded[:, :, i:i + 12, j:j + 16]) for i in range(3) for j in range(3))
    got = fused.emit("opencl", algorithm="winograd_4x4", tuning="none")(x, w)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_folded_constant_must_not_change() -> None:
    require("opencl")
    ops, arrays, _ = CASES[0].build()
    fused = kg.fuse(*ops)
    program = fused.emit("opencl", algorithm="winograd")
    feeds = [arrays[v.name] for v in fused.inputs]
    program(*feeds)
    feeds[[v.name for v in fused.inputs].index("w")] = arrays["w"] + 1
    with pytest.raises(kg.ArgumentError, match="constant 'w' was folded"):
        program(*feeds)


def test_inapplicable_algorithm_names_the_reason() -> None:
    x, w = kg.tensor("x", (1, 4, 6, 6)), kg.tensor("w", (4, 1, 3, 3))
    depthwise = kg.fuse(kg.conv(x, w, group=4, pads=[1, 1, 1, 1]))
    with pytest.raises(kg.UnsupportedError, match="winograd.*group 1"):
        depthwise.emit("opencl", algorithm="winograd")
    with pytest.raises(kg.UnsupportedError, match="im2col.*group == 1"):
        depthwise.emit("opencl", algorithm="im2col")
    with pytest.raises(kg.UnsupportedError, match="unknown algorithm"):
        depthwise.emit("opencl", algorithm="fft")
    gemm = kg.fuse(kg.matmul(kg.tensor("a", (3, 4)), kg.tensor("b", (4, 5))))
    with pytest.raises(kg.UnsupportedError, match="exactly one Conv"):
        gemm.emit("opencl", algorithm="im2col")


def test_heuristic_when_nothing_is_measured() -> None:
    def pick(x: tuple[int, ...], w: tuple[int, ...], backend: str = "opencl",
             **attrs: object) -> str:
        be = backends.get(backend)
        if isinstance(be, OpenCL):  # what a CPU gets, whichever device this process has
            be = be.for_device("cpu-avx512")
        return heuristic(kg.fuse(kg.conv(kg.tensor("x", x), kg.tensor("w", w), **attrs)),
                         be.caps)

    resnet_3x3 = ((1, 64, 56, 56), (64, 64, 3, 3))
    assert pick(*resnet_3x3, pads=[1, 1, 1, 1]) == "winograd_4x4"
    gpu = backends.get("opencl").for_device("desktop-gpu")  # F(4x4) measured on CPUs only
    assert heuristic(kg.fuse(kg.conv(kg.tensor("x", resnet_3x3[0]), kg.tensor(
        "w", resnet_3x3[1]), pads=[1, 1, 1, 1])), gpu.caps) == "winograd"
    assert pick((1, 64, 14, 14), (64, 64, 3, 3), pads=[1, 1, 1, 1]) == "winograd"  # 4 ∤ 14
    assert pick(*resnet_3x3, "neon", pads=[1, 1, 1, 1]) == "im2col"  # blocked, one kernel
    assert pick((1, 128, 28, 28), (128, 128, 3, 3), "neon", pads=[1, 1, 1, 1]) == "winograd"
    assert pick((1, 64, 56, 56), (128, 64, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2]) == "im2col"
    assert pick((1, 64, 56, 56), (256, 64, 1, 1)) == "implicit_gemm"  # im2col would copy x
    assert pick((1, 64, 56, 56), (256, 64, 1, 1), "neon") == "im2col"
    assert pick((1, 64, 56, 56), (64, 1, 3, 3), group=64) == "direct"
    assert pick((1, 3, 7, 7), (4, 3, 3, 3)) == "implicit_gemm"  # too small to split
    assert pick((1, 16, 5, 5), (16, 16, 3, 3), "neon", pads=[1, 1, 1, 1]) == "implicit_gemm"
    # small maps on CPUs: split all the same (the implicit GEMM measured 2-20x slower there)
    late_3x3 = ((1, 512, 7, 7), (512, 512, 3, 3))
    # a 7x7 map: F(2x2) computes 64 outputs for 49, im2col's wrapped run beat it on OpenCL
    assert pick(*late_3x3, pads=[1, 1, 1, 1]) == "im2col"
    assert pick((1, 48, 13, 13), (192, 48, 3, 3), pads=[1, 1, 1, 1]) == "winograd"
    assert pick((1, 160, 6, 6), (320, 160, 3, 3), pads=[1, 1, 1, 1]) == "winograd"
    assert pick(*late_3x3, "neon", pads=[1, 1, 1, 1]) == "winograd"
    assert pick(*late_3x3, "triton", pads=[1, 1, 1, 1]) == "implicit_gemm"  # GPU: unmeasured
    assert pick((1, 32, 13, 13), (128, 32, 5, 5), pads=[2, 2, 2, 2]) == "im2col"
    assert pick((1, 512, 14, 14), (512, 512, 3, 3), "neon", pads=[1, 1, 1, 1],
                strides=[2, 2]) == "im2col"
    assert pick((1, 480, 13, 13), (192, 480, 1, 1)) == "implicit_gemm"
    # few input channels: im2col (Winograd's GEMMs would reduce over C alone)
    assert pick((1, 16, 55, 55), (64, 16, 3, 3), pads=[1, 1, 1, 1]) == "im2col"
    assert pick((1, 3, 224, 224), (64, 3, 3, 3), strides=[2, 2]) == "im2col"  # a stem
    assert pick((1, 48, 13, 13), (192, 48, 3, 3), "neon", pads=[1, 1, 1, 1]) == "im2col"
    assert pick((1, 480, 13, 13), (192, 480, 1, 1), "neon") == "im2col"
    assert set(ALGORITHMS) == {"direct", "implicit_gemm", "im2col", "winograd", "winograd_4x4"}


def test_measured_choice_is_stored_and_used_by_default(tmp_path, monkeypatch) -> None:
    """tune_algorithm measures every algorithm, stores the fastest; a later emit() with no
    arguments uses it (and stored tiles), a cold database falls back to the heuristic."""
    require("opencl")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    ops, arrays, _ = CASES[1].build()
    fused = kg.fuse(*ops)
    assert fastrun.stored_algorithm(fused, "opencl") is None
    result = tune_algorithm(fused, "opencl", repeat=3, budget_s=math.inf,
                            progress=lambda *a: None)
    statuses = {c.config.as_options()["algorithm"]: c.status for c in result.candidates}
    assert set(statuses) == set(ALGORITHMS)
    assert all(s == "ok" for s in statuses.values()), statuses
    best = result.best.as_options()["algorithm"]
    assert fastrun.stored_algorithm(fused, "opencl") == best
    default = fused.emit("opencl")
    assert isinstance(default, Program) == (best in ("im2col", *WINOGRAD_TILES))
    want = evaluate_chain(ops, arrays)[ops[-1].name]
    assert_close(default(*(arrays[v.name] for v in fused.inputs)), want, scale=50)


def test_stored_tiles_are_used_by_default(tmp_path, monkeypatch) -> None:
    """The templates take their tunables from the Fast-Run database without being asked."""
    require("opencl")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    from kernelgen.backends.opencl.columns import register_tiles

    fused = kg.fuse(kg.matmul(kg.tensor("a", (13, 17)), kg.tensor("b", (17, 19))))
    default = register_tiles(backends.get("opencl").caps).default[0]
    assert fused.emit("opencl").metadata["tunables"]["tile"][0] == default
    loop = fused.lower()
    tune(loop, "opencl", configs=[Config.of(tile=(2, 8))], repeat=2)
    tunables = fused.emit("opencl").metadata["tunables"]
    assert tunables["tile"] == (2, 8)
    assert fused.emit("opencl", tuning="none").metadata["tunables"]["tile"][0] == default
    assert fused.emit("opencl", tile=(1, 32)).metadata["tunables"]["tile"][0] == 1  # explicit


def test_tuner_discards_a_wrong_algorithm(tmp_path, monkeypatch) -> None:
    """A candidate that computes the wrong thing is discarded however fast it is."""
    require("opencl")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    ops, _, _ = CASES[1].build()
    fused = kg.fuse(*ops)
    real: Callable = kernelgen.tune.compile

    def sabotaged(block: kg.FusedBlock, backend: object, *, algorithm: str,
                  **kw: object) -> object:
        made = real(block, backend, algorithm=algorithm, **kw)
        if algorithm != "winograd":
            return made
        return lambda *arrays: made(*arrays) + 1e-2  # Winograd with a wrong last digit

    monkeypatch.setattr(kernelgen.tune, "compile", sabotaged)
    result = tune_algorithm(fused, "opencl", repeat=2, budget_s=math.inf,
                            progress=lambda *a: None)
    statuses = {c.config.as_options()["algorithm"]: c.status for c in result.candidates}
    assert statuses["winograd"] == "wrong"
    assert result.best.as_options()["algorithm"] != "winograd"
