"""AIRE-Prune (ICLR 2026): post-training state pruning of deep diagonal SSMs (S5, S4D) by impulse-response energy."""
from .data import ListOpsData, SequentialImageData
from .module import AIREPruneClassifier

__all__ = ["AIREPruneClassifier", "ListOpsData", "SequentialImageData"]
