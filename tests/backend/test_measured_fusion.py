"""Yellow cells decided by measurement (``kernelgen.measure_fusion``): a block holding yellow
edges is cut at them (``fusion.split_parts``), the split runs as one program equal to NumPy on
every backend, the one kernel is timed against it, the verdict is stored in the Fast-Run
database and read back, ``emit`` returns the winner, and the DNNFusion planner fuses a yellow
cell only where a verdict says the fused kernel won."""
from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_close, backend_problem, require

import kernelgen as kg
from kernelgen import backends
from kernelgen.compile import Stored
from kernelgen.errors import FusionError
from kernelgen.exec import Program
from kernelgen.fastrun import FastRunDB, fusion_key, stored_verdict
from kernelgen.fusion import FusionVerdict, split_parts
from kernelgen.graph import Graph, compile_model
from kernelgen.graph.blocks import fusible
from kernelgen.graph.dnnfusion import plan_dnnfusion
from kernelgen.graph.planners import planner
from kernelgen.mapping_types import Colour
from kernelgen.measure_fusion import measure_fusion
from kernelgen.tune import Measure, MeasureFusion

measure_fusion_module = importlib.import_module("kernelgen.measure_fusion")

EMITTING = ("opencl", "neon", "triton")


def _scores(b: int, m: int, n: int, d: int) -> tuple[kg.FusedOp, list[np.ndarray], np.ndarray]:
    """exp(Q . transpose(K)): the Transpose -> MatMul edge is yellow (Shuffle -> Many-to-Many;
    d no multiple of 16, else the product reads whole runs along it: green, ``run_rule``)."""
    rng = np.random.default_rng(b * m + n * d)
    q = rng.standard_normal((b, m, d)).astype(np.float32) * 0.5
    k = rng.standard_normal((b, n, d)).astype(np.float32) * 0.5
    kt = kg.transpose(kg.tensor("k", (b, n, d)), (0, 2, 1))
    s = kg.matmul(kg.tensor("q", (b, m, d)), kt)
    e = kg.exp(s)
    fused = kg.fuse(kt, s, e)
    arrays = [{"q": q, "k": k}[v.name] for v in fused.inputs]
    return fused, arrays, np.exp(q @ k.transpose(0, 2, 1))


def _not_convex_without_the_cut(m: int, n: int, d: int
                                ) -> tuple[kg.FusedOp, list[np.ndarray], np.ndarray]:
    """a = q.w; out = a + transpose(transpose(a)). The green edges join a, the second
    transpose and the add, but without the first transpose between them that piece is not
    convex: the split runs one kernel per operator."""
    rng = np.random.default_rng(m + n + d)
    q = rng.standard_normal((m, d)).astype(np.float32)
    w = rng.standard_normal((d, n)).astype(np.float32)
    a = kg.matmul(kg.tensor("q", (m, d)), kg.tensor("w", (d, n)))
    t1 = kg.transpose(a, (1, 0))
    t2 = kg.transpose(t1, (1, 0))
    out = kg.add(a, t2)
    fused = kg.fuse(a, t1, t2, out)
    arrays = [{"q": q, "w": w}[v.name] for v in fused.inputs]
    return fused, arrays, 2 * (q @ w)


def _split_won(fused: kg.FusedOp, backend: str) -> kg.FusedOp:
    parts = tuple(tuple(op.name for op in p.ops) for p in split_parts(fused))
    fused.verdict = FusionVerdict(backend, False, 2.0, 1.0, parts)
    return fused


def test_the_split_cuts_only_the_yellow_edge() -> None:
    fused, _, _ = _scores(2, 5, 3, 4)
    assert fused.needs_measurement
    parts = split_parts(fused)
    assert [[op.kind for op in p.ops] for p in parts] == [["Transpose"], ["MatMul", "Exp"]]
    assert all(e.rule.colour is Colour.GREEN for p in parts for e in p.edges)


def test_a_piece_that_is_not_convex_runs_an_operator_per_kernel() -> None:
    fused, _, _ = _not_convex_without_the_cut(3, 5, 2)
    parts = split_parts(fused)
    assert [[op.kind for op in p.ops] for p in parts] == [
        ["MatMul"], ["Transpose"], ["Transpose"], ["Add"]]


@pytest.mark.parametrize("backend", EMITTING)
@pytest.mark.parametrize("shape", [(1, 1, 3, 2), (3, 37, 29, 13), (2, 17, 64, 24)])
def test_emit_runs_the_split_where_it_won(backend: str, shape: tuple[int, ...]) -> None:
    require(backend)
    fused, arrays, want = _scores(*shape)
    program = _split_won(fused, backend).emit(backend)
    assert isinstance(program, Program) and program.metadata["algorithm"] == "split"
    assert len(program.kernels) == 2
    assert_close(program(*arrays), want, scale=float(np.abs(want).max()))
    # the verdict belongs to its backend: another one still gets the fused kernel
    other = "neon" if backend != "neon" else "opencl"
    if not backend_problem(other):
        assert not isinstance(fused.emit(other), Program)


