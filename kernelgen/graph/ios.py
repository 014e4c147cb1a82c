"""IOS, the inter-operator scheduler (seed 001; ``docs/research/ALGORITHMS.md`` §2), over the
graph of fused blocks, so that fusion and scheduling compose.

A schedule is a sequence of stages; a stage ends before the next begins. A stage is either
``parallel`` (disjoint groups of blocks, each group run in order, the groups concurrently) or
``merge`` (sibling blocks that read the same input launched as one wider kernel). Its latency
comes from a ``StageCost``: measured on the device (``stage_cost.py``) or a model in tests.

The dynamic programme runs over the sets of blocks already executed: ``dp[S]`` is the least
latency of running the down-closed set ``S``, and

    dp[S] = min over stages T that can run last in S:  dp[S - T] + latency(T)

where T can run last when no block of T feeds a block of S - T (an *ending* of S). Parallel
endings are enumerated as IOS does: the blocks are covered by chains (longest paths stripped
off the transitive closure); a group is a head block u with every descendant of u in S; at most
one head per chain, among the last ``r`` blocks of the chain still in S; at most ``s`` groups
of at most ``r`` blocks each. Merge endings are subsets of S's sinks whose blocks the cost
model says may merge. The graph is cut into parts of at most ``max_part`` blocks and at points
that one block's outputs alone cross (the DP's states grow exponentially with a part's width),
and each part is scheduled on its own.
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import KernelgenError

STRATEGIES = ("parallel", "merge")


class ScheduleError(KernelgenError):
    """A schedule that breaks a dependency or leaves a block out."""


@dataclass(frozen=True)
class Stage:
    """Blocks run together: ``groups`` of block indices (each group in order); ``merge``
    stages have one group, launched as one kernel. ``latency_ms`` as the cost model gave it."""

    strategy: str
    groups: tuple[tuple[int, ...], ...]
    latency_ms: float | None = None

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(b for g in self.groups for b in g)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "groups": [list(g) for g in self.groups],
                "latency_ms": self.latency_ms}


@dataclass(frozen=True)
class Schedule:
    """A named schedule of a block graph; ``search_s``: the seconds its search took."""

    name: str
    stages: tuple[Stage, ...]
    search_s: float = 0.0

    @property
    def latency_ms(self) -> float | None:
        """The stages' latencies added up (None where one is unknown)."""
        if any(st.latency_ms is None for st in self.stages):
            return None
        return sum(st.latency_ms for st in self.stages)  # type: ignore[misc]

    @property
    def order(self) -> tuple[int, ...]:
        """Every block once, in an order that runs the stages one after another."""
        return tuple(b for st in self.stages for b in st.blocks)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "latency_ms": self.latency_ms, "search_s": self.search_s,
                "stages": [st.to_dict() for st in self.stages]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        stages = tuple(Stage(st["strategy"], tuple(tuple(g) for g in st["groups"]),
                             st.get("latency_ms")) for st in data["stages"])
        return cls(data["name"], stages, data.get("search_s", 0.0))


class StageCost(Protocol):
    """Stage latencies in milliseconds; ``math.inf`` for a stage that cannot run that way."""

    def parallel(self, groups: tuple[tuple[int, ...], ...]) -> float: ...

    def merge_key(self, block: int) -> Hashable | None:
        """Blocks with equal keys (not None) may be merged into one launch."""
        ...

    def merge(self, blocks: tuple[int, ...]) -> float: ...


@dataclass(frozen=True)
class BlockGraph:
    """Blocks ``0..n-1`` in a topological order; ``preds[b]``: a bitmask of the blocks ``b``
    reads from."""

    n: int
    preds: tuple[int, ...]
    succs: tuple[int, ...] = field(init=False, repr=False)
    below: tuple[int, ...] = field(init=False, repr=False)  # descendants, b excluded

    def __post_init__(self) -> None:
        succs = [0] * self.n
        for b, mask in enumerate(self.preds):
            if mask >> b:
                raise ScheduleError(f"block {b} reads from a block that does not come before it")
            for p in _bits(mask):
                succs[p] |= 1 << b
        below = [0] * self.n
        for b in reversed(range(self.n)):
            for c in _bits(succs[b]):
                below[b] |= (1 << c) | below[c]
        object.__setattr__(self, "succs", tuple(succs))
        object.__setattr__(self, "below", tuple(below))

    @classmethod
    def from_edges(cls, n: int, edges: Sequence[tuple[int, int]]) -> BlockGraph:
        preds = [0] * n
        for a, b in edges:
            preds[b] |= 1 << a
        return cls(n, tuple(preds))


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _mask(blocks: Sequence[int]) -> int:
    out = 0
    for b in blocks:
        out |= 1 << b
    return out


