"""IOS's dynamic programme against brute force on small block graphs with a synthetic cost
model: the DP's schedule is optimal among every schedule the same pruning allows, respects
every dependency, and the baselines are what they say."""
from __future__ import annotations

import functools
import math
import random
from collections.abc import Hashable

import pytest

from kernelgen.graph.ios import (BlockGraph, Schedule, ScheduleError, Stage, check_schedule,
                                 greedy, ios, parts, sequential)


class Synthetic:
    """A cost model of a few cores: a parallel stage lasts as long as its longest group plus
    a launch overhead per group, but groups beyond ``cores`` share cores; a merge stage costs
    ``merge_gain`` of its blocks' sum. Blocks with the same ``label`` may merge."""

    def __init__(self, times: list[float], labels: list[str | None], cores: int = 2,
                 merge_gain: float = 0.6) -> None:
        self.times, self.labels, self.cores, self.gain = times, labels, cores, merge_gain

    def parallel(self, groups: tuple[tuple[int, ...], ...]) -> float:
        spans = [sum(self.times[b] for b in g) for g in groups]
        work = sum(spans)
        return max(max(spans), work / self.cores) + 0.05 * len(groups)

    def merge_key(self, block: int) -> Hashable | None:
        return self.labels[block]

    def merge(self, blocks: tuple[int, ...]) -> float:
        return self.gain * sum(self.times[b] for b in blocks) + 0.05


def _random_dag(rng: random.Random, n: int, density: float) -> BlockGraph:
    edges = [(a, b) for b in range(n) for a in range(b) if rng.random() < density]
    return BlockGraph.from_edges(n, edges)


def _brute_force(g: BlockGraph, cost: Synthetic, r: int, s: int) -> float:
    """The least latency over every schedule: every set of groups (a head and its remaining
    descendants, at most r blocks, at most s groups, disjoint) and every mergeable set of sinks,
    enumerated from all subsets of the remaining blocks, no chains involved."""
    full = (1 << g.n) - 1

    @functools.cache
    def best(state: int) -> float:
        if state == 0:
            return 0.0
        members = [b for b in range(g.n) if state >> b & 1]
        out = math.inf
        for heads_mask in range(1, 1 << len(members)):
            heads = [members[i] for i in range(len(members)) if heads_mask >> i & 1]
            if len(heads) > s:
                continue
            groups, used, ok = [], 0, True
            for u in heads:
                m = (1 << u) | (g.below[u] & state)
                if m & used or bin(m).count("1") > r:
                    ok = False
                    break
                used |= m
                groups.append(tuple(b for b in range(g.n) if m >> b & 1))
            if ok:
                out = min(out, best(state & ~used) + cost.parallel(tuple(sorted(groups))))
        sinks = [b for b in members if g.succs[b] & state == 0]
        for mask in range(1, 1 << len(sinks)):
            chosen = [sinks[i] for i in range(len(sinks)) if mask >> i & 1]
            keys = {cost.merge_key(b) for b in chosen}
            if 2 <= len(chosen) <= s and len(keys) == 1 and None not in keys:
                used = sum(1 << b for b in chosen)
                out = min(out, best(state & ~used) + cost.merge(tuple(chosen)))
        return out

    return best(full)


@pytest.mark.parametrize("seed", range(30))
def test_dp_is_optimal_against_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 8)
    g = _random_dag(rng, n, rng.choice([0.15, 0.3, 0.5]))
    cost = Synthetic([rng.uniform(0.1, 3.0) for _ in range(n)],
                     [rng.choice([None, "a", "b"]) for _ in range(n)], rng.choice([1, 2, 4]))
    r, s = rng.choice([(1, 2), (2, 3), (3, 8), (8, 8)])
    got = ios(g, cost, r=r, s=s, max_part=64, bottlenecks=False)
    check_schedule(g, got)
    # the DP's schedule, priced again stage by stage, is what it claims and is optimal
    priced = sum(cost.merge(st.groups[0]) if st.strategy == "merge" else cost.parallel(st.groups)
                 for st in got.stages)
    assert got.latency_ms == pytest.approx(priced)
    assert got.latency_ms == pytest.approx(_brute_force(g, cost, r, s))
    for baseline in (sequential(g, cost), greedy(g, cost, s)):
        check_schedule(g, baseline)
        assert got.latency_ms <= baseline.latency_ms + 1e-9


