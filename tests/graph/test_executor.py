"""The executor and the Session API: small ONNX graphs compiled once (module-scoped sessions)
agree with onnxruntime; constants are uploaded at compile time, not per run; intermediates share
device memory by liveness; the planner contract and the liveness assignment on their own."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import require
from onnx import helper, numpy_helper
from onnx_graphs import CASES, io, model, onnxruntime_run, randn

import kernelgen as kg
from kernelgen.graph import Block, check_plan, memory, plan_none
from kernelgen.graph.export import export

DEVICES = ("opencl", "neon")


@pytest.fixture(scope="module", params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    require(request.param)
    return request.param


@pytest.fixture(scope="module")
def sessions(device: str) -> dict[str, tuple[kg.Session, dict[str, np.ndarray]]]:
    """Every small graph compiled once per device, with its feeds."""
    out = {}
    for name, make in CASES.items():
        m, feeds = make()
        out[name] = (kg.compile_model(m, backend=device, fusion="none"), feeds, m)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_session_agrees_with_onnxruntime(sessions: dict[str, Any], case: str) -> None:
    session, feeds, m = sessions[case]
    want = onnxruntime_run(m, feeds)
    for _ in range(2):  # a second run reuses the slots and the resident constants
        got = session.run(None, feeds)
        assert len(got) == len(want)
        for array, (name, ref) in zip(got, want.items()):
            np.testing.assert_allclose(array, ref, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_run_reads_its_own_inputs(sessions: dict[str, Any], case: str) -> None:
    """A run copies its inputs into buffers its launches were bound to once: runs on other
    values, and back on the first, each give onnxruntime's outputs for their own inputs."""
    session, feeds, m = sessions[case]
    other = {name: (randn(*a.shape) if a.dtype == np.float32 else a)
             for name, a in feeds.items()}
    for values in (feeds, other, feeds):
        want = onnxruntime_run(m, values)
        for array, (name, ref) in zip(session.run(None, values), want.items()):
            np.testing.assert_allclose(array, ref, rtol=1e-4, atol=1e-5, err_msg=name)


def test_blocks_sharing_a_kernel_keep_their_own_packed_weights(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two MatMuls of one shape by different constant weights share one compiled kernel,
    which packs its weights once (``Launch.pack_once``): each block keeps panels of its own
    weights, packed when the run's launches are bound, so later runs launch no packing kernel
    and every run gives onnxruntime's outputs for its own input."""
    require("opencl")
    import pyopencl as cl
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["p"]),
             helper.make_node("Relu", ["p"], ["y1"]),
             helper.make_node("MatMul", ["x", "w2"], ["q"]),
             helper.make_node("Relu", ["q"], ["y2"])]
    inits = [numpy_helper.from_array(randn(29, 43, scale=0.2), name) for name in ("w1", "w2")]
    m = model(nodes, [io("x", (13, 29))], [io("y1", (13, 43)), io("y2", (13, 43))], inits)
    session = kg.compile_model(m, backend="opencl", fusion="dnnfusion")
    kernels = {launch.kernel for launch in session.plan.launches}
    if len(session.plan.launches) != 2 or len(kernels) != 1:
        pytest.fail(f"the two blocks should share one kernel: {session.plan.launches}")
    (kernel,) = (session.model.executables[k] for k in kernels)
    if not kernel.metadata.get("packed_once"):
        pytest.skip("the OpenCL device builds no float vectors (no packing template)")
    session.run(None, {"x": randn(13, 29)})  # binds the launches: both packs happen here
    launched: list[str] = []
    enqueue = cl.enqueue_nd_range_kernel

    def counted(queue: Any, k: Any, *args: Any, **kwargs: Any) -> Any:
        launched.append(k.function_name)
        return enqueue(queue, k, *args, **kwargs)
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", counted)
    for _ in range(3):
        feeds = {"x": randn(13, 29)}
        want = onnxruntime_run(m, feeds)
        for array, (name, ref) in zip(session.run(None, feeds), want.items()):
            np.testing.assert_allclose(array, ref, rtol=1e-4, atol=1e-5, err_msg=name)
    assert launched == [kernel.name] * 6


def _winograd_chain() -> Any:
    """Three 3x3 convolutions of 5 -> 7 -> 3 -> 6 channels over 9x11, then a Relu: each
    a Winograd program whose stages hand buffers of other sizes to each other."""
    channels = (5, 7, 3, 6)
    nodes, inits, prev = [], [], "x"
    for k, (cin, cout) in enumerate(zip(channels, channels[1:])):
        nodes.append(helper.make_node("Conv", [prev, f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1],
                                      kernel_shape=[3, 3]))
        inits.append(numpy_helper.from_array(randn(cout, cin, 3, 3, scale=0.3), f"w{k}"))
        prev = f"c{k}"
    nodes.append(helper.make_node("Relu", [prev], ["y"]))
    return model(nodes, [io("x", (1, 5, 9, 11))], [io("y", (1, 6, 9, 11))], inits)


