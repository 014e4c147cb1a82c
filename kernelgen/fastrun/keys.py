"""What a stored result is keyed on, and lookups of stored results: a kernel's structural
fingerprint, the backend, its device and toolchain, the templates' digest and kernelgen's
version. Measuring is above the compile driver (``kernelgen.tune``); reading is here, below it,
so the driver can use stored results without importing the tuner."""
from __future__ import annotations

from typing import Any

from .. import backends
from ..backends import Backend, Config
from ..fusion import FusedBlock, FusionVerdict
from ..ir.fingerprint import fingerprint
from ..ir.loop import LoopKernel
from ..lower import lower
from ..mapping_types import Colour
from ..version import __version__
from .database import FastRunDB

# Bumped when what a stored value means changes (1: the emit options before the unified
# schedule vocabulary), so older entries are never read as current ones.
KEY_SCHEMA = 2
# The same for fusion verdicts (2: they carry the fused kernel's producer redundancy, which
# AGO's intensive fusion in the planner reads; an older one would read as 1).
VERDICT_SCHEMA = 2


def tuning_key(loop: LoopKernel, backend: str | Backend) -> dict[str, Any]:
    """The database key of ``loop``'s tile configuration on ``backend``."""
    be = backends.get(backend)
    return {"kind": "tile-config", "schema": KEY_SCHEMA, "kernel": fingerprint(loop),
            "backend": be.name, "device": be.device_identity(), "layout": "row-major",
            "kernelgen": __version__, "templates": be.template_digest()}


def algorithm_key(block: FusedBlock, backend: str | Backend) -> dict[str, Any]:
    """The database key of ``block``'s convolution algorithm on ``backend``."""
    return {**tuning_key(lower(block), backend), "kind": "conv-algorithm"}


def fusion_key(block: FusedBlock, backend: str | Backend) -> dict[str, Any]:
    """The database key of the measured choice between ``block``'s one kernel and its split
    alternative on ``backend``: the fused kernel's fingerprint and the edges the split cuts
    (each as producer and consumer kind and shape; names differ from model to model), since
    another cut of the same kernel is another question. Cheap: the pieces are not built."""
    ops = {op.name: op for op in block.ops}
    cut = [[f"{ops[e.producer].kind}{list(ops[e.producer].shape)}",
            f"{ops[e.consumer].kind}{list(ops[e.consumer].shape)}"]
           for e in block.edges if e.rule.colour is not Colour.GREEN]
    return {**tuning_key(lower(block), backend), "kind": "fusion-decision", "cut": cut,
            "verdict": VERDICT_SCHEMA}


def stored_verdict(block: FusedBlock, backend: str | Backend, db: FastRunDB | None = None
                   ) -> FusionVerdict | None:
    """The stored measurement of ``block`` fused against split on ``backend``, if any."""
    hit = (db if db is not None else FastRunDB()).get(fusion_key(block, backend))
    return FusionVerdict.from_value(hit["value"]) if hit is not None else None


def stored_options(loop: LoopKernel, backend: str | Backend, db: FastRunDB | None = None
                   ) -> dict[str, Any]:
    """The emit options measured for this kernel, shape and device; {} when none were stored
    or the kernel has nothing to tune."""
    hit = (db if db is not None else FastRunDB()).get(tuning_key(loop, backend))
    # the search space only when something is stored: building it costs seconds for a
    # Winograd stage, the lookup microseconds
    if hit is None or len(backends.get(backend).search_space(loop)) < 2:
        return {}
    config = stored_config(hit)
    return config.as_options() if config is not None else {}


def stored_algorithm(block: FusedBlock, backend: str | Backend, db: FastRunDB | None = None
                     ) -> str | None:
    """The convolution algorithm measured fastest for this block and device, if any."""
    hit = (db if db is not None else FastRunDB()).get(algorithm_key(block, backend))
    config = stored_config(hit)
    algorithm = config.as_options().get("algorithm") if config is not None else None
    return algorithm if isinstance(algorithm, str) else None


def stored_config(hit: dict[str, Any] | None) -> Config | None:
    """A database hit's value as a ``Config``; None for a miss or a value that is not a mapping
    of option names (a damaged row reads as missing). Whether the options suit the kernel is the
    backend's ``choose`` to say (``compile.tuning``)."""
    value = hit["value"] if hit is not None else None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return None
    return Config.of(**value)


def config_from_metadata(metadata: dict[str, Any]) -> Config:
    """The configuration a kernel was generated with, read back from its metadata."""
    tunables = metadata.get("tunables", {})
    return Config.of(**{k: v for k, v in tunables.items() if k != "index_type"})
