"""Drafter registry: importing this package registers every drafter."""

from . import eagle3, none  # noqa: F401  (registration)
from .base import DRAFTERS, DraftInput, Drafter

__all__ = ["DRAFTERS", "DraftInput", "Drafter"]
