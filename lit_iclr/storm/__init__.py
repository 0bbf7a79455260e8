"""STORM: synergistic cross-scale spatio-temporal weather forecasting (ICLR 2026), on ERA5 in WeatherBench 2 layout."""
from .data import WB2WeatherData
from .module import STORM

__all__ = ["STORM", "WB2WeatherData"]
