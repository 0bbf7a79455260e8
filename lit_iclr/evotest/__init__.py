"""EvoTest (ICLR 2026): evolutionary test-time learning for text-game agents, on the J-TTL protocol."""
from .data import JTTLGames
from .module import EvoTest

__all__ = ["EvoTest", "JTTLGames"]