def test_independent_branches_run_as_groups_and_siblings_merge() -> None:
    # an Inception-like module: 0 feeds four branches (1; 2->3; 4->5; 6), all feed 7
    edges = [(0, 1), (0, 2), (2, 3), (0, 4), (4, 5), (0, 6),
             (1, 7), (3, 7), (5, 7), (6, 7)]
    g = BlockGraph.from_edges(8, edges)
    cost = Synthetic([1, 1, 1, 2, 1, 2, 1, 0.5], [None] * 8, cores=4)
    got = ios(g, cost)
    check_schedule(g, got)
    middle = [st for st in got.stages if len(st.groups) > 1]
    assert middle and sorted(b for st in middle for b in st.blocks) == list(range(1, 7))
    # 1, 2 and 4 (and 6) read the same input: with a cheap merge IOS merges them
    merging = Synthetic([1, 1, 1, 2, 1, 2, 1, 0.5], [None, "x", "x", None, "x", None, "x", None],
                        cores=1, merge_gain=0.3)
    got = ios(g, merging)
    assert any(st.strategy == "merge" for st in got.stages)
    assert got.latency_ms < sequential(g, merging).latency_ms


def test_pruning_limits_group_size_and_count() -> None:
    g = BlockGraph.from_edges(7, [(0, k) for k in range(1, 7)])
    cost = Synthetic([1.0] * 7, [None] * 7, cores=8)
    for r, s in [(1, 2), (1, 3), (2, 8)]:
        got = ios(g, cost, r=r, s=s)
        check_schedule(g, got)
        assert all(len(st.groups) <= s and all(len(gr) <= r for gr in st.groups)
                   for st in got.stages)


def test_parts_cut_where_one_block_alone_crosses() -> None:
    # two diamonds joined at block 3: 0->{1,2}->3->{4,5}->6
    g = BlockGraph.from_edges(7, [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (3, 5), (4, 6),
                                  (5, 6)])
    assert parts(g, 16) == [(0, 1), (1, 4), (4, 7)]
    assert all(e - b <= 2 for b, e in parts(g, 2))
    cost = Synthetic([1.0, 2.0, 1.0, 1.0, 0.5, 3.0, 1.0], [None] * 7, cores=2)
    whole = ios(g, cost, max_part=64, bottlenecks=False)
    for max_part, cut in [(2, True), (3, True), (16, True)]:
        got = ios(g, cost, max_part=max_part, bottlenecks=cut)
        check_schedule(g, got)
        assert got.latency_ms >= whole.latency_ms - 1e-9


def test_check_schedule_names_the_broken_dependency() -> None:
    g = BlockGraph.from_edges(3, [(0, 1), (1, 2)])
    with pytest.raises(ScheduleError, match="block 1 runs before block 0"):
        check_schedule(g, Schedule("x", (Stage("parallel", ((1,), (0,))),
                                         Stage("parallel", ((2,),)))))
    with pytest.raises(ScheduleError, match=r"blocks \[2\] never run"):
        check_schedule(g, Schedule("x", (Stage("parallel", ((0, 1),)),)))
    with pytest.raises(ScheduleError, match="runs twice"):
        check_schedule(g, Schedule("x", (Stage("parallel", ((0, 1, 2),)),
                                         Stage("parallel", ((2,),)))))
    with pytest.raises(ScheduleError, match="block 2 runs before block 1"):
        check_schedule(g, Schedule("x", (Stage("parallel", ((0,),)),
                                         Stage("merge", ((2, 1),)))))
    # in order inside one group is fine
    check_schedule(g, Schedule("x", (Stage("parallel", ((0, 1, 2),)),)))


def test_schedule_round_trips_through_json_data() -> None:
    g = BlockGraph.from_edges(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    got = ios(g, Synthetic([1, 2, 2, 1], [None, "m", "m", None]))
    assert Schedule.from_dict(got.to_dict()) == got


def test_block_graph_rejects_a_backward_edge() -> None:
    with pytest.raises(ScheduleError, match="block 0 reads from a block"):
        BlockGraph(2, (0b10, 0))
