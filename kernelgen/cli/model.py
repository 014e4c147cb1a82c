"""The CLI's ONNX model commands: ``run`` (compile, check against onnxruntime, time), ``plan``
(the fusion report; with ``--schedule`` the measured IOS schedules) and ``emit`` (kernels, plan
and constants as files)."""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto

from .. import backends
from ..errors import ArgumentError, ModelError
from ..graph import Graph, compile_model, fusion_report, import_onnx, simplify
from ..graph.export import export
from ..graph.ios import Schedule
from ..graph.onnx_import import InputShapes, load_model
from ..graph.planners import PLANNERS
from ..graph.scheduling import ScheduleReport
from ..graph.simplify import Applied


# a MobileNetV2 stem, four inverted residual blocks, pooling and a classifier (1x3x32x32, 40
# operators), written by tests/models/model_zoo.py's mobilenet_v2() (a test checks it still is)
DEFAULT_MODEL = Path(__file__).parent / "examples" / "mobilenet_v2.onnx"


def parse_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """``NAME=D0,D1,...`` options as input name -> shape; ``ArgumentError`` names the bad one."""
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, eq, dims = item.partition("=")
        try:
            shape = [int(d) for d in dims.split(",")] if eq and dims else None
        except ValueError:
            shape = None
        if not name or shape is None or any(d < 1 for d in shape):
            raise ArgumentError(f"--shape {item!r}: expected NAME=D0,D1,... with positive "
                                "integer dimensions")
        shapes[name] = shape
    return shapes


def run_model(path: str, backend: str, fusion: str, *, inputs: str | None = None,
              repeat: int = 20, shapes: InputShapes | None = None, rtol: float = 1e-3,
              atol: float = 1e-4, tuning: str = "stored", rewrite: bool = False,
              schedule: str | None = "auto", profile: int | None = None) -> int:
    """Compile the model, run it on random inputs (or those of an .npz file), check every output
    against onnxruntime and print the latency (median of ``repeat`` runs) beside onnxruntime's.
    ``schedule``: the stages the kernels run in ('auto': IOS's or greedy's where faster in
    whole runs than one after another; ``compile_model``). ``profile``: list that many of
    the slowest launches, each timed on its own (``Session.profile``). Returns 0 when every
    output matches, 1 when one does not."""
    proto = load_model(path)
    start = time.perf_counter()
    graph = import_onnx(proto, shapes)
    feeds = _feeds(graph, inputs)
    session = compile_model(graph, backend=backend, fusion=fusion, tuning=tuning,
                            rewrite=rewrite, schedule=schedule)
    compiled = time.perf_counter() - start
    print(f"model {path}: {len(session.graph.ops)} operators in {len(session.blocks)} kernels "
          f"({fusion}) on {session.backend}, imported and compiled in {compiled:.2f} s")
    if session.schedule_report is not None:
        print(_schedule_line(session.schedule_report, session.plan.schedule))
    if rewrite:
        print(f"rewrites: {_rewrites(session.rewrites)}")
    got = dict(zip(session.graph.outputs, session.run(None, feeds)))
    ok = _check(proto, feeds, got, rtol, atol)
    ours = _median_ms(lambda: session.run(None, feeds), repeat)
    line = f"latency: {ours:.3f} ms (median of {repeat})"
    theirs = _onnxruntime_ms(proto, feeds, repeat)
    if theirs is not None:
        line += (f"; onnxruntime (all optimisations) {theirs:.3f} ms: kernelgen takes "
                 f"{ours / theirs:.2f}x its time")
    print(line)
    if profile is not None:
        print(session.profile(feeds, rounds=repeat).table(profile))
    return 0 if ok else 1


def _schedule_line(report: ScheduleReport, used: Schedule | None) -> str:
    parts = ", ".join(f"{name} {s.latency_ms:.3f} ms" for name, s in report.schedules.items()
                      if s.latency_ms is not None)
    runs = ("; whole runs " + ", ".join(f"{k} {ms:.3f} ms" for k, ms in report.runs.items())
            if report.runs else "")
    return (f"schedule: {used.name if used is not None else 'sequential'} (estimated "
            f"{parts}; {report.measured} stages measured, {report.stored} from the Fast-Run "
            f"database{runs})")


