"""ReIMTS (ICLR 2026): recursive multi-scale representations for irregular multivariate time series forecasting."""
from .data import PhysioNet2012
from .module import IMTSForecaster

__all__ = ["IMTSForecaster", "PhysioNet2012"]
