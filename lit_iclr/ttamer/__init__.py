"""T-Tamer: recall-based exit policies for early-exit and cascade serving (abstract 11)."""
from .data import ExitTableData
from .module import ExitPolicies

__all__ = ["ExitPolicies", "ExitTableData"]
