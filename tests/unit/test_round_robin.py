"""``measure.round_robin``: calls in rounds, and the calls ``apart`` (another runtime whose
threads spin after a run) in blocks of their own just before and after the rounds."""
from __future__ import annotations

import pytest

from kernelgen.errors import ArgumentError
from kernelgen.measure import round_robin


def test_calls_apart_run_in_blocks_around_the_rounds() -> None:
    order: list[str] = []
    times = round_robin({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                        warmup=1, repeat=4, apart={"ort": lambda: order.append("ort")})
    # warm-up and the first half of its runs, the rounds (warm-up first), the second half
    assert order == ["ort"] * 3 + ["a", "b"] * 5 + ["ort"] * 2
    assert {name: len(t) for name, t in times.items()} == {"a": 4, "b": 4, "ort": 4}
    assert all(t >= 0 for ts in times.values() for t in ts)


def test_blocks_inside_the_rounds_each_take_an_untimed_round_after_them() -> None:
    order: list[str] = []
    times = round_robin({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                        warmup=0, repeat=4, apart={"ort": lambda: order.append("ort")},
                        blocks=3)
    assert order == ["ort"] + ["a", "b"] * 2 + ["ort"] + ["a", "b"] * 3 + ["ort"] * 2
    assert {name: len(t) for name, t in times.items()} == {"a": 4, "b": 4, "ort": 4}


def test_without_apart_every_call_is_in_the_rounds() -> None:
    order: list[str] = []
    times = round_robin({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                        warmup=0, repeat=3)
    assert order == ["a", "b"] * 3
    assert set(times) == {"a", "b"}


def test_a_name_both_in_the_rounds_and_apart_is_refused() -> None:
    with pytest.raises(ArgumentError, match=r"\['a'\] named both"):
        round_robin({"a": lambda: None}, apart={"a": lambda: None})
    with pytest.raises(ArgumentError, match="blocks=1"):
        round_robin({"a": lambda: None}, apart={"b": lambda: None}, blocks=1)
