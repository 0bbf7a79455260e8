"""Weight-normalised Riemannian GD for overparameterised matrix sensing (abstract 8)."""
from .data import SensingData
from .module import MatrixSensing

__all__ = ["MatrixSensing", "SensingData"]
