"""From Predictors to Samplers via the Training Trajectory (ICLR 2026): annealed MCMC across a predictor's checkpoints."""
from .data import BooleanLandscapeData, FashionMNISTCounterfactualData, PointLandscapeData, SequenceAffinityData
from .module import ImageClassifier, LandscapePredictor, TrajectorySampler

__all__ = ["BooleanLandscapeData", "FashionMNISTCounterfactualData", "ImageClassifier", "LandscapePredictor",
           "PointLandscapeData", "SequenceAffinityData", "TrajectorySampler"]
