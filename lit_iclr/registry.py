"""The method packages. Importing them registers their LightningModule/DataModule subclasses with the CLI."""
from __future__ import annotations

import importlib

METHODS = ("storm", "reimts", "aire_prune", "vgf", "heapr", "namex", "asyncbev", "sooper", "cibm", "three_dcs", "evotest",
           "stageroute", "ttamer", "wn_sensing", "trajectory_sampler", "model_interactions", "vea", "mosa", "juli")

# Optional dependency -> the extra that installs it, for a clear message when a method's extra is missing.
EXTRAS = {"gymnasium": "rl", "mujoco": "rl", "ogbench": "rl", "transformers": "llm", "tokenizers": "llm",
          "torch_harmonics": "weather", "pyquaternion": "asyncbev", "av": "mosa", "rdkit": "three_dcs",
          "gguf": "juli"}

unavailable: dict[str, str] = {}


def import_methods() -> None:
    """Import every method package present; remember why one could not be imported instead of failing the CLI."""
    for name in METHODS:
        try:
            importlib.import_module(f"lit_iclr.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"lit_iclr.{name}":
                continue  # not built yet
            extra = EXTRAS.get((e.name or "").split(".")[0])
            hint = f"pip install -e '.[{extra}]'" if extra else f"pip install {e.name}"
            unavailable[name] = f"needs the missing package {e.name!r} ({hint})"
