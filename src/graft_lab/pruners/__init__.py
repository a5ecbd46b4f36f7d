"""Pruner registry: importing this package registers every pruner."""

from .base import PRUNERS, NoPruner, Pruner

__all__ = ["PRUNERS", "NoPruner", "Pruner"]
