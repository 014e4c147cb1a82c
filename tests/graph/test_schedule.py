"""IOS schedules on real models (``graph/ios.py``, ``graph/scheduling.py``): concurrent
stages give exactly what running the blocks one after another gives, merged blocks equal the
unmerged ones, the schedule is measured, stored and saved with the model, and ``kernelgen plan
--schedule`` prints it. The DP itself is tested against brute force in tests/unit/test_ios.py.

Two Inception modules (``model_zoo.inception``: four parallel branches, sibling 1x1 convs)
and the SqueezeNet light model (random weights) under DNNFusion's planner on OpenCL, whose
runtime runs a stage's groups on queues of their own, and on NEON C, whose runtime runs them on
threads of their own (``backends/neon/concurrent_groups.py``). Inception v1 itself (57 convs,
four minutes on a Zen 1 CPU) runs with the other light models:
``KERNELGEN_MODELS_FULL=1 .venv/bin/pytest -m models_full tests/graph/test_schedule.py``."""
from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest
from conftest import require
from models.model_zoo import inception, light

import kernelgen as kg
from kernelgen.fastrun import FastRunDB
from kernelgen.graph import import_onnx
from kernelgen.graph.blocks import Block, block_graph
from kernelgen.graph.executor import compile_plan
from kernelgen.graph.ios import ScheduleError, Stage, greedy, ios
from kernelgen.graph.scheduling import ScheduleReport, conv_pattern, merge_key, schedule_model

rng = np.random.default_rng(11)


class _Prefer:
    """A cost model that makes IOS merge every mergeable sibling set and otherwise run blocks
    alone (``merge``), or run as many groups at once as it can (``concurrent``)."""

    def __init__(self, graph: Any, blocks: list[Block], mode: str) -> None:
        self.graph, self.blocks, self.mode = graph, blocks, mode

    def parallel(self, groups: tuple[tuple[int, ...], ...]) -> float:
        if self.mode == "merge":
            return 1.0 if len(groups) == 1 and len(groups[0]) == 1 else math.inf
        return 1.0 / len(groups)

    def merge_key(self, block: int) -> Hashable | None:
        return merge_key(self.graph, self.blocks[block]) if self.mode == "merge" else None

    def merge(self, blocks: tuple[int, ...]) -> float:
        return 0.01


FULL = [pytest.mark.models_full,
        pytest.mark.skipif(not os.environ.get("KERNELGEN_MODELS_FULL"),
                           reason="Inception v1 (four minutes): set KERNELGEN_MODELS_FULL=1")]


@pytest.fixture(scope="module", params=[
    ("inception", "opencl"), ("squeezenet", "opencl"), ("squeezenet", "neon"),
    pytest.param(("inception_v1", "opencl"), marks=FULL)], ids=lambda p: "-".join(p))
def model(request: pytest.FixtureRequest) -> tuple[Any, ...]:
    name, backend = request.param
    require(backend)
    proto = inception() if name == "inception" else light(name)
    graph = import_onnx(proto)
    session = kg.compile_model(graph, backend=backend, fusion="dnnfusion")
    x = graph.inputs[0]
    feeds = {x.name: rng.standard_normal(x.shape).astype(np.float32)}
    return name, backend, session, feeds, session.run(None, feeds)


def _scheduled(session: kg.Session, backend: str, mode: str) -> tuple[Any, Any, Any]:
    graph, blocks = session.graph, list(session.blocks)
    g = block_graph(graph, blocks)
    cost = _Prefer(graph, blocks, mode)
    schedule = greedy(g, cost) if mode == "concurrent" else ios(g, cost)
    report = ScheduleReport({schedule.name: schedule})
    graph, merged, stages = report.applied(graph, blocks, schedule.name)
    return compile_plan(graph, merged, backend, schedule=stages), schedule, stages


