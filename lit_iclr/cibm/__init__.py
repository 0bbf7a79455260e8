"""IB-CBM (ICLR 2026): concepts' information bottleneck for concept bottleneck models."""
from .data import CUBConcepts, XLSA17Concepts
from .module import CIBM

__all__ = ["CIBM", "CUBConcepts", "XLSA17Concepts"]
