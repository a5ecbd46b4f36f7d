"""Dataset registry: importing this package registers every dataset."""

from . import hub, humaneval, long_context, sharegpt, sources  # noqa: F401  (registration)
from .base import DATASETS, Question

__all__ = ["DATASETS", "Question"]
