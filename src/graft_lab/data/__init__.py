"""Dataset registry: importing this package registers every dataset."""

from . import sources  # noqa: F401  (registration)
from .base import DATASETS, Question

__all__ = ["DATASETS", "Question"]
