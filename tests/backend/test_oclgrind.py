"""Every OpenCL schedule and template under Oclgrind, a simulator that checks each memory access
of each work-item: out-of-bounds reads and writes, data races, uninitialised values, barriers
reached by part of a work-group, and (started with a declared device's limits) work-groups and
local memory over them. The cases (``tests/oclgrind_cases.py``: elementwise, unrolled, row,
group, item, tiled with both templates, packed panels by a first launch and in the tile,
window, AGO, staged attention, Winograd's stages, im2col, the padded-operand program, gathers)
run at small awkward shapes, each emitted for a device profile, run by a worker process on
Oclgrind started with that profile's work-group and local-memory limits
(``tests/oclgrind_worker.py``), and compared with the IR interpreter. A case fails on any
Oclgrind report, a wrong value, a launch over the profile's limits or a kernel on another
schedule than it names.

The default run (CI) takes the cases marked ``ci`` for 'cpu-avx512' (the code PoCL runs here)
and 'mobile-gpu' (256-item work-groups, 32 KiB of local memory), one worker process each, with
the deliberately broken kernels that show every check takes effect. The full sweep, every case
for every profile ('cpu-avx512', 'cpu-sse', 'mobile-gpu', 'desktop-gpu'):

    KERNELGEN_OCLGRIND_FULL=1 .venv/bin/pytest -m oclgrind_full tests/backend/test_oclgrind.py

One target and case by hand, with Oclgrind's reports in the JSON it prints:

    .venv/bin/python tests/oclgrind_worker.py mobile-gpu window-3x3 --self-check
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import require
from oclgrind_cases import CASES, label

from kernelgen.backends.opencl.device import PROFILES

WORKER = Path(__file__).parent.parent / "oclgrind_worker.py"
CI_TARGETS = ("cpu-avx512", "mobile-gpu")
CI_CASES = tuple(name for name, case in CASES.items() if case.ci)
WORKER_TIMEOUT_S = 3600
_results: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}


def sweep(targets: tuple[str, ...], names: tuple[str, ...], target: str) -> dict[str, Any]:
    """The worker's results for ``target`` over ``names``: the first call starts one worker
    per target of ``targets`` at once (with the broken kernels' self-check) and waits for all;
    a worker that failed gives {'worker': why}."""
    if (target, names) not in _results:
        with tempfile.TemporaryDirectory(prefix="oclgrind-") as tmp:
            running = {}
            for t in targets:
                out = Path(tmp) / f"{t}.json"
                cmd = [sys.executable, str(WORKER), t, *names, "--self-check", "--json", str(out)]
                running[t] = (out, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE, text=True))
            for t, (out, proc) in running.items():
                try:
                    _, err = proc.communicate(timeout=WORKER_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                _results[t, names] = json.loads(out.read_text()) if out.exists() else {
                    "worker": f"the worker for {t} ended with {proc.returncode}:\n{err[-6000:]}"}
    return _results[target, names]


def summary(reports: str) -> str:
    """Oclgrind's reports as a count, the distinct kernels and source lines they name, and the
    first report in full."""
    blocks = [b for b in re.split(r"\n\s*\n", reports) if b.strip()]
    places = sorted({f"{k} / line {n}" for k, n in re.findall(
        r"Kernel:\s*(\S+).*?At line (\d+)", reports, re.S)})
    return (f"{len(blocks)} report block(s) at: {'; '.join(places) or 'no source line'}\n"
            f"first:\n{blocks[0] if blocks else ''}")


def check(results: dict[str, Any], name: str, target: str) -> None:
    if "worker" in results:
        pytest.fail(results["worker"])
    result = results[name]
    said = []
    if result["problems"]:
        said.append("problems:\n" + "\n".join(result["problems"]))
    if result["oclgrind"]:
        said.append("Oclgrind reported " + summary(result["oclgrind"]))
    assert not said, f"case {name} on {target} (kernels {result['labels']}):\n" + "\n".join(said)


def check_self_check(results: dict[str, Any], target: str) -> None:
    if "worker" in results:
        pytest.fail(results["worker"])
    missed = {name: r["oclgrind"] + "".join(r["problems"])
              for name, r in results["self-check"].items() if not r["seen"]}
    assert not missed, f"checks that did not behave on {target}: {missed}"


@pytest.mark.parametrize("target", CI_TARGETS)
def test_checks_take_effect(target: str) -> None:
    """Each check reports its deliberately broken kernel in the workers' environment, the
    limits are the profile's (a work-group and local memory at the limit run, past it fail),
    and a clean kernel draws no report."""
    require("oclgrind")
    check_self_check(sweep(CI_TARGETS, CI_CASES, target), target)


@pytest.mark.parametrize("target", CI_TARGETS)
@pytest.mark.parametrize("name", CI_CASES)
def test_case(name: str, target: str) -> None:
    require("oclgrind")
    check(sweep(CI_TARGETS, CI_CASES, target), name, target)


@pytest.mark.oclgrind_full
@pytest.mark.skipif(not os.environ.get("KERNELGEN_OCLGRIND_FULL"),
                    reason="the full Oclgrind sweep: set KERNELGEN_OCLGRIND_FULL=1")
@pytest.mark.parametrize("target", tuple(PROFILES))
@pytest.mark.parametrize("name", tuple(CASES))
def test_full_sweep(name: str, target: str) -> None:
    require("oclgrind")
    check(sweep(tuple(PROFILES), tuple(CASES), target), name, target)


@pytest.mark.oclgrind_full
@pytest.mark.skipif(not os.environ.get("KERNELGEN_OCLGRIND_FULL"),
                    reason="the full Oclgrind sweep: set KERNELGEN_OCLGRIND_FULL=1")
@pytest.mark.parametrize("target", tuple(PROFILES))
def test_full_sweep_checks_take_effect(target: str) -> None:
    require("oclgrind")
    check_self_check(sweep(tuple(PROFILES), tuple(CASES), target), target)


# every schedule and template the issue lists, as ``label`` names them
SCHEDULES = {"elementwise", "elementwise+unroll", "row", "group", "item", "tiled",
             "tiled+scalar", "tiled+pack", "tiled+pack_in_tile", "window", "row+staged",
             "item+staged", "columns", "elementwise+interleaved"}
# the kinds of block whose kernels carry no label of their own: cases named for them
BLOCKS = ("ago-", "winograd-2x2", "winograd-4x4", "im2col", "padded-operand", "gather-")


@pytest.mark.parametrize("subset", ["ci", "full"])
def test_cases_cover_every_schedule(subset: str) -> None:
    cases = [c for c in CASES.values() if c.ci or subset == "full"]
    labels = {lab for c in cases for kind in ("cpu", "gpu") for lab in c.expected(kind)}
    assert SCHEDULES <= labels, f"not covered: {SCHEDULES - labels}"
    missing = [b for b in BLOCKS if not any(c.name.startswith(b) for c in cases)]
    assert not missing, f"no case for {missing}"
    assert label({"schedule": "tiled", "tunables": {"pack": True, "pack_in_tile": True,
                                                    "vector_width": 4}}) == "tiled+pack_in_tile"
