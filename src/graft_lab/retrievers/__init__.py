"""Retriever registry: importing this package registers every retriever."""

from . import ngram, pool, recycle, sam  # noqa: F401  (registration)
from .base import RETRIEVERS, Fragment, NoRetriever, Retriever

__all__ = ["RETRIEVERS", "Fragment", "NoRetriever", "Retriever"]
