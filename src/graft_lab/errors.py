"""Errors that end a run with a message a user can act on (run.py prints them without a traceback)."""


class GraftLabError(Exception):
    """Base class: the message says what went wrong and what to do."""


class ConfigError(GraftLabError, ValueError):
    """A config value is unknown or out of range; raised before any model loads."""


class ModelLoadError(GraftLabError):
    """Weights could not be found or reached."""


class DrafterMismatchError(GraftLabError):
    """The drafter was trained for another target (hidden size or vocabulary differ)."""


class ContextLimitError(GraftLabError):
    """A prompt does not fit the target's context."""


class OutputError(GraftLabError):
    """A run's files or the results table cannot be read or written."""


class DecodingError(GraftLabError):
    """Decoding met something that would make the output wrong (a token id outside the vocabulary); raised
    instead of emitting it."""


class NonFiniteLogitsError(DecodingError):
    """NaN or inf in the target's or the drafter's logits: greedy argmax would silently pick the NaN."""