def test_programs_share_their_stages_buffers(device: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Programs that run one after another share their stages' intermediates: a set of
    buffers holds the largest of each stage's, not every program's, and every run on new
    inputs matches onnxruntime."""
    m = _winograd_chain()
    session = kg.compile_model(m, backend=device, fusion="none", algorithm="winograd")
    programs = [e for e in session.model.executables if isinstance(e, kg.Program)]
    assert len(programs) == 3
    for _ in range(2):
        feeds = {"x": randn(1, 5, 9, 11)}
        np.testing.assert_allclose(session.run(None, feeds)[0], onnxruntime_run(m, feeds)["y"],
                                   rtol=1e-4, atol=1e-4)
    sizes: dict[tuple[int, str], int] = {}
    for p in programs:
        for j, b in enumerate(p.intermediates):
            sizes[(j, str(b.dtype))] = max(sizes.get((j, str(b.dtype)), 0), b.numel)
    allocated: list[int] = []
    runtime = type(session.model.runtime)  # every kernel's, the programs' stages' too
    empty = runtime.device_empty

    def recording(self: Any, buffer: Any) -> Any:
        allocated.append(buffer.numel)
        return empty(self, buffer)

    monkeypatch.setattr(runtime, "device_empty", recording)
    session.model.bind({"x": randn(1, 5, 9, 11)})  # a new set of buffers
    plan = session.plan
    expected = [s.numel for s in plan.slots] + [int(np.prod(b.shape)) for b in plan.buffers
                                                 if b.role in ("input", "output")]
    assert sorted(allocated) == sorted(expected + list(sizes.values()))
    assert sum(sizes.values()) < sum(b.numel for p in programs for b in p.intermediates)


def _winograd_repeats(weights: int) -> Any:
    """Three 3x3 convolutions of 6 channels over 9x11, each followed by a Relu: blocks of one
    structure, ``weights`` of them with weights of their own (the rest repeat the first's)."""
    nodes, inits, prev = [], [], "x"
    for k in range(3):
        w = f"w{min(k, weights - 1)}"
        nodes += [helper.make_node("Conv", [prev, w], [f"c{k}"], pads=[1, 1, 1, 1],
                                   kernel_shape=[3, 3]),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"])]
        prev = f"r{k}"
    inits = [numpy_helper.from_array(randn(6, 6, 3, 3, scale=0.3), f"w{k}")
             for k in range(weights)]
    return model(nodes, [io("x", (1, 6, 9, 11))], [io(prev, (1, 6, 9, 11))], inits)


def test_programs_of_one_structure_share_their_kernels(device: str) -> None:
    """Winograd programs fold their block's weights into themselves (the filter transform), so
    blocks of one structure cannot share one program; they share its kernels, each program
    holding its own block's transformed weights: three programs, one set of stages, and the
    model matches onnxruntime (it would not with the first block's weights everywhere)."""
    m = _winograd_repeats(3)
    session = kg.compile_model(m, backend=device, fusion="dnnfusion", algorithm="winograd")
    programs = [e for e in session.model.executables if isinstance(e, kg.Program)]
    assert len(programs) == 3
    assert all(p.kernels == programs[0].kernels for p in programs)  # the very same kernels
    filters = [next(iter(p.folded.values())) for p in programs]
    assert not np.array_equal(filters[0], filters[1])
    assert not np.array_equal(filters[1], filters[2])
    for _ in range(2):
        feeds = {"x": randn(1, 6, 9, 11)}
        np.testing.assert_allclose(session.run(None, feeds)[0],
                                   onnxruntime_run(m, feeds)["r2"], rtol=1e-4, atol=1e-4)


def test_shared_kernels_are_exported_once(device: str, tmp_path: Path) -> None:
    """The three programs' stages are one set of sources: ``export`` writes each source once
    and every program's entry names those files, each with its own folded filter; saved so
    and loaded back, the model still matches onnxruntime."""
    m = _winograd_repeats(3)
    session = kg.compile_model(m, backend=device, fusion="dnnfusion", algorithm="winograd")
    manifest = json.loads(export(session, tmp_path / "emitted").read_text())
    programs = [k for k in manifest["kernels"] if k["kind"] == "program"]
    assert len(programs) == 3 and all(p["files"] == programs[0]["files"] for p in programs)
    sources = {e.source for e in session.model.executables if not isinstance(e, kg.Program)}
    sources |= {k.source for k in session.model.executables[programs[0]["id"]].kernels}
    assert len(list((tmp_path / "emitted" / "kernels").iterdir())) == len(sources)
    folded = [next(iter(p["folded"].values())) for p in programs]
    assert len(set(folded)) == 3
    session.save(tmp_path / "saved")
    loaded = kg.load_model(tmp_path / "saved")
    feeds = {"x": randn(1, 6, 9, 11)}
    np.testing.assert_allclose(loaded.run(None, feeds)[0], onnxruntime_run(m, feeds)["r2"],
                               rtol=1e-4, atol=1e-4)


def test_a_program_rebound_to_another_structure_is_refused(device: str) -> None:
    """``Program.rebound`` takes a block of the same inputs (names, shapes, constants) only."""
    m = _winograd_repeats(1)
    session = kg.compile_model(m, backend=device, fusion="dnnfusion", algorithm="winograd")
    program = next(e for e in session.model.executables if isinstance(e, kg.Program))
    other = [kg.tensor(v.name, (1, 7, 9, 11)) if not isinstance(v, kg.Constant) else v
             for v in program.inputs]
    with pytest.raises(ValueError, match="takes"):
        program.rebound(other)


class _Counting:
    """A runtime that counts host-to-device copies: new device arrays and copies into
    buffers."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.uploads = inner, 0

    def device_array(self, array: np.ndarray) -> Any:
        self.uploads += 1
        return self.inner.device_array(array)

    def write(self, handle: Any, array: np.ndarray) -> None:
        self.uploads += 1
        self.inner.write(handle, array)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_constants_are_uploaded_once(sessions: dict[str, Any],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Per run only the inputs go to the device: Conv's weight and bias were uploaded when the
    model was compiled."""
    session, feeds, _ = sessions["conv_relu_add"]
    plan = session.plan
    resident = [b.name for b in plan.buffers if b.role == "constant" and b.resident]
    assert sorted(resident) == ["b", "w"]
    counting = _Counting(session.model.runtime)
    monkeypatch.setattr(session.model, "runtime", counting)
    session.run(None, feeds)
    session.run(None, feeds)
    assert counting.uploads == 2 * len(feeds)


def test_session_api(sessions: dict[str, Any]) -> None:
    session, feeds, _ = sessions["conv_relu_add"]
    (inp,) = session.get_inputs()
    assert (inp.name, inp.shape, inp.type) == ("x", (1, 4, 7, 5), "tensor(float)")
    assert [o.name for o in session.get_outputs()] == ["y", "z"]
    (z,) = session.run(["z"], feeds)
    y, z_all = session.run(None, feeds)
    np.testing.assert_array_equal(z, z_all)
    with pytest.raises(kg.ArgumentError, match=r"no output\(s\) \['nope'\]"):
        session.run(["nope"], feeds)
    with pytest.raises(kg.ArgumentError):
        session.run(None, {})
    with pytest.raises(kg.ArgumentError):
        session.run(None, {"x": randn(1, 4, 7, 6)})
    report = session.report()
    assert "fusion 'none'" in report and "Conv" in report
    assert "onnxruntime's optimised graph" in report and "planner 'none': 4 block(s)" in report
    fusion = session.fusion_report()
    assert fusion["none"].counts.kernels == len(session.plan.launches) == 4
    assert fusion["none"].counts.intermediate_bytes == session.plan.memory()[
        "intermediates_total"]


def _chain(length: int) -> Any:
    """x -> (Exp, Neg)* -> y: every intermediate dies at the next launch but one."""
    nodes, prev = [], "x"
    for k in range(length):
        out = "y" if k == length - 1 else f"t{k}"
        nodes.append(helper.make_node("Neg" if k % 2 else "Sigmoid", [prev], [out]))
        prev = out
    return model(nodes, [io("x", (3, 17))], [io("y", (3, 17))])


def test_intermediates_share_slots(device: str) -> None:
    """Eight launches in a chain: seven intermediates of one size fit in two slots, and the
    plan reports the sum beside the peak."""
    m = _chain(8)
    session = kg.compile_model(m, backend=device)
    feeds = {"x": randn(3, 17)}
    np.testing.assert_allclose(session.run(None, feeds)[0], onnxruntime_run(m, feeds)["y"],
                               rtol=1e-5, atol=1e-6)
    mem = session.plan.memory()
    assert len(session.plan.slots) == 2
    assert mem["intermediates_total"] == 7 * 3 * 17 * 4
    assert mem["intermediates_peak"] == mem["intermediates_live_peak"] == 2 * 3 * 17 * 4
    assert mem["intermediates_peak"] < mem["intermediates_total"]
    assert "slots" in str(session.plan) and session.plan.to_dict()["memory"] == mem


def test_liveness_assignment() -> None:
    """Overlapping lives never share a slot; a slot is as large as its largest tenant; dtypes
    do not mix."""
    iv = memory.Interval
    intervals = [iv(0, 0, 1, "float32", 100, 400), iv(1, 1, 2, "float32", 50, 200),
                 iv(2, 2, 3, "float32", 100, 400), iv(3, 3, 4, "int64", 10, 80),
                 iv(4, 0, 4, "float32", 1, 4)]
    where, slots = memory.assign(intervals)
    by = {i.buffer: i for i in intervals}
    for a in intervals:
        for b in intervals:
            if a.buffer < b.buffer and where[a.buffer] == where[b.buffer]:
                assert not a.overlaps(b) and a.dtype == b.dtype
    for buf, slot in where.items():
        assert slots[slot].nbytes >= by[buf].nbytes
    assert where[0] == where[2] and where[3] != where[0]
    assert memory.live_peak(intervals) == 400 + 200 + 4


def test_check_plan_names_the_operator() -> None:
    m, _ = CASES["conv_relu_add"]()
    graph = kg.import_onnx(m)
    blocks = plan_none(graph)
    check_plan(graph, blocks)
    with pytest.raises(kg.FusionError, match="leaves out 1 operator"):
        check_plan(graph, blocks[:-1])
    with pytest.raises(kg.FusionError, match="is in blocks 0 and 1"):
        check_plan(graph, [blocks[0], Block(blocks[0].ops), *blocks[1:]])
    with pytest.raises(kg.FusionError, match="computes later"):
        check_plan(graph, [blocks[1], blocks[0], *blocks[2:]])


def test_unknown_planner_is_named() -> None:
    m, _ = CASES["conv_relu_add"]()
    with pytest.raises(kg.AttributeError_, match="fusion"):
        kg.compile_model(m, fusion="bogus")


def test_profile_finds_the_heavy_launch(device: str) -> None:
    """``Session.profile`` times each launch on its own: of a 257x384x320 MatMul (63 MFLOP)
    and a Relu of 7 elements beside it, the MatMul is the slow one; every launch is listed
    with its operators by kind, on OpenCL by the device's counters (NEON C's runtime has
    none: the host's round trips), and runs after the profile still match onnxruntime."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Sigmoid", ["p"], ["y"]),
             helper.make_node("Relu", ["s"], ["z"])]
    inits = [numpy_helper.from_array(randn(384, 320, scale=0.05), "w")]
    m = model(nodes, [io("x", (257, 384)), io("s", (7,))],
              [io("y", (257, 320)), io("z", (7,))], inits)
    session = kg.compile_model(m, backend=device, fusion="none")
    feeds = {"x": randn(257, 384), "s": randn(7)}
    prof = session.profile(feeds, rounds=5)
    assert [t.launch for t in prof.launches] == list(range(len(session.plan.launches))) == [0, 1, 2]
    by_kind = {t.ops[0].split("(")[0]: t for t in prof.launches}
    assert sorted(by_kind) == ["MatMul", "Relu", "Sigmoid"]
    assert by_kind["MatMul"].flops == 2 * 257 * 384 * 320
    assert by_kind["MatMul"].ms > by_kind["Relu"].ms > 0
    assert max(prof.launches, key=lambda t: t.ms) is by_kind["MatMul"]
    assert prof.clock == ("device" if device == "opencl" else "host")
    assert all(t.waited_ms > 0 for t in prof.launches)
    table = prof.table(top=1).splitlines()
    assert len(table) == 3 and "MatMul(p)" in table[1] and "3 launches" in table[2]
    want = onnxruntime_run(m, feeds)
    for array, (name, ref) in zip(session.run(None, feeds), want.items()):
        np.testing.assert_allclose(array, ref, rtol=1e-4, atol=1e-5, err_msg=name)


def test_profile_times_programs_and_their_folded_weights(device: str) -> None:
    """A Winograd program is one launch of the profile, its stages named; the profile binds
    the constants the programs folded into themselves as well."""
    session = kg.compile_model(_winograd_chain(), backend=device, fusion="none",
                               algorithm="winograd")
    prof = session.profile(rounds=2)
    assert [t.ops[0].split("(")[0] for t in prof.launches] == ["Conv", "Conv", "Conv", "Relu"]
    assert all(t.ms > 0 and t.flops > 0 for t in prof.launches[:3])
    assert all("stages" in t.schedule or "+" in t.schedule for t in prof.launches[:3])
