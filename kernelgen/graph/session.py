"""Running a whole model the way an onnxruntime user expects.

    session = kernelgen.compile_model("model.onnx", backend="opencl", fusion="none")
    probs, = session.run(None, {"data": x})        # or run(["prob"], ...)
    session.get_inputs()[0].name, .shape, .type    # 'data', (1, 3, 224, 224), 'tensor(float)'
    print(session.report())                        # blocks, kernels, memory, fusion
    session.fusion_report().to_dict()              # the fusion report as JSON data
    session.save("model.kg")                       # kernels, plan and weights, as files
    print(session.profile().table(10))             # the ten slowest launches, each timed
    kernelgen.compile_model(..., schedule="auto")  # IOS stages, kept where measured faster
    session = kernelgen.load_model("model.kg")     # runs as saved, compiling nothing

``compile_model`` imports the model (``import_onnx``; a ``Graph`` from another frontend is
taken as it is), plans its fusion blocks with the planner ``fusion`` names (``PLANNERS``),
and compiles them once (``compile_plan``). ``session.plan`` is the plan as plain data,
``session.blocks`` the planner's blocks, ``session.ecg`` the extended computation graph.
With ``schedule``, the blocks' stages are chosen from measured latencies (``scheduling.py``)
and compiled into the plan; ``session.schedule_report`` compares the schedules.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import backends
from ..api import Tuning, tuning_policy
from ..backends import Backend
from ..errors import ArgumentError
from ..ir.node import Value
from .ecg import ECG
from .executor import CompiledModel, compile_plan
from .model import Graph
from .plan import Plan
from .blocks import Block, Planner
from .planners import PLANNERS, planner
from .profile import Profile, profile
from .saved import load, save
from .scheduling import SCHEDULERS, ScheduleReport, fastest_by_whole_runs, schedule_model
from .simplify import Applied, simplify

if TYPE_CHECKING:  # the ONNX frontend and the report, loaded where used (``compile_model``,
    # ``fusion_report``): a saved model loads and runs without onnx (``load_model``)
    from onnx import ModelProto

    from .onnx_import import InputShapes, ModelLike
    from .report import FusionReport

_ONNX_TYPES = {"float32": "float", "float64": "double", "float16": "float16", "int32": "int32",
               "int64": "int64", "bool": "bool"}


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output, as onnxruntime's ``NodeArg``: name, shape, type."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def type(self) -> str:
        """ONNX's spelling: 'tensor(float)'."""
        return f"tensor({_ONNX_TYPES.get(self.dtype, self.dtype)})"


