"""VGF: Reinforcement Learning via Value Gradient Flow (Xu, Hu, Sojoudi, Zhang; ICLR 2026)."""
from .baselines import FQL, IQL, TD3BC
from .data import D4RLData, OGBenchData
from .module import VGF

__all__ = ["VGF", "TD3BC", "FQL", "IQL", "OGBenchData", "D4RLData"]
