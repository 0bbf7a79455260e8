"""SOOPER: Safe Exploration via Policy Priors (Wendl, As, Prajapat, Pollak, Coros, Krause; ICLR 2026)."""
from .data import SafeOfflineData
from .module import SOOPER

__all__ = ["SOOPER", "SafeOfflineData"]
