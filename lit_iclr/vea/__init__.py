"""Seeing but Not Believing (ICLR 2026): attention-evidence analysis of VLMs and training-free Visual Evidence Augmentation."""
from .data import EvidenceVQA
from .module import VEAModule

__all__ = ["EvidenceVQA", "VEAModule"]