def plan_model(path: str, fusion: str | None, as_json: bool,
               shapes: InputShapes | None = None, rewrite: bool = False,
               schedule: bool = False, backend: str = backends.DEFAULT) -> int:
    """Print the fusion report (every planner's counts; the blocks and unfused edges of
    ``fusion``, of every planner when None), as text or JSON, of the model as imported or
    (``rewrite``) after the math-property rewrites; DNNFusion's yellow cells as the verdicts
    stored for ``backend`` decide (``compile_model(..., tuning='measure')`` or ``kernelgen run
    --tuning measure`` measures them). Nothing is compiled, except with
    ``schedule``: then the model is compiled for ``backend`` with ``fusion`` (default
    dnnfusion), the stage latencies measured, and the sequential, greedy and IOS schedules
    printed (stages, strategy, groups of kernels, measured latency)."""
    if schedule:
        return _plan_schedule(path, fusion or "dnnfusion", as_json, shapes, rewrite, backend)
    proto = load_model(path)
    graph = import_onnx(proto, shapes)
    applied: tuple[Applied, ...] = ()
    if rewrite:
        result = simplify(graph)
        graph, applied = result.graph, result.applied
    report = fusion_report(graph, model=proto, backend=backend)
    if as_json:
        data = report.to_dict()
        if rewrite:
            data["rewrites"] = [asdict(a) for a in applied]
        print(json.dumps(data, indent=1))
    else:
        if rewrite:
            print(f"rewrites: {_rewrites(applied)}")
        print(report.format(details=None if fusion is None else [fusion]))
    return 0


def _plan_schedule(path: str, fusion: str, as_json: bool, shapes: InputShapes | None,
                   rewrite: bool, backend: str) -> int:
    graph = import_onnx(load_model(path), shapes)
    session = compile_model(graph, backend=backend, fusion=fusion, rewrite=rewrite,
                            schedule="auto")
    report = session.schedule_report
    assert report is not None
    if as_json:
        data = {"model": path, "backend": session.backend, "fusion": fusion, **report.to_dict(),
                "used": session.plan.schedule.name if session.plan.schedule else "sequential"}
        print(json.dumps(data, indent=1))
        return 0
    print(f"model {path} on {session.backend}, fusion '{fusion}': {len(session.blocks)} "
          f"blocks")
    print(report)
    print(_schedule_line(report, session.plan.schedule))
    return 0


@dataclass
class BenchRow:
    """One configuration of ``bench_model``: a planner with or without the rewrites."""

    fusion: str
    rewrite: bool
    operators: int
    kernels: int
    compile_s: float  # import, plan and build, the first time in this process
    recompile_s: float  # the same again (kernels from the in-process and on-disk caches)
    latency_ms: float  # median of ``repeat`` runs
    intermediates_peak: int  # bytes of the slots intermediates share
    intermediates_total: int  # bytes of every intermediate, were each its own buffer
    max_error: float  # against onnxruntime without graph optimisations, relative to the max


@dataclass
class BenchResult:
    """``bench_model``'s measurements, with onnxruntime's beside them."""

    model: str
    backend: str
    threads: int
    rows: list[BenchRow]
    onnxruntime_ms: float | None
    onnxruntime_nodes: int | None

    def table(self) -> str:
        """The measurements as the text table ``kernelgen bench`` prints."""
        ort = self.onnxruntime_ms
        lines = [f"{self.model} on {self.backend} ({self.threads} threads); onnxruntime (all "
                 f"optimisations, {self.threads} threads): "
                 + (f"{ort:.3f} ms, {self.onnxruntime_nodes} nodes" if ort else "not installed"),
                 f"{'fusion':<10}{'rewrite':>8}{'kernels':>8}{'compile s':>10}{'again s':>8}"
                 f"{'ms':>9}{'ORT/ours':>9}{'peak KiB':>10}{'of KiB':>9}{'max err':>9}"]
        for r in self.rows:
            ratio = f"{ort / r.latency_ms:.2f}" if ort else "-"
            lines.append(f"{r.fusion:<10}{'yes' if r.rewrite else 'no':>8}{r.kernels:>8}"
                         f"{r.compile_s:>10.2f}{r.recompile_s:>8.2f}{r.latency_ms:>9.3f}"
                         f"{ratio:>9}{r.intermediates_peak / 1024:>10.0f}"
                         f"{r.intermediates_total / 1024:>9.0f}{r.max_error:>9.1e}")
        return "\n".join(lines)


