"""The fusion planners, selectable by name (``PLANNERS``), one signature for all of them
(``blocks.Planner``: a graph in, its fusion blocks out):

- ``none``: one block per operator, the unfused baseline (``blocks.plan_none``);
- ``tvm``: TVM's fixed-pattern fusion by operator kind (``tvm_fusion``);
- ``dnnfusion``: DNNFusion's seed-and-grow over the mapping-type table (``dnnfusion``).

    blocks = planner("dnnfusion")(graph)
    blocks = planner("dnnfusion", backend="opencl", tuning="measure")(graph)  # yellow cells
"""
from __future__ import annotations

import functools

from ..api import Tuning, tuning_policy
from ..backends import Backend
from ..errors import AttributeError_
from ..measure_fusion import fusion_verdict
from .blocks import Block, Planner, check_plan, plan_none
from .dnnfusion import plan_dnnfusion
from .tvm_fusion import plan_tvm

PLANNERS: dict[str, Planner] = {"none": plan_none, "tvm": plan_tvm, "dnnfusion": plan_dnnfusion}


def planner(name: str | Planner, backend: str | Backend | None = None,
            tuning: Tuning = "stored") -> Planner:
    """The planner ``name`` names (a callable is returned as it is). With a ``backend``,
    DNNFusion's yellow cells are decided by ``tuning``'s verdicts for it: 'stored' (the
    default) fuses a cell where a stored measurement says fused won, 'measure' measures what
    is missing; without one, or with 'none', yellow cells stay unfused."""
    if callable(name):
        return name
    if name not in PLANNERS:
        raise AttributeError_("compile_model", "fusion", f"a planner name, one of "
                              f"{sorted(PLANNERS)}", name)
    if PLANNERS[name] is plan_dnnfusion and backend is not None:
        policy = tuning_policy(tuning)
        return functools.partial(plan_dnnfusion,
                                 decide=lambda block: fusion_verdict(block, backend, policy))
    return PLANNERS[name]


__all__ = ["PLANNERS", "Block", "Planner", "check_plan", "plan_dnnfusion", "plan_none",
           "plan_tvm", "planner"]
