"""Retriever registry: importing this package registers every retriever."""

from .base import RETRIEVERS, NoRetriever, Retriever

__all__ = ["RETRIEVERS", "NoRetriever", "Retriever"]
