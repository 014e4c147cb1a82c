"""AGO's no-redundancy constraint from index maps: the redundancy of consumer tilings for
Conv -> 1x1 Conv, Conv -> 3x3 Conv (halo) and MatMul -> MatMul, and the tuner rejecting
tilings that recompute."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import require

import kernelgen as kg
from kernelgen.backends import Config
from kernelgen.fastrun import FastRunDB
from kernelgen.tune import tune
from kernelgen.mapping_types.tiling import no_redundancy_constraint, producer_region, redundancy


def _conv_pair(k: int) -> kg.Op:
    x = kg.tensor("x", (1, 8, 12, 12))
    producer = kg.conv(x, kg.tensor("w1", (8, 8, 3, 3)), pads=[1, 1, 1, 1])
    pad = (k - 1) // 2
    return kg.conv(producer, kg.tensor("w2", (6, 8, k, k)), pads=[pad] * 4)


def test_one_by_one_consumer_needs_full_channel_tiles() -> None:
    m = _conv_pair(1).index_maps[0]
    assert redundancy(m, (1, 6, 4, 4)) == 1.0  # every tile covers all producer channels once
    assert redundancy(m, (1, 3, 4, 4)) == 2.0  # two channel tiles each recompute the producer
    assert producer_region(m, [(0, 1), (0, 6), (4, 8), (0, 12)]) == [(0, 1), (0, 8), (4, 8),
                                                                      (0, 12)]


@pytest.mark.parametrize("t", [2, 3, 4, 5, 12])
def test_three_by_three_halo_ratio(t: int) -> None:
    m = _conv_pair(3).index_maps[0]
    starts = range(0, 12, t)
    per_axis = sum(min(s + t, 12) + 1 - max(s - 1, 0) - (1 if s + t >= 12 else 0)
                   for s in starts)  # each tile reads one more row on each inner side
    assert redundancy(m, (1, 6, t, t)) == pytest.approx(per_axis ** 2 / 144)
    assert (redundancy(m, (1, 6, t, t)) == 1.0) == (t == 12)


def test_matmul_chain() -> None:
    first = kg.matmul(kg.tensor("a", (16, 8)), kg.tensor("b", (8, 12)))
    second = kg.matmul(first, kg.tensor("d", (12, 10)))
    m = second.index_maps[0]
    assert redundancy(m, (4, 10)) == 1.0
    assert redundancy(m, (4, 5)) == 2.0
    assert redundancy(m, (16, 1)) == 10.0


def test_tuner_rejects_recomputing_tilings(tmp_path: Path) -> None:
    require("opencl")
    consumer = _conv_pair(1)
    check = no_redundancy_constraint(consumer.index_maps[0],
                                     lambda o: (1, o["tile"][0], 4, 4))
    assert check(Config.of(tile=(6, 4))) is None
    assert "redundancy 2.000" in check(Config.of(tile=(3, 4)))
    loop = kg.fuse(kg.relu(kg.tensor("y", (5, 7)))).lower()
    configs = [Config.of(tile=(3, 4)), Config.of(tile=(6, 4))]
    result = tune(loop, "opencl", [np.ones((5, 7), np.float32)], configs=configs,
                  build=lambda c: kg.compile_loop(loop, "opencl"), constraint=check,
                  db=FastRunDB(tmp_path / "db"), repeat=2)
    assert result.candidates[0].status.startswith("rejected: tiling recomputes")
    assert result.best == Config.of(tile=(6, 4))
