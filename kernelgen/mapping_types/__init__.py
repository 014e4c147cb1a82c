"""DNNFusion's mapping types: index maps in SymPy, their classification, composition and the
fusion table."""
from .classify import classify, folds_to_flat, keeps_runs
from .index import FloorDiv, FloorMod, fresh_reduce_symbol, out_symbol, out_symbols, simplify_index
from .index_map import IndexMap, compose, evaluate
from .table import Colour, FusionRule, fusion_rule, fusion_table, reshape_rule, run_rule
from .types import MappingType, Opaque

__all__ = [
    "Colour", "FloorDiv", "FloorMod", "FusionRule", "IndexMap", "MappingType", "Opaque",
    "classify", "compose", "evaluate", "folds_to_flat", "fresh_reduce_symbol", "fusion_rule",
    "fusion_table", "keeps_runs", "out_symbol", "out_symbols", "reshape_rule", "run_rule",
    "simplify_index",
]
