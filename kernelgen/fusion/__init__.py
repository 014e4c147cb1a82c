"""Fusing operators into one block by composing their index maps, under DNNFusion's table."""
from .fuse import EdgeRule, FusedBlock, FusedOutput, fuse

__all__ = ["EdgeRule", "FusedBlock", "FusedOutput", "fuse"]
