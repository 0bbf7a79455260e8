"""lit-iclr: ICLR 2026 methods as trainable Lightning modules, selected from YAML by one CLI."""
__version__ = "0.1.0"
