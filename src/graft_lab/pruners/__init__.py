"""Pruner registry: importing this package registers every pruner."""

from . import cost, dyn_depth  # noqa: F401  (registration)
from .base import PRUNERS, NoPruner, Pruner

__all__ = ["PRUNERS", "NoPruner", "Pruner"]