def check_schedule(graph: BlockGraph, schedule: Schedule) -> None:
    """Raise ``ScheduleError`` unless every block runs once, every block's inputs are produced
    by an earlier stage or earlier in its own group, and the strategies are known. (A merge
    stage the DP makes holds independent blocks; one laid out for compiling holds the merged
    block and the views of it that follow.)"""
    done = 0
    for k, st in enumerate(schedule.stages):
        if st.strategy not in STRATEGIES:
            raise ScheduleError(f"stage {k}: unknown strategy '{st.strategy}'")
        if st.strategy == "merge" and len(st.groups) != 1:
            raise ScheduleError(f"stage {k}: a merge stage holds one group")
        for group in st.groups:
            seen = 0
            for b in group:
                if not 0 <= b < graph.n or (done | seen) >> b & 1:
                    raise ScheduleError(f"stage {k}: block {b} is unknown or runs twice")
                missing = graph.preds[b] & ~(done | seen)
                if missing:
                    raise ScheduleError(f"stage {k}: block {b} runs before block "
                                        f"{next(_bits(missing))} it reads from")
                seen |= 1 << b
        done |= _mask(st.blocks)
    if done != (1 << graph.n) - 1:
        raise ScheduleError(f"blocks {list(_bits(~done & ((1 << graph.n) - 1)))} never run")


def _priced(cost: StageCost, strategy: str, groups: tuple[tuple[int, ...], ...]) -> Stage:
    ms = cost.merge(groups[0]) if strategy == "merge" else cost.parallel(groups)
    return Stage(strategy, groups, ms)


def sequential(graph: BlockGraph, cost: StageCost) -> Schedule:
    """Every block alone, in the graph's order: what the executor does without a schedule."""
    start = time.perf_counter()
    stages = tuple(_priced(cost, "parallel", ((b,),)) for b in range(graph.n))
    return Schedule("sequential", stages, time.perf_counter() - start)


def greedy(graph: BlockGraph, cost: StageCost, max_groups: int = 8) -> Schedule:
    """IOS's greedy baseline: each stage runs every block whose inputs are ready (at most
    ``max_groups``, earliest first), each as a group of its own."""
    start = time.perf_counter()
    done, stages = 0, []
    while done != (1 << graph.n) - 1:
        ready = [b for b in range(graph.n)
                 if not done >> b & 1 and graph.preds[b] & ~done == 0][:max_groups]
        stages.append(_priced(cost, "parallel", tuple((b,) for b in ready)))
        done |= _mask(ready)
    return Schedule("greedy", tuple(stages), time.perf_counter() - start)


def parts(graph: BlockGraph, max_part: int, bottlenecks: bool = True) -> list[tuple[int, int]]:
    """Ranges [begin, end) of the topological order scheduled apart: cut wherever a part
    reaches ``max_part``, and (``bottlenecks``) after a block whose outputs are all that
    crosses the cut. A cut forgoes stages that straddle it (a block reading only the graph's
    inputs run beside earlier ones, a group running on past the bottleneck), which is little
    next to the exponential cost of a wide part."""
    out, begin = [], 0
    for end in range(1, graph.n + 1):
        crossing = {p for b in range(end, graph.n) for p in _bits(graph.preds[b]) if p < end}
        if end == graph.n or end - begin >= max_part or (bottlenecks and crossing <= {end - 1}):
            out.append((begin, end))
            begin = end
    return out


def ios(graph: BlockGraph, cost: StageCost, r: int = 3, s: int = 8, max_part: int = 16,
        bottlenecks: bool = True) -> Schedule:
    """The IOS schedule: the least total latency over the stages the pruning (``r`` blocks per
    group at most, ``s`` groups per stage at most) leaves, part by part (``parts``); with one
    part (``max_part`` >= the blocks, ``bottlenecks`` False) the optimum of that space."""
    if r < 1 or s < 1 or max_part < 1:
        raise ValueError(f"ios: r, s and max_part must be at least 1, got {r}, {s}, {max_part}")
    start = time.perf_counter()
    stages: list[Stage] = []
    for begin, end in parts(graph, max_part, bottlenecks):
        stages += _Part(graph, begin, end, cost, r, s).solve()
    return Schedule("ios", tuple(stages), time.perf_counter() - start)