def test_concurrent_stages_give_the_sequential_results(model: tuple[Any, ...]) -> None:
    name, backend, session, feeds, want = model
    compiled, _, stages = _scheduled(session, backend, "concurrent")
    wide = [st for st in stages.stages if len(st.groups) > 1]
    assert len(wide) >= 3, f"{name}: expected stages of several groups"
    assert any(together for _, together in compiled._stages)  # on queues or threads of their own
    names = list(session.graph.outputs)
    for _ in range(3):
        got = compiled.run(feeds)
        for n, w in zip(names, want):
            np.testing.assert_array_equal(got[n], w, err_msg=f"{name} output {n}")
    # and from several threads at once, each run with its own buffers
    errors: list[str] = []

    def worker() -> None:
        out = compiled.run(feeds)
        errors.extend(n for n, w in zip(names, want) if not np.array_equal(out[n], w))
    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_merged_blocks_equal_the_unmerged(model: tuple[Any, ...], tmp_path: Any) -> None:
    name, backend, session, feeds, want = model
    compiled, schedule, laid_out = _scheduled(session, backend, "merge")
    merges = [st for st in schedule.stages if st.strategy == "merge"]
    assert merges, f"{name}: no sibling blocks merged"
    # one launch per merged block; a view block (a Slice of the wider convolution, a Concat
    # assembled in place) launches nothing where aligned (a misaligned one is a copy)
    blocks = sum(len(st.blocks) for st in laid_out.stages)
    launched = {n for launch in compiled.plan.launches for n in launch.ops}
    silent = [op for op in compiled.graph.ops if op.name not in launched]
    assert {op.kind for op in silent} <= {"Slice", "Concat"}
    assert len(compiled.plan.launches) == blocks - len(silent)
    wide = any(conv_pattern(session.graph, session.blocks[st.groups[0][0]]) for st in merges)
    assert wide or not name.startswith("inception"), "sibling 1x1 convs merge into a wider one"
    if wide:  # each original output is a view into the wide convolution's
        assert any(b.view_of is not None for b in compiled.plan.buffers)
    got = compiled.run(feeds)
    for n, w in zip(session.graph.outputs, want):
        scale = max(float(np.abs(w).max()), 1e-6)
        assert float(np.abs(got[n] - w).max()) <= 1e-5 * scale, f"{name} output {n}"
    # saved and loaded, views and stages included
    path = kg.Session(compiled.graph, (), compiled, "dnnfusion").save(tmp_path / "m.kg")
    loaded = kg.load_model(path)
    assert loaded.plan == compiled.plan
    again = loaded.run(None, feeds)
    for got_n, w in zip(again, want):
        scale = max(float(np.abs(w).max()), 1e-6)
        assert float(np.abs(got_n - w).max()) <= 1e-5 * scale


def test_a_schedule_breaking_a_dependency_is_refused(model: tuple[Any, ...]) -> None:
    name, backend, session, _, _ = model
    if (name, backend) != ("squeezenet", "opencl"):
        pytest.skip("one model is enough")
    graph, blocks = session.graph, list(session.blocks)
    backwards = ios(block_graph(graph, blocks), _Prefer(graph, blocks, "concurrent"))
    swapped = (Stage("parallel", ((1,),)), Stage("parallel", ((0,),)), *backwards.stages[2:])
    with pytest.raises(ScheduleError, match="block 1 runs before block 0"):
        compile_plan(graph, blocks, backend, warmup=False,
                     schedule=type(backwards)("bad", swapped))


