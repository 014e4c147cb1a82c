"""Fusing operators into one block by composing their index maps, under DNNFusion's table."""
from .fuse import EdgeRule, FusedBlock, FusedOutput, fuse
from .split import split_parts
from .verdict import FusionVerdict

__all__ = ["EdgeRule", "FusedBlock", "FusedOutput", "FusionVerdict", "fuse", "split_parts"]
