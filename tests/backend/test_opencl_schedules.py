"""Which OpenCL schedule a block gets where the choice once went wrong, and that the block then
matches ONNX's reference evaluator on every backend."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, run
from reference import evaluate_chain

import kernelgen as kg
from kernelgen import ops


# not Triton: its interpreter ran this chain's fused kernel (780 lines of scalar code, each
# softmax recomputed per point) for 88 s on a Zen 1 CPU; the random-chain tests run Triton on
# chains of this kind up to 1e5 operations
@pytest.mark.parametrize("backend", ["interp", "opencl", "neon"], indirect=True)
def test_few_outputs_with_short_reductions_are_not_a_work_group_each(backend: str) -> None:
    """softmax, softmax, pad, reduce-max, softmax over 3x3x2 (drawn by the random-chain test):
    12 outputs made 'few groups', so each became a work-group of 4 cooperating on reductions
    of 2-4 terms, and PoCL 3.1's work-group compiler ran on that kernel for over half an hour.
    Reductions this short stay within one work-item (schedule.GROUP_FEW_REDUCE_MIN)."""
    x = kg.tensor("x", (3, 3, 2))
    a = kg.softmax(x, 2)
    b = kg.softmax(a, 0)
    c = kg.pad(b, [0, 0, 0, 1, 1, 1], 0.25)
    d = ops.reduce_op("ReduceMax", c, [0], 1)
    chain = [a, b, c, d, kg.softmax(d, 2)]
    fused = kg.fuse(*chain, force=True)
    if backend == "opencl":  # checked before running: the old schedule does not come back
        assert fused.emit("opencl").metadata["schedule"] != "group"
    X = np.random.default_rng(706).standard_normal((3, 3, 2)).astype(np.float32)
    want = evaluate_chain(chain, {"x": X})[chain[-1].name]  # as the random-chain test checks
    (got,) = run(backend, fused, X)
    assert_close(got, want, "float32")