@pytest.mark.parametrize("backend", EMITTING)
def test_a_split_of_single_operators_equals_numpy(backend: str) -> None:
    require(backend)
    fused, arrays, want = _not_convex_without_the_cut(7, 11, 5)
    program = _split_won(fused, backend).emit(backend)
    assert isinstance(program, Program) and len(program.kernels) == 4
    assert_close(program(*arrays), want, scale=float(np.abs(want).max()))


def test_measure_stores_the_verdict_and_reads_it_back(tmp_path: Path) -> None:
    require("opencl")
    db = FastRunDB(tmp_path / "fastrun.sqlite")
    fused, arrays, want = _scores(2, 19, 23, 8)
    verdict = measure_fusion(fused, "opencl", db=db, repeat=5)
    assert not verdict.from_cache and verdict.backend == "opencl"
    assert verdict.fused == (verdict.fused_ms <= verdict.split_ms)
    assert verdict.parts == ((fused.ops[0].name,), tuple(op.name for op in fused.ops[1:]))
    assert verdict.edges and "yellow" in verdict.edges[0]
    again = measure_fusion(fused, "opencl", db=db)
    assert again.from_cache and again.as_value() == verdict.as_value()
    assert stored_verdict(fused, "opencl", db) == again
    [(fields, _, _)] = list(db.entries())
    assert fields["kind"] == "fusion-decision"
    # the same block measured through fuse(): the verdict, the report and the winner
    ops = fused.ops
    measured = kg.fuse(*ops, measure=True, backend="opencl", db=db)
    assert measured.verdict == again
    assert f"{verdict.winner} wins by" in measured.report()
    winner = measured.emit("opencl")
    assert isinstance(winner, Program) == (not verdict.fused)
    assert_close(winner(*arrays), want, scale=float(np.abs(want).max()))


@pytest.mark.parametrize("close", [True, False], ids=["close-call", "clear-win"])
def test_a_close_call_is_timed_again_before_it_is_decided(tmp_path: Path, monkeypatch,
                                                          close: bool) -> None:
    """Rounds whose two variants overlap are followed by ``CLOSE_CALL_ROUNDS`` times as many
    more on the same launches, and the verdict takes all of them; a clear win is not timed
    again. The clock is a stub here, so the verdict's numbers are known."""
    require("opencl")
    calls: list[tuple[tuple[str, ...], int]] = []
    first = {"fused": [1.0, 1.1, 1.2, 1.3, 1.4], "split": [1.15, 1.25, 1.35, 1.45, 1.55]} \
        if close else {"fused": [1.0] * 5, "split": [2.0] * 5}
    later = {"fused": [1.0] * 15, "split": [1.5] * 15}

    def stub(runs, warmup=3, repeat=20):
        for run in runs.values():  # each bound launch runs, so a broken one still fails here
            run()
        calls.append((tuple(runs), repeat))
        return first if len(calls) == 1 else later
    monkeypatch.setattr(measure_fusion_module, "round_robin", stub)
    fused, _, _ = _scores(1, 9, 7, 5)
    verdict = measure_fusion(fused, "opencl", db=FastRunDB(tmp_path / "f.sqlite"), repeat=5)
    if close:
        assert calls == [(("fused", "split"), 5),
                         (("fused", "split"), 5 * measure_fusion_module.CLOSE_CALL_ROUNDS)]
        assert verdict.fused and verdict.clear
        assert (verdict.fused_ms, verdict.split_ms) == (1.0, 1.5)
    else:
        assert calls == [(("fused", "split"), 5)] and verdict.clear
        assert (verdict.fused_ms, verdict.split_ms) == (1.0, 2.0)


def test_a_damaged_verdict_reads_as_missing_and_is_measured_again(tmp_path: Path) -> None:
    require("opencl")
    db = FastRunDB(tmp_path / "fastrun.sqlite")
    fused, _, _ = _scores(1, 9, 7, 5)
    db.put(fusion_key(fused, "opencl"), {"fused": "yes", "parts": 3})
    assert stored_verdict(fused, "opencl", db) is None
    verdict = measure_fusion(fused, "opencl", db=db, repeat=3)
    assert not verdict.from_cache
    assert stored_verdict(fused, "opencl", db) == FusionVerdict(
        **{**verdict.__dict__, "from_cache": True})


