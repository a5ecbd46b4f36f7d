"""A decorator registry per concept (drafters, pruners, retrievers, datasets, ...).

Each entry pairs a factory with the dataclass that holds its options, so a config node is validated
(unknown keys, ranges) by the entry it names before anything heavy is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError

T = TypeVar("T")


@dataclasses.dataclass
class Entry(Generic[T]):
    factory: Callable[..., T]
    options: type | None  # dataclass of the entry's options, or None when it takes none


class Registry(Generic[T]):
    def __init__(self, concept: str):
        self.concept = concept
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, options: type | None = None):
        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise ValueError(f"{self.concept} '{name}' is registered twice")
            self._entries[name] = Entry(factory, options)
            return factory

        return deco

    @property
    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> Entry[T]:
        if name not in self._entries:
            raise ConfigError(f"unknown {self.concept} '{name}'; valid names: {', '.join(self.names)}")
        return self._entries[name]

    def options(self, node: Mapping[str, Any] | DictConfig) -> Any:
        """Validate a config node `{name: ..., **options}` into the entry's options dataclass."""
        data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        name = data.pop("name", None)
        if name is None:
            raise ConfigError(f"{self.concept} config needs a 'name'; valid names: {', '.join(self.names)}")
        entry = self.entry(name)
        if entry.options is None:
            if data:
                raise ConfigError(f"{self.concept} '{name}' takes no options, got: {', '.join(sorted(data))}")
            return None
        fields = {f.name for f in dataclasses.fields(entry.options)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ConfigError(
                f"unknown key(s) for {self.concept} '{name}': {', '.join(unknown)}; valid keys: {', '.join(sorted(fields))}"
            )
        try:
            merged = OmegaConf.merge(OmegaConf.structured(entry.options), data)
            return OmegaConf.to_object(merged)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{self.concept} '{name}': {exc.msg if hasattr(exc, 'msg') else exc}") from None

    def build(self, node: Mapping[str, Any] | DictConfig, **context: Any) -> T:
        """Validate `node` and call the entry's factory with its options and the runtime context."""
        opts = self.options(node)
        name = node["name"]
        factory = self.entry(name).factory
        return factory(opts, **context) if opts is not None else factory(**context)