class Session:
    """A compiled model: ``run(output_names, {input name: array})`` -> list of arrays.
    ``source`` is the ONNX model it was compiled from (None for a ``Graph``)."""

    def __init__(self, graph: Graph, blocks: Sequence[Block], model: CompiledModel,
                 fusion: str, source: ModelProto | None = None) -> None:
        self.graph = graph
        self.blocks = tuple(blocks)
        self.model = model
        self.fusion = fusion
        self.source = source
        self.rewrites: tuple[Applied, ...] = ()  # the math-property rewrites applied
        self.schedule_report: ScheduleReport | None = None  # the schedules compared, if any
        self._reports: dict[tuple[str, ...], FusionReport] = {}

    @property
    def plan(self) -> Plan:
        return self.model.plan

    @property
    def backend(self) -> str:
        return self.plan.backend

    @cached_property
    def ecg(self) -> ECG:
        return ECG(self.graph)

    def get_inputs(self) -> list[TensorInfo]:
        return [_info(v.name, v) for v in self.graph.inputs]

    def get_outputs(self) -> list[TensorInfo]:
        return [_info(name, v) for name, v in self.graph.outputs.items()]

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: None = None) -> list[np.ndarray]:
        """The outputs ``output_names`` (all, in the model's order, for None) for the inputs
        ``input_feed`` by name. A missing, unknown or mis-shaped input or an unknown output
        name is an ``ArgumentError``. Runs may come from several threads at once."""
        if run_options is not None:
            raise ArgumentError("run_options are not supported (pass None)")
        names = list(self.graph.outputs) if output_names is None else list(output_names)
        unknown = [n for n in names if n not in self.graph.outputs]
        if unknown:
            raise ArgumentError(f"model '{self.graph.name}' has no output(s) {unknown}; its "
                                f"outputs are {list(self.graph.outputs)}")
        results = self.model.run(input_feed)
        return [results[n] for n in names]

    def profile(self, input_feed: Mapping[str, Any] | None = None, rounds: int = 20
                ) -> Profile:
        """Each launch timed on its own, on ``input_feed`` (zeros when None), medians of
        ``rounds``: device time where the runtime counts it, and the host's round trip
        (``profile.py``)."""
        return profile(self.model, input_feed, rounds)

    def save(self, path: str | Path) -> Path:
        """Write this session under the directory ``path`` (kernels, plan, constants), to be
        loaded by ``load_model`` without compiling again (``saved.py``)."""
        return save(self, path)

    def fusion_report(self, planners: Sequence[str] = tuple(PLANNERS)) -> FusionReport:
        """The fusion report (``report.fusion_report``): this session's blocks, and those of
        the other ``planners`` planned (not compiled) for comparison, with onnxruntime's
        optimised node count when the session came from an ONNX model."""
        if self.plan.launches and not self.graph.ops:
            raise ArgumentError(f"model '{self.graph.name}' was loaded from a save, which holds "
                                f"its kernels, not its operators: no fusion report")
        from .report import fusion_report

        key = tuple(planners)
        if key not in self._reports:
            self._reports[key] = fusion_report(self.graph, key, self.source,
                                               planned={self.fusion: self.blocks},
                                               backend=self.backend)
        return self._reports[key]

    def report(self) -> str:
        """What ran how: the planner, each block's operators and kernel, memory, then the
        fusion report (every planner's counts, this session's blocks and unfused edges)."""
        if self.plan.launches and not self.graph.ops:  # loaded from a save
            return (f"model '{self.graph.name}' on {self.backend}, fusion '{self.fusion}', "
                    f"loaded: {len(self.plan.kernels)} distinct kernels\n{self.plan}")
        mem = self.plan.memory()
        kernels = self.plan.kernels
        lines = [f"model '{self.graph.name}' on {self.backend}, fusion '{self.fusion}': "
                 f"{len(self.graph.ops)} operators in {len(self.blocks)} blocks, "
                 f"{len(kernels)} distinct kernels",
                 f"intermediates: {mem['intermediates_peak']:,} bytes in "
                 f"{len(self.plan.slots)} slots, of {mem['intermediates_total']:,} if none "
                 f"were shared (at least {mem['intermediates_live_peak']:,} alive at once); "
                 f"constants on the device: {mem['constants_resident']:,} bytes",
                 "compile: " + ", ".join(f"{k} {v:.2f}" for k, v in self.model.timings.items())]
        if self.rewrites:
            counts: dict[str, int] = {}
            for a in self.rewrites:
                counts[a.rule] = counts.get(a.rule, 0) + 1
            lines.append("rewrites: " + ", ".join(f"{k} x{n}" for k, n in counts.items()))
        # a block's launches by its operators: a view block (a Slice, a Concat assembled in
        # place) launches nothing, and a merged one (IOS) shares its launch with its siblings
        launched: dict[str, list[int]] = {}
        for launch in self.plan.launches:
            for name in launch.ops:
                launched.setdefault(name, []).append(launch.kernel)
        for k, block in enumerate(self.blocks):
            ids = list(dict.fromkeys(i for name in block.names for i in launched.get(name, ())))
            ran = "+".join(f"k{kernels[i].id}" for i in ids) or "-"
            how = "+".join(dict.fromkeys(kernels[i].algorithm or kernels[i].schedule
                                         for i in ids)) or "view"
            kinds = "+".join(op.kind for op in block.ops)
            lines.append(f"  {k:4d} {kinds:32s} {ran:5s} {how:14s} {', '.join(block.names)}")
        if self.schedule_report is not None:
            used = self.plan.schedule.name if self.plan.schedule is not None else "sequential"
            lines += ["", self.schedule_report.format(used)]
        lines += ["", self.fusion_report().format(details=[self.fusion])]
        return "\n".join(lines)


def load_model(path: str | Path, *, warmup: bool = True) -> Session:
    """The ``Session`` that ``Session.save`` wrote under ``path``, running exactly as the saved
    one did, without compiling or tuning: the backend's driver builds the saved sources
    (``warmup``: now; else at the first run). A missing or corrupted file, or a model saved by
    another kernelgen version or for another device, is a ``ModelError`` naming it; its
    ``graph`` holds the inputs and outputs only (no operators, so no fusion report)."""
    model, fusion = load(path, warmup=warmup)
    return Session(model.graph, (), model, fusion)


def _info(name: str, v: Value) -> TensorInfo:
    return TensorInfo(name, tuple(v.shape), str(v.dtype))


