"""A costly term that a row's hoisted reduction and its stores both compute (the softmax's
exp(x - max): summed, then divided by the sum) is staged once per row
(``lower/staging.py: stage_shared_terms``), so each exp is computed once. Equal to NumPy on every
backend on awkward rows; every OpenCL schedule runs it (those that cannot hold a row get the
unstaged kernel); kernels that share no costly term are left as they were."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, opencl_caps, run

import kernelgen as kg

inf = np.inf


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(wide - wide.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def _rows(shape: tuple[int, ...]) -> np.ndarray:
    """Normal values with, where the rows are long enough, a -inf (weight 0), a huge value
    (weight 1) and a row of equal values."""
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32) * 3
    flat = x.reshape(-1, shape[-1])
    if shape[-1] > 2 and flat.shape[0] > 2:
        flat[0, 1], flat[1, 2], flat[2] = -inf, 1e30, 0.5
    return x


@pytest.mark.parametrize("shape", [(3, 1), (5, 37), (2, 300), (4, 3, 13), (7, 16, 29)],
                         ids=lambda s: "x".join(map(str, s)))
def test_softmax_with_its_exp_row_staged_equals_numpy(backend: str, shape) -> None:
    x = _rows(shape)
    s = np.array([0.7], np.float32)
    mask = np.where(np.arange(shape[-1]) % 5 == 4, -1e4, 0.0).astype(np.float32)
    xt, st, mt = kg.tensor("x", shape), kg.tensor("s", (1,)), kg.tensor("mask", mask.shape)
    m = kg.mul(xt, st)
    a = kg.add(m, mt)
    fused = kg.fuse(m, a, kg.softmax(a, -1))
    arrays = {"x": x, "s": s, "mask": mask}
    (got,) = run(backend, fused, *(arrays[v.name] for v in fused.inputs))
    assert_close(got, _softmax(x * s + mask), "float32")


def test_the_exp_row_is_staged_and_the_sum_reads_it() -> None:
    loop = kg.fuse(kg.softmax(kg.tensor("x", (6, 40)), 1)).lower()
    assert len(loop.staged) == 1
    listing = str(loop).splitlines()
    staged = [line for line in listing if line.startswith("  staged: ")]
    assert len(staged) == 1 and "= exp(sub(x[" in staged[0]
    assert any(line.startswith("  hoisted: sum[") and "(stage0[" in line for line in listing)
    assert listing[-1].split(" = ")[1].startswith("mul(stage0[o1], div(1.0, sum[")


@pytest.mark.parametrize("build", [
    lambda x: kg.log_softmax(x, 1),  # the stores compute log(sum), not the exp term
    lambda x: kg.layer_normalization(x, kg.constant("g", np.ones(40, np.float32)),
                                     kg.constant("b", np.zeros(40, np.float32)), axis=1),
    lambda x: kg.div(x, kg.reduce_sum(kg.exp(x), axes=[1], keepdims=1)),  # exp(x), no max
], ids=["log_softmax", "layer_norm", "exp_over_sum"])
def test_kernels_without_a_shared_costly_term_are_not_staged(build) -> None:
    x = kg.tensor("x", (6, 40))
    out = build(x)
    ops = [op for op in (*out.inputs, out) if isinstance(op, kg.Op)]
    assert not kg.fuse(*ops).lower().staged


@pytest.mark.parametrize("options", [{}, {"schedule": "row", "group_rows": 2},
                                     {"schedule": "group"}, {"schedule": "item"}],
                         ids=["default", "row-2-rows", "group", "item"])
def test_every_opencl_schedule_runs_a_staged_softmax(options: dict) -> None:
    """'group' and 'item' cannot hold a row per group point in this form: they get the
    unstaged kernel (no staged_rows in the metadata); 'row' keeps the staged row where the
    device reduces a row in one work-item (a CPU), where it also shares it between rows."""
    cpu = opencl_caps().simd_within_work_item
    x = _rows((6, 40))
    fused = kg.fuse(kg.softmax(kg.tensor("x", x.shape), 1))
    if not cpu and "group_rows" in options:  # nothing staged to share on a GPU
        with pytest.raises(ValueError, match="group_rows must be one of \\(1,\\)"):
            fused.emit("opencl", tuning="none", **options)
        return
    kernel = fused.emit("opencl", tuning="none", **options)
    staged = cpu and options.get("schedule", "row") == "row"
    assert bool(kernel.metadata.get("staged_rows")) == staged
    assert_close(kernel(x), _softmax(x), "float32")


@pytest.mark.parametrize("target", ["cpu-avx2", "neon"])
def test_short_rows_take_several_a_work_item_by_default(target: str) -> None:
    """A softmax's staged exp row shares no loads between rows, so long rows keep one a
    work-item; rows of at most 128 floats take up to 8 (a work-item's overhead amortised),
    leaving at least 8 work-items. Generated for a declared CPU and for NEON C."""
    from kernelgen import backends
    backend = backends.REGISTRY["opencl"].for_device(target) if target.startswith("cpu") \
        else backends.get(target)  # type: ignore[attr-defined]

    def rows(shape: tuple[int, ...]) -> int:
        kernel = kg.fuse(kg.softmax(kg.tensor("x", shape), -1)).emit(backend, tuning="none")
        return int(kernel.metadata["tunables"]["group_rows"])
    assert rows((64, 128)) == 8 and rows((11, 5, 64)) == 5  # 55 rows: 5 divides them
    assert rows((64, 129)) == rows((1024, 4096)) == 1
    assert rows((40, 128)) == 5  # 8 rows would leave 5 work-items


def test_softmax_over_a_strided_axis_equals_numpy(backend: str) -> None:
    """The row runs along the outer axis (softmax over axis 0): staged where the schedule
    holds a row, unstaged where it does not; right either way."""
    x = _rows((37, 5))
    (got,) = run(backend, kg.fuse(kg.softmax(kg.tensor("x", x.shape), 0)), x)
    assert_close(got, _softmax(x, 0), "float32")
