"""NAMEx: Nash Merging of Experts (expert merging in SMoE with Nash bargaining and complex momentum), with the
baselines it is compared to (dense, top-k SMoE, SMEAR, CAMEx, EP-CAMEx) as options of one FFN layer family."""
from .data import CorpusTopicData, FashionMNISTData
from .ffn import MergeOptions, MergingFFN
from .module import NAMExHFCausalLM, NAMExImageClassifier, NAMExLanguageModel, NAMExTopicClassifier

__all__ = ["CorpusTopicData", "FashionMNISTData", "MergeOptions", "MergingFFN", "NAMExImageClassifier",
           "NAMExHFCausalLM", "NAMExLanguageModel", "NAMExTopicClassifier"]
