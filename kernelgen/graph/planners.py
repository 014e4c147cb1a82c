"""The fusion planners, selectable by name (``PLANNERS``), one signature for all of them
(``blocks.Planner``: a graph in, its fusion blocks out):

- ``none``: one block per operator, the unfused baseline (``blocks.plan_none``);
- ``tvm``: TVM's fixed-pattern fusion by operator kind (``tvm_fusion``);
- ``dnnfusion``: DNNFusion's seed-and-grow over the mapping-type table (``dnnfusion``).

    blocks = planner("dnnfusion")(graph)
"""
from __future__ import annotations

from ..errors import AttributeError_
from .blocks import Block, Planner, check_plan, plan_none
from .dnnfusion import plan_dnnfusion
from .tvm_fusion import plan_tvm

PLANNERS: dict[str, Planner] = {"none": plan_none, "tvm": plan_tvm, "dnnfusion": plan_dnnfusion}


def planner(name: str | Planner) -> Planner:
    """The planner ``name`` names (a callable is returned as it is)."""
    if callable(name):
        return name
    if name not in PLANNERS:
        raise AttributeError_("compile_model", "fusion", f"a planner name, one of "
                              f"{sorted(PLANNERS)}", name)
    return PLANNERS[name]


__all__ = ["PLANNERS", "Block", "Planner", "check_plan", "plan_dnnfusion", "plan_none",
           "plan_tvm", "planner"]
