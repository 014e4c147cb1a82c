"""The differential fuzzer's long run: random fused blocks on every backend against ONNX's
reference (see ``judge.py`` for how values are judged), with Hypothesis shrinking each new
failure to a minimal reproducer.

    cd kernelgen   # the repository root
    .venv/bin/python tests/fuzz/run.py --cases 10000 --seed 1 \\
        --backends interp,opencl,neon,triton --json fuzz-10000.json

prints a summary (cases run, per-backend failures grouped by signature, each signature's first
shrunk reproducer as a Python snippet) and writes it as JSON. Every case runs on every named
backend; Triton (its interpreter is slow) only runs blocks of at most ``--triton-flops``
operations. Cost on the 2-core machine: about 0.1 s a case on interp and OpenCL, ~1 s on NEON
(a C build through SIMDe per kernel), ~0.5 s on Triton. A failure whose signature (backend,
kind, operator) was already shrunk is only counted, so one bug does not stop the run.
The CI slice is ``pytest tests/fuzz`` (a few hundred fixed-seed cases); the marker
``fuzz_long`` test runs this driver under pytest when KERNELGEN_FUZZ_CASES is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

from generate import blocks  # noqa: E402
from hypothesis import HealthCheck, Phase, given, reject, settings  # noqa: E402
from hypothesis import seed as hseed  # noqa: E402
from judge import Case, Problem, Unjudgeable, check, prepare  # noqa: E402
from repro import reproducer  # noqa: E402

TRITON_FLOPS = 20_000
# failures known and open: (kind, operator kinds) -> issue or defect id; they are counted and
# labelled, not shrunk again. Empty: every failure is news.
KNOWN: dict[tuple[str, frozenset[str]], str] = {}


def known(block_fns: set[str], problem: Problem) -> str | None:
    for (kind, fns), defect in KNOWN.items():
        if problem.kind == kind and block_fns & fns:
            return defect
    return None


@dataclass
class Summary:
    cases: int = 0
    rejected: int = 0
    seconds: float = 0.0
    runs: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)  # per backend
    signatures: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self, sig: str, case: Case, backend: str, problem: Problem) -> None:
        entry = self.signatures.setdefault(sig, {"count": 1})
        entry["backend"] = backend
        entry["known"] = known({n.fn for n in case.block.nodes}, problem)
        entry["problem"] = problem.text
        entry["reproducer"] = reproducer(case, backend, problem.text)


class _Found(Exception):
    pass


def _body(summary: Summary, state: dict[str, Any], backends: list[str], triton_flops: int,
          log: Any) -> Any:
    """The Hypothesis test of one chunk: it raises on the first failure of a new signature, then
    (while Hypothesis shrinks) only on that signature, recording the latest (smallest) case."""
    def body(block: Any) -> None:
        generating = state["target"] is None
        try:
            case = prepare(block)
        except Unjudgeable:
            summary.rejected += generating
            reject()
        if generating:
            summary.cases += 1
            if summary.cases % 100 == 0:
                log(f"{summary.cases} cases, {time.time() - state['start']:.0f} s, "
                    f"failures {dict(summary.failures)}")
        for b in backends:
            if b == "triton" and case.flops() > triton_flops:
                summary.skipped[b] += generating
                continue
            summary.runs[b] += generating
            problem = check(case, b)
            if problem is None:
                continue
            sig = f"{b}|{problem.kind}|{known({n.fn for n in case.block.nodes}, problem) or 'new'}"
            if not generating:
                if sig == state["target"]:
                    state["last"] = (case, b, problem)
                    raise _Found(sig)
                continue
            summary.failures[b] += 1
            if sig in summary.signatures:
                summary.signatures[sig]["count"] += 1
                continue
            summary.signatures[sig] = {"count": 1}
            state["target"], state["last"] = sig, (case, b, problem)
            raise _Found(sig)
    return body


def fuzz(cases: int, seed: int, backends: list[str], max_numel: int = 600,
         triton_flops: int = TRITON_FLOPS, log: Any = print) -> Summary:
    """Run ``cases`` drawn blocks; each new failure signature is shrunk once."""
    summary, start, chunk = Summary(), time.time(), seed
    while summary.cases < cases:
        state: dict[str, Any] = {"target": None, "start": start}
        test = hseed(chunk)(settings(
            max_examples=cases - summary.cases, database=None, deadline=None,
            suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])(
            given(blocks(max_numel))(_body(summary, state, backends, triton_flops, log))))
        try:
            test()
        except Exception:  # noqa: BLE001 - _Found, or Hypothesis's Flaky around it
            if state["target"] is None:
                raise
            sig = state["target"]
            summary.record(sig, *state["last"])
            log(f"shrunk {sig}:\n{summary.signatures[sig]['reproducer']}\n")
        chunk += 1
    summary.seconds = time.time() - start
    return summary


def as_json(summary: Summary) -> dict[str, Any]:
    sigs = {s: {k: v for k, v in e.items() if not k.startswith("_")}
            for s, e in summary.signatures.items()}
    return {"cases": summary.cases, "rejected": summary.rejected,
            "seconds": round(summary.seconds, 1), "runs": dict(summary.runs),
            "skipped": dict(summary.skipped), "failures": dict(summary.failures),
            "signatures": sigs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backends", default="interp,opencl,neon,triton")
    ap.add_argument("--max-numel", type=int, default=600)
    ap.add_argument("--triton-flops", type=int, default=TRITON_FLOPS)
    ap.add_argument("--json", default="fuzz-summary.json")
    args = ap.parse_args(argv)
    summary = fuzz(args.cases, args.seed, args.backends.split(","), args.max_numel,
                   args.triton_flops)
    data = as_json(summary)
    print(f"\n{data['cases']} cases in {data['seconds']} s ({data['rejected']} rejected by "
          f"the reference); runs {data['runs']}; skipped {data['skipped']}")
    print(f"failures per backend: {data['failures'] or 'none'}")
    for sig, entry in data["signatures"].items():
        print(f"\n== {sig}: {entry['count']} cases, known: {entry['known']}\n"
              f"{entry['reproducer']}")
    Path(args.json).write_text(json.dumps(data, indent=1))
    print(f"\nwritten {args.json}")
    return 1 if any(e["known"] is None for e in data["signatures"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