class _Part:
    """The DP over one range of blocks; masks are over the global block indices."""

    def __init__(self, graph: BlockGraph, begin: int, end: int, cost: StageCost, r: int,
                 s: int) -> None:
        self.g, self.cost, self.r, self.s = graph, cost, r, s
        self.all = _mask(range(begin, end))
        self.chains = self._chains()
        self.best: dict[int, tuple[float, Stage | None]] = {0: (0.0, None)}
        self.prices: dict[tuple[str, tuple[tuple[int, ...], ...]], float] = {}

    def _chains(self) -> list[list[int]]:
        """Cover the part with chains: repeatedly the longest path through the transitive
        closure among the blocks not yet covered."""
        left, chains = self.all, []
        while left:
            # longest chain ending at each block, by the closure (any descendant may follow)
            length: dict[int, int] = {}
            prev: dict[int, int | None] = {}
            for b in _bits(left):
                above = [a for a in _bits(left) if a < b and self.g.below[a] >> b & 1]
                a = max(above, key=lambda a: length[a], default=None)
                length[b], prev[b] = (length[a] + 1 if a is not None else 1), a
            b_last: int | None = max(length, key=lambda b: length[b])
            chain = []
            while b_last is not None:
                chain.append(b_last)
                b_last = prev[b_last]
            chains.append(chain[::-1])
            left &= ~_mask(chain)
        return chains

    def solve(self) -> list[Stage]:
        self._dp(self.all)
        stages, state = [], self.all
        while state:
            _, stage = self.best[state]
            assert stage is not None
            stages.append(stage)
            state &= ~_mask(stage.blocks)
        return stages[::-1]

    def _price(self, strategy: str, groups: tuple[tuple[int, ...], ...]) -> float:
        key = (strategy, groups)
        if key not in self.prices:
            self.prices[key] = (self.cost.merge(groups[0]) if strategy == "merge"
                                else self.cost.parallel(groups))
        return self.prices[key]

    def _dp(self, state: int) -> float:
        hit = self.best.get(state)
        if hit is not None:
            return hit[0]
        best: tuple[float, Stage | None] = (math.inf, None)
        for strategy, groups in self._endings(state):
            ms = self._price(strategy, groups)
            if ms == math.inf:
                continue
            total = self._dp(state & ~_mask([b for g in groups for b in g])) + ms
            if total < best[0]:
                best = (total, Stage(strategy, groups, ms))
        if best[1] is None:  # every ending priced infinite: run a sink alone at any price
            sink = next(b for b in _bits(state) if self.g.succs[b] & state == 0)
            groups = ((sink,),)
            best = (self._dp(state & ~(1 << sink)) + self._price("parallel", groups),
                    Stage("parallel", groups, self._price("parallel", groups)))
        self.best[state] = best
        return best[0]

    def _endings(self, state: int) -> Iterator[tuple[str, tuple[tuple[int, ...], ...]]]:
        g = self.g
        options: list[list[int | None]] = []
        for chain in self.chains:
            alive = [b for b in chain if state >> b & 1]  # a prefix of the chain
            options.append([None, *alive[-self.r:]])
        seen: set[tuple[tuple[int, ...], ...]] = set()
        for heads in itertools.product(*options):
            chosen = [u for u in heads if u is not None]
            if not chosen or len(chosen) > self.s:
                continue
            groups, used = [], 0
            for u in chosen:
                members = (1 << u) | (g.below[u] & state)
                if members & used or bin(members).count("1") > self.r:
                    break
                used |= members
                groups.append(tuple(_bits(members)))
            else:
                key = tuple(sorted(groups))
                if key not in seen:
                    seen.add(key)
                    yield "parallel", key
        sinks = [b for b in _bits(state) if g.succs[b] & state == 0]
        classes: dict[Hashable, list[int]] = {}
        for b in sinks:
            k = self.cost.merge_key(b)
            if k is not None:
                classes.setdefault(k, []).append(b)
        for siblings in classes.values():
            for size in range(2, min(len(siblings), self.s) + 1):
                for subset in itertools.combinations(siblings, size):
                    yield "merge", (subset,)
