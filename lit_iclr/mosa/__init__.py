"""MoSA (ICLR 2026): text-to-human-video through a 3-D structure, then appearance, with Human-Aware Dynamic Control,
a dense-tracking loss and a contact constraint."""
from .data import HumanMotionVideo
from .module import MoSA

__all__ = ["HumanMotionVideo", "MoSA"]