def bench_model(path: str, backend: str, *, planners: Sequence[str] = tuple(PLANNERS),
                rewrites: Sequence[bool] = (False, True), repeat: int = 20,
                shapes: InputShapes | None = None, threads: int = 2) -> BenchResult:
    """Every planner, with and without the rewrites, on ``backend``, and onnxruntime with all
    its graph optimisations on ``threads`` threads, on the same seeded random inputs:
    kernels, compile time (first and again), median latency, intermediate memory, and the
    largest error against onnxruntime (relative to each output's largest magnitude)."""
    proto = load_model(path)
    graph = import_onnx(proto, shapes)
    feeds = _feeds(graph, None)
    want = _onnxruntime(proto, feeds, optimise=False)
    rows = []
    for rewrite in rewrites:
        for fusion in planners:
            times = []
            for _ in range(2):
                start = time.perf_counter()
                session = compile_model(proto, backend=backend, fusion=fusion,
                                        input_shapes=shapes, rewrite=rewrite)
                times.append(time.perf_counter() - start)
            got = session.run(None, feeds)
            error = 0.0
            for array, name in zip(got, session.graph.outputs):
                if want is not None:
                    ref = want[name].astype(np.float64)
                    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-30)
                    error = max(error, float(np.abs(array - ref).max(initial=0.0)) / scale)
            memory = session.plan.memory()
            latency = _median_ms(partial(session.run, None, feeds), repeat)
            rows.append(BenchRow(fusion, rewrite, len(session.graph.ops),
                                 len(session.plan.launches), times[0], times[1], latency,
                                 memory["intermediates_peak"], memory["intermediates_total"],
                                 error))
    ort = _onnxruntime_ms(proto, feeds, repeat, threads)
    nodes = fusion_report(graph, model=proto, planners=()).onnxruntime_nodes \
        if ort is not None else None
    return BenchResult(str(path), backend, threads, rows, ort, nodes)


def bench_command(path: str, backend: str, planners: Sequence[str] | None, *, repeat: int,
                  rewrites: Sequence[bool] = (False, True), shapes: InputShapes | None = None,
                  as_json: str | None = None) -> int:
    """Compile the model under every planner (or those named), with and without the
    rewrites, run each and onnxruntime on the same inputs, and print one table (kernels,
    compile time first and again, median latency and onnxruntime's time over it, intermediate
    memory: the shared slots' peak and every intermediate's total, the largest error)."""
    result = bench_model(path, backend, planners=planners or tuple(PLANNERS),
                         rewrites=rewrites, repeat=repeat, shapes=shapes)
    print(result.table())
    if as_json:
        Path(as_json).write_text(json.dumps(asdict(result), indent=1) + "\n")
    return 0


def _rewrites(applied: Sequence[Applied]) -> str:
    counts: dict[str, int] = {}
    for a in applied:
        counts[a.rule] = counts.get(a.rule, 0) + 1
    return ", ".join(f"{rule} x{n}" for rule, n in counts.items()) or "none applied"


def emit_model(path: str, directory: str, backend: str, fusion: str,
               shapes: InputShapes | None = None, rewrite: bool = False) -> int:
    """Compile the model (building nothing) and write every kernel's source, the launch order,
    the buffer assignment, the constants (.npy) and one manifest.json under ``directory``."""
    session = compile_model(path, backend=backend, fusion=fusion, input_shapes=shapes,
                            rewrite=rewrite, warmup=False)
    manifest = export(session, directory)
    files = len({f for k in json.loads(manifest.read_text())["kernels"] for f in k["files"]})
    print(f"wrote {len(session.plan.kernels)} kernels ({files} source files), "
          f"{len(session.plan.launches)} launches, "
          f"{len(session.plan.role('constant'))} constants: {manifest}")
    return 0


