"""Dataset registry: importing this package registers every dataset."""

from . import hub, humaneval, long_context, sharegpt, sources  # noqa: F401  (registration)
from .base import DATASETS, Question, content_hash, load_questions, source_of

__all__ = ["DATASETS", "Question", "content_hash", "load_questions", "source_of"]