def compile_model(model: ModelLike | Graph, backend: str | Backend = backends.DEFAULT,
                  fusion: str | Planner = "none", input_shapes: InputShapes | None = None,
                  rewrite: bool = False, schedule: str | None = None,
                  schedule_options: Mapping[str, Any] | None = None, **options: Any) -> Session:
    """A ``Session`` running ``model`` (an ONNX path, bytes, ``ModelProto``, or a ``Graph``)
    on ``backend``. ``fusion`` names the planner (``kernelgen.graph.PLANNERS``: 'none' runs
    one kernel per operator); ``input_shapes`` fixes symbolic input dimensions by input name;
    ``rewrite`` applies the math-property rewrites (``simplify``) before planning.
    ``schedule`` ('auto', 'ios', 'greedy' or 'sequential'; default None, the blocks one after
    another unmeasured) measures the blocks' stage latencies and compiles the named schedule,
    or with 'auto' the fastest in whole runs of the sequential plan and each schedule whose
    summed stage latencies beat it, kept where it beats running the blocks one after another
    (``scheduling.fastest_by_whole_runs``; ``schedule_report.runs``); ``schedule_options``
    are IOS's pruning (``r``, ``s``, ``max_part``) and ``db``, the Fast-Run database.
    Options: ``tuning`` ('stored', the default: the Fast-Run database's tunables and yellow
    cells' verdicts, else the defaults and yellow cells unfused; 'none'; 'measure', which also
    times each yellow cell the DNNFusion planner meets against its split; 'measure-fusion',
    the stored tunables with the yellow cells timed; or a policy),
    ``algorithm`` (the convolution algorithm of every block holding a Conv), ``warmup`` (True:
    build every kernel now, not at the first run), and backend tunables applied to every
    block."""
    tuning: Tuning = options.pop("tuning", "stored")
    policy = tuning_policy(tuning)
    plan_blocks = planner(fusion, backend, policy)  # yellow cells: the policy's verdicts
    if isinstance(model, Graph) and input_shapes is not None:
        raise TypeError("input_shapes fixes an ONNX model's inputs; a Graph has its shapes")
    start = time.perf_counter()
    source = None
    if isinstance(model, Graph):
        graph = model
    else:
        from .onnx_import import import_onnx
        from .onnx_import import load_model as load_onnx

        source = load_onnx(model)
        graph = import_onnx(source, input_shapes)
    imported = time.perf_counter() - start
    rewrites: tuple[Applied, ...] = ()
    if rewrite:
        graph, rewrites = _rewritten(graph)
    if schedule is not None and schedule != "auto" and schedule not in SCHEDULERS:
        raise ArgumentError(f"unknown schedule '{schedule}'; known: 'auto', "
                            + ", ".join(f"'{n}'" for n in SCHEDULERS))
    blocks = plan_blocks(graph)
    compiled = compile_plan(graph, blocks, backend, tuning=policy, **options)
    timings = {"import_s": imported, **compiled.timings}
    report = None
    if schedule not in (None, "sequential"):
        start = time.perf_counter()
        names = SCHEDULERS if schedule == "auto" else ("sequential", schedule)
        report = estimates = schedule_model(graph, blocks, compiled, schedulers=names,
                                            tuning=policy, **(schedule_options or {}))
        applied: dict[str, tuple[Graph, list[Block]]] = {}

        def scheduled(name: str, graph: Graph = graph, blocks: list[Block] = blocks
                      ) -> CompiledModel:
            g, b, stages = estimates.applied(graph, blocks, name)
            applied[name] = (g, b)
            return compile_plan(g, b, backend, tuning=policy, schedule=stages, **options)

        if schedule == "auto":  # the fastest in whole runs, of those the estimates favour
            db = (schedule_options or {}).get("db")
            chosen, chosen_model = fastest_by_whole_runs(report, compiled, scheduled, db)
        else:
            chosen, chosen_model = schedule, scheduled(schedule)
        if chosen != "sequential":
            (graph, blocks), compiled = applied[chosen], chosen_model
        timings["schedule_s"] = time.perf_counter() - start
    compiled.timings = timings
    name = fusion if isinstance(fusion, str) else getattr(fusion, "__name__", "custom")
    session = Session(graph, blocks, compiled, name, source)
    session.rewrites = rewrites
    session.schedule_report = report
    return session


def _rewritten(graph: Graph) -> tuple[Graph, tuple[Applied, ...]]:
    result = simplify(graph)
    return result.graph, result.applied