def test_measured_schedules_are_stored_and_saved(model: tuple[Any, ...], tmp_path: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    name, backend, session, feeds, want = model
    if (name, backend) not in (("inception", "opencl"), ("squeezenet", "neon")):
        pytest.skip("one model a backend shows it (measuring a light model's stages on OpenCL "
                    "takes minutes)")
    db = FastRunDB(tmp_path / "fastrun.sqlite")
    first = schedule_model(session.graph, session.blocks, session.model, db=db)
    assert first.measured > 0
    again = schedule_model(session.graph, session.blocks, session.model, db=db)
    assert again.measured == 0 and again.stored == first.measured
    assert {k: s.latency_ms for k, s in again.schedules.items()} == \
        {k: s.latency_ms for k, s in first.schedules.items()}
    best = first.best
    seq = first.schedules["sequential"].latency_ms
    assert best.name == "sequential" or best.latency_ms < seq  # type: ignore[operator]
    # a session compiled with a schedule keeps it in its plan, its report and its save
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the default database: empty
    sess = kg.compile_model(session.graph, backend=backend, fusion="dnnfusion",
                            schedule="ios", schedule_options={"r": 2, "s": 3})
    assert sess.schedule_report is not None and sess.plan.schedule is not None
    assert sess.plan.schedule.name == "ios"
    assert "schedule 'ios'" in sess.report()
    path = sess.save(tmp_path / "model.kg")
    loaded = kg.load_model(path)
    assert loaded.plan.schedule == sess.plan.schedule
    for got, w in zip(loaded.run(None, feeds), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["schedule"]["name"] == "ios"


@pytest.mark.parametrize("faster", [True, False], ids=["kept", "dropped"])
def test_auto_keeps_the_schedule_whose_whole_runs_are_fastest(
        model: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch, tmp_path: Any, faster: bool
        ) -> None:
    """'auto' compiles every schedule whose summed stage estimates beat the sequential one,
    times whole runs of each against the sequential plan, and keeps the fastest where it beats
    the sequential plan (summed estimates ranked IOS over greedy on an H200, whose whole runs
    ranked them the other way). The runs are stored: compiling again times nothing and
    compiles only the winner."""
    name, backend, session, feeds, want = model
    if (name, backend) != ("inception", "opencl"):
        pytest.skip("one model shows the rule")
    from kernelgen.graph import scheduling
    from kernelgen.graph import session as session_module
    from kernelgen.graph.ios import sequential

    def estimated(graph: Any, blocks: Any, compiled: Any, **_: Any) -> ScheduleReport:
        g = block_graph(graph, blocks)
        concurrent, merging = _Prefer(graph, blocks, "concurrent"), _Prefer(graph, blocks, "merge")
        return ScheduleReport({"sequential": sequential(g, concurrent),
                               "greedy": greedy(g, concurrent), "ios": ios(g, merging)})

    timed: list[dict[str, float]] = []
    measured = {"sequential": 10.0, "greedy": 5.0 if faster else 9.9, "ios": 7.0 if faster
                else 11.0}

    real_runs = scheduling.whole_runs

    def runs(models: dict[str, Any]) -> dict[str, float]:
        timed.append(real_runs(models, rounds=1, warmup=0))  # all really run
        return {k: measured[k] for k in models}

    compiled: list[Any] = []
    real_compile = session_module.compile_plan

    def counted(*args: Any, **kwargs: Any) -> Any:
        compiled.append(kwargs.get("schedule"))
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(session_module, "schedule_model", estimated)
    monkeypatch.setattr(session_module, "compile_plan", counted)
    monkeypatch.setattr(scheduling, "whole_runs", runs)
    db = FastRunDB(tmp_path / "fastrun.sqlite")
    for again in (False, True):
        compiled.clear()
        sess = kg.compile_model(session.graph, backend=backend, fusion="dnnfusion",
                                schedule="auto", schedule_options={"db": db})
        report = sess.schedule_report
        assert report is not None and sorted(report.candidates()) == ["greedy", "ios"]
        assert report.runs == measured and report.runs_stored == again
        assert len(timed) == 1 and set(timed[0]) == set(measured) and min(timed[0].values()) > 0
        schedules = [s.name for s in compiled if s is not None]
        if again:  # from the database: only the winner is compiled
            assert schedules == (["greedy"] if faster else [])
        else:
            assert sorted(schedules) == ["greedy", "ios"]
        assert (sess.plan.schedule.name if sess.plan.schedule else None) == \
            ("greedy" if faster else None)
        assert "whole runs, compiled" in sess.report() and "sequential 10.000 ms" in sess.report()
        assert report.kept == ("greedy" if faster else "sequential")
        assert f"kept: {report.kept}" in sess.report()
        for got, w in zip(sess.run(None, feeds), want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()))


def test_unknown_schedule_is_named() -> None:
    with pytest.raises(kg.ArgumentError, match="unknown schedule 'fastest'"):
        kg.compile_model(light("squeezenet"), schedule="fastest")


def test_plan_schedule_cli(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    require("opencl")
    from models.model_zoo import mobilenet_v2

    import onnx

    from kernelgen.cli.main import main
    path = tmp_path / "m.onnx"
    onnx.save(mobilenet_v2(), path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["plan", str(path), "--schedule", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["schedules"]) == {"sequential", "greedy", "ios"}
    assert data["measured"] > 0 and data["best"] in data["schedules"]
    assert all(st["latency_ms"] > 0 for s in data["schedules"].values() for st in s["stages"])
    assert main(["plan", str(path), "--schedule"]) == 0
    text = capsys.readouterr().out
    assert "sequential" in text and "stage   0" in text and "from the Fast-Run database" in text


@pytest.mark.parametrize("backend", ["opencl", "neon"])
def test_view_blocks_share_memory_where_aligned(backend: str) -> None:
    """A view block's Slice output is its input's memory (no launch) where the range is
    contiguous and starts where the device can address it; elsewhere it is a copy kernel."""
    require(backend)
    from kernelgen.graph import Graph

    x = kg.tensor("x", (1, 8, 5, 5))
    w = rng.standard_normal((6, 8, 1, 1)).astype(np.float32)
    c = kg.conv(x, kg.constant("w", w))
    first = kg.slice(c, [0], [2], [1])     # offset 0: always a view
    second = kg.slice(c, [2], [6], [1])    # 50 floats in: not on a 128-byte boundary
    strided = kg.slice(c, [0], [6], [1], [2])  # channels 0, 2, 4: never contiguous
    outs = [kg.relu(first), kg.sigmoid(second), kg.neg(strided)]
    graph = Graph.build([x], outs, "views")
    blocks = [Block((c,)), *(Block((s,), view=True) for s in (first, second, strided)),
              *(Block((o,)) for o in outs)]
    compiled = compile_plan(graph, blocks, backend)
    views = {b.name: b.offset for b in compiled.plan.buffers if b.view_of is not None}
    aligned = backends_alignment(backend)
    assert views.get(first.name) == 0
    assert (second.name in views) == (50 * 4 % aligned == 0)
    assert strided.name not in views
    assert len(compiled.plan.launches) == len(blocks) - len(views)
    xv = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    conv = np.einsum("oc,nchw->nohw", w[:, :, 0, 0], xv)
    got = compiled.run({"x": xv})
    np.testing.assert_allclose(got[outs[0].name], np.maximum(conv[:, :2], 0), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(got[outs[1].name], 1 / (1 + np.exp(-conv[:, 2:])), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(got[outs[2].name], -conv[:, ::2], rtol=1e-5, atol=1e-6)


def backends_alignment(name: str) -> int:
    from kernelgen import backends
    return backends.get(name).view_alignment()


def test_neon_groups_run_at_once_on_threads_of_their_own() -> None:
    """Each group runs in order on a thread of its own, all at once (a group waits here until
    every other has started, which one thread running them in turn never reaches), its OpenMP
    regions on its share of the cores; the first error is raised after every group ends."""
    from kernelgen.backends.neon import concurrent_groups as concurrent

    assert concurrent.shares(3, 2) == [1, 1, 1] and concurrent.shares(3, 16) == [6, 5, 5]
    started = threading.Barrier(3, timeout=30)
    seen: list[tuple[int, int, str]] = []

    def call(group: int, k: int) -> Any:
        def run() -> None:
            if k == 0:
                started.wait()
            seen.append((group, k, threading.current_thread().name))
        return run

    concurrent.concurrently([[call(g, k) for k in range(4)] for g in range(3)])
    by_group = {g: [k for gg, k, _ in seen if gg == g] for g in range(3)}
    assert by_group == {g: [0, 1, 2, 3] for g in range(3)}
    assert len({name for _, _, name in seen}) == 3

    def fail() -> None:
        raise ValueError("kernel failed")
    ran: list[int] = []
    with pytest.raises(ValueError, match="kernel failed"):
        concurrent.concurrently([[fail], [lambda: ran.append(1)]])
    assert ran == [1]


def test_a_merge_never_splits_a_concat_assembled_in_place() -> None:
    """An Inception module's 1x1 branch goes straight into the module's Concat, assembled in
    place; merged with the 3x3 and 5x5 branches' 1x1 reductions it would become a slice of
    the wide output and the Concat a copy kernel again. So the reductions may merge with each
    other, and the branch only with siblings that the same Concat takes."""
    from kernelgen.graph.blocks import in_place_concats
    from kernelgen.graph.planners import planner

    graph = import_onnx(light("inception_v1"))
    blocks = planner("dnnfusion")(graph)
    concats = {id(c) for c in in_place_concats(graph)}
    by_source: dict[int, list[tuple[bool, Hashable]]] = {}
    for block in blocks:
        pattern = conv_pattern(graph, block)
        key = merge_key(graph, block)
        if pattern is None or key is None or pattern.conv.attrs.get("kernel_shape") != [1, 1]:
            continue
        into = any(id(c) in concats for c in graph.consumers(pattern.output))
        by_source.setdefault(id(pattern.source), []).append((into, key))
    modules = [keys for keys in by_source.values() if len(keys) == 3]
    assert len(modules) == 9, "each Inception module reads its input with three 1x1 convs"
    for keys in modules:
        branch = [k for into, k in keys if into]
        reductions = [k for into, k in keys if not into]
        assert len(branch) == 1 and len(reductions) == 2
        assert reductions[0] == reductions[1] != branch[0]


def test_the_report_lists_every_block_with_its_launches(model: tuple[Any, ...]) -> None:
    """One row a block, each naming the kernels that compute its operators: the Concats
    assembled in place launch none ('view'), and the rows after them are not shifted."""
    name, backend, session, _, _ = model
    if (name, backend) != ("inception", "opencl"):
        pytest.skip("one model with view blocks shows it")
    rows = [line.split() for line in session.report().splitlines()
            if line.startswith("  ") and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(len(session.blocks)))
    kernel_of = {n: launch.kernel for launch in session.plan.launches for n in launch.ops}
    for row, block in zip(rows, session.blocks):
        if block.view:
            assert row[1:4] == ["Concat", "-", "view"]
        else:
            assert row[2] == f"k{kernel_of[block.names[0]]}", row
