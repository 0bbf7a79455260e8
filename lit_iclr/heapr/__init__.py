"""HEAPr (ICLR 2026): Hessian-based efficient atomic expert pruning in output space, for Hugging Face MoE LMs."""
from lit_iclr.core.corpus import CorpusDataModule

from .module import HEAPrLM

__all__ = ["CorpusDataModule", "HEAPrLM"]