def test_blocks_that_cannot_be_measured_say_why(tmp_path: Path) -> None:
    db = FastRunDB(tmp_path / "fastrun.sqlite")
    x = kg.tensor("x", (4, 6))
    r = kg.relu(x)
    n = kg.neg(r)
    green = kg.fuse(r, n, measure=True, db=db)
    assert green.verdict is None and len(db) == 0
    with pytest.raises(FusionError, match="only green edges"):
        measure_fusion(green, db=db)
    # two outputs: the split would be a program per output
    a = kg.matmul(kg.tensor("q", (4, 3)), kg.tensor("w", (3, 4)))
    t = kg.transpose(a, (1, 0))
    two = kg.fuse(a, t, outputs=[a])
    assert two.needs_measurement and len(two.outputs) == 2
    with pytest.raises(FusionError, match="2 outputs"):
        measure_fusion(two, db=db)
    assert Measure(db).fusion(two, backends.get("opencl")) is None


def _scores_graph(b: int, m: int, n: int, d: int) -> Graph:
    q, k = kg.tensor("q", (b, m, d)), kg.tensor("k", (b, n, d))
    kt = kg.transpose(k, (0, 2, 1))
    out = kg.exp(kg.matmul(q, kt))
    return Graph.build([q, k], [out])


@pytest.mark.parametrize("fused,clear,words", [
    (True, True, None), (True, False, "within the runs' spread"),
    (False, True, "split ran faster"), (None, False, "nothing was measured")])
def test_the_planner_fuses_a_yellow_cell_only_where_a_verdict_says_so(
        fused: bool | None, clear: bool, words: str | None) -> None:
    graph = _scores_graph(2, 5, 7, 3)
    asked: list[kg.FusedOp] = []

    def decide(block: kg.FusedOp) -> FusionVerdict | None:
        asked.append(block)
        return None if fused is None else FusionVerdict("opencl", fused, 1.0, 1.5, (),
                                                        clear=clear)

    blocks = plan_dnnfusion(graph, decide=decide)
    assert asked and all(b.needs_measurement for b in asked)
    if words is None:
        [block] = blocks
        assert "yellow cells fused" in block.note and "fused wins by 1.50x" in block.note
        assert len(asked) == 2  # when the cell joined, and the grown block as a whole
        return
    assert [[op.kind for op in b.ops] for b in blocks] == [["Transpose"], ["MatMul", "Exp"]]
    [stop] = [s for b in blocks for s in b.stops]
    assert words in stop.rule


def test_a_grown_block_that_loses_as_a_whole_is_split(tmp_path: Path) -> None:
    """The cell measured fused faster when it joined; the whole block, measured again, lost:
    its pieces become the blocks, the cut edge recorded with why."""
    graph = _scores_graph(2, 5, 7, 3)
    verdicts = iter([FusionVerdict("opencl", True, 1.0, 1.5, (), clear=True),
                     FusionVerdict("opencl", False, 1.5, 1.0, (), clear=True)])
    blocks = plan_dnnfusion(graph, decide=lambda block: next(verdicts))
    assert [[op.kind for op in b.ops] for b in blocks] == [["Transpose"], ["MatMul", "Exp"]]
    assert all("measured as a whole, split into 2 kernels" in b.note for b in blocks)
    [stop] = [s for b in blocks for s in b.stops]
    assert "as a whole" in stop.rule and stop.consumer == blocks[1].ops[0].name


def test_compile_model_measures_yellow_cells_under_measure_fusion(tmp_path: Path) -> None:
    require("opencl")
    db = FastRunDB(tmp_path / "fastrun.sqlite")
    graph = _scores_graph(2, 13, 11, 8)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 13, 8)).astype(np.float32) * 0.5
    k = rng.standard_normal((2, 11, 8)).astype(np.float32) * 0.5
    want = np.exp(q @ k.transpose(0, 2, 1))
    # 'measure-fusion': stored tunables (none here: the defaults), yellow cells timed
    session = compile_model(graph, "opencl", fusion="dnnfusion", tuning=MeasureFusion(db))
    assert not any(k.metadata.get("tuning", {}).get("options") for k in session.model.executables)
    whole = stored_verdict(fusible(graph, list(graph.ops)), "opencl", db)
    assert whole is not None and whole.from_cache
    assert len(session.blocks) == (1 if whole.fused and whole.clear else 2)
    (got,) = session.run(None, {"q": q, "k": k})
    assert_close(got, want, scale=float(want.max()))
    # the stored verdict plans the same blocks without measuring again
    stored = compile_model(graph, "opencl", fusion="dnnfusion",
                           tuning=Stored(db))
    assert [b.names for b in stored.blocks] == [b.names for b in session.blocks]
    assert [b.names for b in planner("dnnfusion", "opencl", Stored(db))(graph)] == \
        [b.names for b in session.blocks]
    # no verdicts: the cell stays unfused
    assert len(planner("dnnfusion", "opencl", "none")(graph)) == 2
    assert len(planner("dnnfusion")(graph)) == 2
