"""ONNX's own node test cases through kernelgen's ONNX backend (``kernelgen.graph.onnx_backend``).

The cases are generated in-process from ``onnx.backend.test.case`` (the models and the expected
outputs ONNX computed with NumPy), and every case whose first node's op type kernelgen claims
(``kernelgen.CONSTRUCTORS``) is run. Each ends as one of:

- ``pass``: every output has the expected shape and dtype and matches within the case's own
  ``rtol``/``atol`` (NaN where NaN is expected);
- ``refused``: kernelgen refused the model with one of its errors (an input dtype, attribute,
  empty tensor or output it does not handle), naming the node; the variant is not claimed;
- ``wrong`` or ``crash``: a wrong value, shape or dtype, or any other exception. These fail
  the CI test.

    .venv/bin/python tests/graph/onnx_conformance.py [--backend neon] [--json out.json]

prints one line per op type (passed / refused / failed) and every case that did not pass.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

import kernelgen as kg
from kernelgen.errors import ArgumentError, KernelgenError
from kernelgen.graph import onnx_backend


@dataclass
class Outcome:
    case: str
    op: str
    status: str  # 'pass', 'refused', 'wrong', 'crash'
    detail: str = ""


def claimed_cases() -> list[Any]:
    """ONNX's node test cases whose first node kernelgen claims to implement."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():  # the generators' own overflow warnings
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return [c for c in cases if c.model.graph.node and c.model.graph.node[0].op_type in
            kg.CONSTRUCTORS]


def _array(x: Any) -> np.ndarray:
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


def _compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str:
    """'' when ``got`` matches ``want``, else what differs."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    if want.dtype.kind in "fc":
        ok = np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = np.array_equal(got, want)
    if ok:
        return ""
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True) \
        if want.dtype.kind in "fc" else got != want
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{int(bad.sum())} of {bad.size} values differ; at {where}: got {got[where]!r}, " \
           f"expected {want[where]!r}"


def run_case(case: Any, backend: str) -> Outcome:
    """One test case on ``backend``: prepared once, run on each of its data sets."""
    op = case.model.graph.node[0].op_type
    try:
        with np.errstate(all="ignore"):
            rep = onnx_backend.prepare(case.model, backend=backend, tuning="none")
            for inputs, outputs in case.data_sets:
                got = rep.run([_array(x) for x in inputs])
                if len(got) != len(outputs):
                    return Outcome(case.name, op, "wrong",
                                   f"{len(got)} outputs, expected {len(outputs)}")
                for k, (g, w) in enumerate(zip(got, outputs)):
                    diff = _compare(np.asarray(g), _array(w), case.rtol, case.atol)
                    if diff:
                        return Outcome(case.name, op, "wrong", f"output {k}: {diff}")
    except ArgumentError as exc:  # the inputs ONNX's case feeds are ones the backend refuses
        return Outcome(case.name, op, "crash", f"{type(exc).__name__}: {exc}")
    except KernelgenError as exc:
        return Outcome(case.name, op, "refused", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - any other exception is a finding
        return Outcome(case.name, op, "crash", f"{type(exc).__name__}: {exc}")
    return Outcome(case.name, op, "pass")


def table(outcomes: list[Outcome]) -> str:
    """One line per op type: passed, refused, failed (wrong or crash)."""
    per_op: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        per_op[o.op][o.status] += 1
    lines = [f"{'op':<22}{'pass':>6}{'refused':>9}{'failed':>8}"]
    for op, n in sorted(per_op.items()):
        lines.append(f"{op:<22}{n['pass']:>6}{n['refused']:>9}{n['wrong'] + n['crash']:>8}")
    total = Counter(o.status for o in outcomes)
    lines.append(f"{'all ' + str(len(per_op)) + ' op types':<22}{total['pass']:>6}"
                 f"{total['refused']:>9}{total['wrong'] + total['crash']:>8}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="opencl")
    ap.add_argument("--json", help="write every case's outcome here")
    args = ap.parse_args(argv)
    outcomes = [run_case(c, args.backend) for c in claimed_cases()]
    print(table(outcomes))
    for o in outcomes:
        if o.status != "pass":
            print(f"{o.status:>8} {o.case}: {o.detail[:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
    return 1 if any(o.status in ("wrong", "crash") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
