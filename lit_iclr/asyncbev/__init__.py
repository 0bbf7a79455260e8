"""AsyncBEV (ICLR 2026): cross-modal BEV flow alignment for asynchronous LiDAR-camera 3D detection on nuScenes."""
from .data import NuScenesAsync
from .module import AsyncBEV

__all__ = ["AsyncBEV", "NuScenesAsync"]
