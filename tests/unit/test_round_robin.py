"""``measure.round_robin``: calls in rounds, and the calls ``apart`` (another runtime whose
threads spin after a run) in blocks of their own just before and after the rounds, each side
run untimed for a while (``measure.settle``) before it is timed after the other."""
from __future__ import annotations

import time

import pytest

from kernelgen.errors import ArgumentError
from kernelgen.measure import round_robin, settle


def test_calls_apart_run_in_blocks_around_the_rounds() -> None:
    order: list[str] = []
    times = round_robin({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                        warmup=1, repeat=4, apart={"ort": lambda: order.append("ort")},
                        settle_s=0.0)
    # warm-up and the first half of its runs, the rounds (warm-up first), an untimed run and
    # the second half
    assert order == ["ort"] * 3 + ["a", "b"] * 5 + ["ort"] * 3
    assert {name: len(t) for name, t in times.items()} == {"a": 4, "b": 4, "ort": 4}
    assert all(t >= 0 for ts in times.values() for t in ts)


def test_blocks_inside_the_rounds_each_take_an_untimed_round_after_them() -> None:
    order: list[str] = []
    times = round_robin({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                        warmup=0, repeat=4, apart={"ort": lambda: order.append("ort")},
                        blocks=3, settle_s=0.0)
    assert order == (["ort"] + ["a", "b"] * 2 + ["ort"] * 2 + ["a", "b"] * 3 + ["ort"] * 3)
    assert {name: len(t) for name, t in times.items()} == {"a": 4, "b": 4, "ort": 4}


def test_without_apart_every_call_is_in_the_rounds() -> None:
    order: list[str] = []
    times = round_robin({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                        warmup=0, repeat=3, settle_s=0.0)
    assert order == ["a", "b"] * 3
    assert set(times) == {"a", "b"}


def test_a_name_both_in_the_rounds_and_apart_is_refused() -> None:
    with pytest.raises(ArgumentError, match=r"\['a'\] named both"):
        round_robin({"a": lambda: None}, apart={"a": lambda: None})
    with pytest.raises(ArgumentError, match="blocks=1"):
        round_robin({"a": lambda: None}, apart={"b": lambda: None}, blocks=1)


def test_settling_runs_until_its_time_has_passed() -> None:
    calls: list[float] = []
    start = time.perf_counter()
    settle({"a": lambda: calls.append(time.perf_counter())}, rounds=2, seconds=0.03)
    assert len(calls) > 2 and calls[-1] - start >= 0.03 - 1e-3
    calls.clear()
    settle({"a": lambda: calls.append(time.perf_counter())}, rounds=3, seconds=0.0)
    assert len(calls) == 3


def test_the_side_timed_after_the_other_first_runs_untimed_for_settle_s() -> None:
    order: list[str] = []
    round_robin({"a": lambda: order.append("a")}, warmup=1, repeat=2,
                apart={"ort": lambda: order.append("ort")}, settle_s=0.02)
    # without settling: ort, ort (warm-up, first half), a, a, a (warm-up, rounds), ort, ort,
    # ort (an untimed run, the second half)
    last_a = len(order) - 1 - order[::-1].index("a")
    assert order.index("a") > 2  # onnxruntime kept running untimed for 20 ms first
    assert order.count("a") > 3  # and the rounds' calls after it
    assert len(order) - 1 - last_a > 2  # and onnxruntime again after the rounds
