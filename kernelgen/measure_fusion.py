"""Yellow cells decided by measurement. DNNFusion's Table 3 marks some producer -> consumer
pairs yellow: fusing them removes a round trip through memory but may cost locality (a
Transpose read across a reduction) or recomputation (a reduced value fed to many outputs), and
which wins depends on the shapes and the machine. ``measure_fusion`` times the fused kernel
against its split alternative (the block cut at its non-green edges, ``fusion.split_parts``)
round-robin in one run (a win is ``clear`` when the winner's 80th percentile is below the
loser's 20th; a close call is timed for ``CLOSE_CALL_ROUNDS`` times as many rounds more before
it is decided), checks both against the loop-IR interpreter, and stores the verdict in
the Fast-Run database under the fused kernel's fingerprint, the cut, the backend and the
device, with how often the fused kernel computes each element of a producer inside its tiles
(AGO's ``producer_redundancy``, which the planner's intensive fusion reads).
``fuse(..., measure=True)``, ``emit(tuning='measure')`` and the DNNFusion planner under
``tuning='measure'`` call it; the 'stored' policy reads what it stored.
"""
from __future__ import annotations

import numpy as np

from . import backends
from .backends import Backend
from .compile import STORED, TuningPolicy, compile_fused, compile_split
from .errors import FusionError
from .fastrun import FastRunDB, fusion_key, stored_verdict
from .fusion import FusedBlock, FusionVerdict
from .ir.interp import interpret
from .ir.node import Constant
from .lower import lower
from .mapping_types import Colour
from .measure import round_robin, runner
from .reference_check import matches, random_input

# A close call (neither variant's 80th percentile below the other's 20th) is timed for this
# many times ``repeat`` rounds more, on the same bound launches, and decided on all of them:
# 15 rounds of a pair within ~1.2x flipped their verdict from run to run (the BERT layer's
# intensive pairs on PoCL, docs/benchmarks.md).
CLOSE_CALL_ROUNDS = 3


def measure_fusion(block: FusedBlock, backend: str | Backend = backends.DEFAULT, *,
                   db: FastRunDB | None = None, use_cache: bool = True, repeat: int = 15,
                   tuning: TuningPolicy = STORED) -> FusionVerdict:
    """Whether ``block`` runs faster as one kernel or split at its yellow (and forced red)
    edges, on ``backend``: the stored verdict when there is one (``use_cache``), else measured
    now and stored. Both variants are built with ``tuning``'s tunables and must match the
    interpreter's output first. A block with only green edges has nothing to measure
    (``FusionError``), nor has one with several outputs (its split would be one program per
    output)."""
    be = backends.get(backend)
    cut = [str(e) for e in block.edges if e.rule.colour is not Colour.GREEN]
    if not cut:
        raise FusionError(f"block '{block.name}' has only green edges: fusing it always pays, "
                          "there is nothing to measure")
    db = db if db is not None else FastRunDB()
    if use_cache and (hit := stored_verdict(block, be, db)) is not None:
        return hit
    split = compile_split(block, be, tuning=tuning)
    if split is None:
        raise FusionError(f"block '{block.name}' has {len(block.outputs)} outputs; measuring "
                          "its split alternative needs one (a program returns one output)")
    fused = compile_fused(block, be, tuning=tuning)
    rng = np.random.default_rng(0)
    inputs = [np.asarray(v.value) if isinstance(v, Constant) else random_input(rng, v)
              for v in block.inputs]
    want = interpret(lower(block), *inputs)
    for name, variant in (("fused", fused), ("split", split)):
        got = variant(*inputs)
        if not matches(got if isinstance(got, tuple) else (got,), want):
            raise FusionError(f"block '{block.name}' on {be.name}: the {name} variant does not "
                              "match the interpreter, so its time decides nothing")
    runs = {name: runner(variant, *inputs)  # type: ignore[arg-type]  # a Kernel or Program
            for name, variant in (("fused", fused), ("split", split))}
    times = round_robin(runs, repeat=repeat)
    if not _clear(times):
        more = round_robin(runs, warmup=1, repeat=CLOSE_CALL_ROUNDS * repeat)
        times = {name: times[name] + more[name] for name in times}
    ms = {name: float(np.median(t)) for name, t in times.items()}
    # the pieces compile_split fused (fusing them again would redo their index algebra)
    parts = tuple(tuple(names) for names in split.metadata["parts"])
    verdict = FusionVerdict(be.name, ms["fused"] <= ms["split"], ms["fused"], ms["split"],
                            parts, tuple(cut), clear=_clear(times),
                            redundancy=float(fused.metadata.get("producer_redundancy", 1.0)))
    db.put(fusion_key(block, be), verdict.as_value(),
           min(verdict.fused_ms, verdict.split_ms))
    return verdict


def _clear(times: dict[str, list[float]]) -> bool:
    """Whether the faster variant by median runs clearly faster: its 80th percentile below
    the slower one's 20th."""
    fast, slow = sorted(times.values(), key=lambda t: float(np.median(t)))
    return bool(np.percentile(fast, 80) < np.percentile(slow, 20))


def fusion_verdict(block: FusedBlock, backend: str | Backend,
                   tuning: TuningPolicy) -> FusionVerdict | None:
    """What ``tuning`` says of ``block`` fused against split (None: nothing measured), for
    planners that ask before they fuse (a yellow cell; a red one AGO's intensive fusion
    relaxes): a block ``measure_fusion`` cannot measure is None."""
    if not (block.needs_measurement or block.forced) or len(block.outputs) != 1:
        return None
    return tuning.fusion(block, backends.get(backend))


__all__ = ["fusion_verdict", "measure_fusion"]