def _feeds(graph: Graph, inputs: str | None) -> dict[str, np.ndarray]:
    """The arrays of ``inputs`` (an .npz file, cast within their kind to the model's dtypes),
    else seeded random ones: normal floats, integers in [0, 4), booleans."""
    infos = graph.inputs
    if inputs is None:
        rng = np.random.default_rng(0)
        feeds = {}
        for info in infos:
            dtype = np.dtype(info.dtype.numpy)
            if dtype.kind == "f":
                feeds[info.name] = rng.standard_normal(info.shape).astype(dtype)
            elif dtype.kind == "b":
                feeds[info.name] = rng.random(info.shape) < 0.5
            else:
                feeds[info.name] = rng.integers(0, 4, info.shape).astype(dtype)
        return feeds
    try:
        with np.load(inputs, allow_pickle=False) as data:
            given = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise ModelError(f"--inputs {inputs}: cannot read the .npz file ({exc})") from exc
    names = [i.name for i in infos]
    unknown = sorted(set(given) - set(names))
    missing = [n for n in names if n not in given]
    if unknown or missing:
        raise ArgumentError(f"--inputs {inputs}: the model's inputs are {names}; "
                            + (f"missing {missing}" if missing else "")
                            + ("; " if missing and unknown else "")
                            + (f"unknown {unknown}" if unknown else ""))
    feeds = {}
    for info in infos:
        array, dtype = given[info.name], np.dtype(info.dtype.numpy)
        if array.dtype.kind != dtype.kind or array.shape != tuple(info.shape):
            raise ArgumentError(f"--inputs {inputs}: input '{info.name}' is {array.dtype}"
                                f"{list(array.shape)}, the model takes {dtype}"
                                f"{list(info.shape)}")
        feeds[info.name] = array.astype(dtype, copy=False)
    return feeds


def _check(proto: ModelProto, feeds: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
           rtol: float, atol: float) -> bool:
    """Print each output's largest error against onnxruntime (no graph optimisation, so that
    its rewrites are no part of the reference); True when all are within tolerance."""
    want = _onnxruntime(proto, feeds, optimise=False)
    if want is None:
        print("onnxruntime is not installed: outputs not checked")
        return True
    ok = True
    for name, array in got.items():
        ref = want[name]
        close = np.allclose(array, ref, rtol=rtol, atol=atol, equal_nan=True)
        ok &= bool(close)
        err = float(np.max(np.abs(array.astype(np.float64) - ref), initial=0.0))
        print(f"  {name}: {array.dtype}{list(array.shape)} max |kernelgen - onnxruntime| = "
              f"{err:.3g} ({'ok' if close else f'MISMATCH, rtol {rtol} atol {atol}'})")
    return ok


def _onnxruntime(proto: ModelProto, feeds: Mapping[str, np.ndarray], optimise: bool
                 ) -> dict[str, np.ndarray] | None:
    session = _ort_session(proto, optimise)
    if session is None:
        return None
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds))))


def _onnxruntime_ms(proto: ModelProto, feeds: Mapping[str, np.ndarray], repeat: int,
                    threads: int = 0) -> float | None:
    session = _ort_session(proto, optimise=True, threads=threads)
    if session is None:
        return None
    session.run(None, dict(feeds))
    return _median_ms(lambda: session.run(None, dict(feeds)), repeat)


def _ort_session(proto: ModelProto, optimise: bool, threads: int = 0) -> Any:
    """An onnxruntime CPU session (all graph optimisations, or none; ``threads`` intra-op
    threads, 0: onnxruntime's default), None without it."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    if not optimise:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _median_ms(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


__all__ = ["DEFAULT_MODEL", "BenchResult", "BenchRow", "bench_command", "bench_model",
           "emit_model", "parse_shapes", "plan_model", "run_model"]
