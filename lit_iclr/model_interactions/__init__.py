"""Generative models retrained recursively on each other's outputs: linear-Gaussian theory and K interacting LMs."""
from .data import InteractionData
from .module import InteractionLM

__all__ = ["InteractionData", "InteractionLM"]
