"""StageRoute: online stage-wise deployment and per-query routing of models under budget and capacity limits (abstract 6)."""
from .data import RoutingData
from .module import StageRoute

__all__ = ["RoutingData", "StageRoute"]
