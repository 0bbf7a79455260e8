"""JULI (top-k log-probability steering) as a defensive evaluation: a BiasNet plug-in against a policy-aligned target."""
from .data import PolicyChats
from .module import JULI

__all__ = ["JULI", "PolicyChats"]
