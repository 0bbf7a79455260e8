"""Platform pieces every method may use. Never imports a method."""
from .data import BaseDataModule, atomic_dir, ensure_generated
from .errors import CheckpointError, ConfigError, DatasetFormatError, DatasetNotFoundError, LitIclrError
from .module import BaseModule

__all__ = [
    "BaseDataModule", "BaseModule", "CheckpointError", "ConfigError", "DatasetFormatError", "DatasetNotFoundError",
    "LitIclrError", "atomic_dir", "ensure_generated",
]
