"""3DCS (ICLR 2026): conformational sensitivity (geometry, chirality, energy) of molecular representations."""
from .data import QM9Conformers
from .module import ConformerEncoder
from .representations import ChiralHistogram, DistanceHistogram, MorganFingerprint

__all__ = ["ChiralHistogram", "ConformerEncoder", "DistanceHistogram", "MorganFingerprint", "QM9Conformers"]
