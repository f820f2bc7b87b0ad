"""`Record`: the one conversion between a JSON object and a dataclass, used by every typed result
(`hf_msv.evaluation.results` for `evaluate_study`, `hf_msv.reproduction.results` for `hf-msv reproduce`).

A record's fields are named as its JSON keys (``coded(key=...)`` where a key is not a Python name); a field's
``codec`` reads its JSON value into its type and writes it back (`record`, `mapping_of`, `list_of`); one ``rest``
field may take every key no other field models (a per-method mapping beside a few named keys). Keys no field
models are kept as they came (``extra``) and ``present`` keeps the keys read, in their order, so

    Cls.from_json(data).to_json() == data      # keys in the same order, for every object a writer produced

and a renamed key fails where a result is read, in one place. A record built in code (``present`` None) writes its
fields in declaration order, leaving out those still `MISSING` (and None ones where ``WRITE_NONE`` is False).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, Self

__all__ = ["MISSING", "Codec", "Record", "coded", "list_of", "mapping_of", "record", "rest"]


class _Missing:
    """Marks a key that was absent (distinct from a JSON null, which is kept as None)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()

# How a value is read from JSON and written back: (read, write). None, a JSON null, is passed through as None.
Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]


def _apply(function: Callable[[Any], Any], value):
    return None if value is None else function(value)


def record(cls: type[Record]) -> Codec:
    """The codec of one `Record` of class `cls`."""
    return cls.from_json, lambda value: value.to_json()


def mapping_of(codec: Codec) -> Codec:
    """The codec of a ``{key: value}`` mapping whose values use `codec`."""
    read, write = codec
    return (
        lambda data: {key: _apply(read, value) for key, value in data.items()},
        lambda values: {key: _apply(write, value) for key, value in values.items()},
    )


def list_of(codec: Codec) -> Codec:
    """The codec of a list whose items use `codec`."""
    read, write = codec
    return (lambda data: [_apply(read, item) for item in data], lambda items: [_apply(write, item) for item in items])


def coded(codec: Codec | None = None, *, default: Any = None, default_factory: Any = None, key: str | None = None):
    """A record field: its JSON value goes through `codec` (as is without one), under `key` (default: its name).

    Args:
        codec: how the value is read and written.
        default: the value when the key is absent (see `MISSING`).
        default_factory: builds the default instead (a fresh ``{}`` or ``[]``).
        key: the JSON key, where it is not a Python name (``"lambda"``).

    Returns:
        The dataclass field.
    """
    metadata = {"codec": codec, "key": key}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def rest(codec: Codec | None = None, accepts: Callable[[Any], bool] | None = None):
    """The record field that takes every key no other field models, ``{key: value}`` through `codec`; `accepts`
    picks the values it takes (the others stay in ``extra``). Built in code, its entries are written where it is
    declared."""
    return field(default_factory=dict, metadata={"codec": codec, "rest": True, "accepts": accepts})


@cache
def _layout(cls: type) -> tuple[tuple[str, dataclasses.Field], ...]:
    """(JSON key, field) of every modelled field of `cls`, in declaration order; the rest field's key is ``""``."""
    out = []
    for item in dataclasses.fields(cls):
        if item.name in ("present", "extra"):
            continue
        out.append(("" if item.metadata.get("rest") else item.metadata.get("key") or item.name, item))
    return tuple(out)


def _read(item: dataclasses.Field, value):
    codec = item.metadata.get("codec")
    return value if codec is None else _apply(codec[0], value)


def _write(item: dataclasses.Field, value):
    codec = item.metadata.get("codec")
    return value if codec is None else _apply(codec[1], value)


def _default(item: dataclasses.Field):
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None if item.default is dataclasses.MISSING else item.default


@dataclass
class Record:
    """A JSON object read into a dataclass (see the module's docstring).

    Attributes:
        present: the keys read, in their order (None for a record built in code).
        extra: keys no field models, kept as read.
    """

    present: tuple[str, ...] | None = field(default=None, kw_only=True, repr=False, compare=False)
    extra: dict = field(default_factory=dict, kw_only=True, repr=False)

    # Whether a record built in code writes its None fields as JSON null (False: leaves them out).
    WRITE_NONE: ClassVar[bool] = True

    @classmethod
    def from_json(cls, data: Mapping) -> Self:
        """Read the record.

        Args:
            data: the JSON object.

        Returns:
            The record, of the class it is called on.
        """
        keyed = {key: item for key, item in _layout(cls) if key}
        spill = next((item for key, item in _layout(cls) if not key), None)
        accepts = None if spill is None else spill.metadata.get("accepts")
        values: dict[str, Any] = {}
        spilled, extra = {}, {}
        for key, value in data.items():
            if key in keyed:
                values[keyed[key].name] = _read(keyed[key], value)
            elif spill is not None and (accepts is None or accepts(value)):
                spilled[key] = _read(spill, value)
            else:
                extra[key] = value
        if spill is not None:
            values[spill.name] = spilled
        return cls(**values, present=tuple(data), extra=extra)

    @classmethod
    def from_dict(cls, data: Mapping) -> Self:
        """`from_json` (the name the evaluation's readers use)."""
        return cls.from_json(data)

    def to_json(self) -> dict:
        """The record as written to JSON.

        Returns:
            The dict: read, the keys it was read with in their order, then any set since; built in code, its set
            fields in declaration order; then the ``extra`` keys.
        """
        written: dict[str, Any] = {}
        for key, item in _layout(type(self)):
            value = getattr(self, item.name)
            if not key:
                written |= {name: _write(item, one) for name, one in value.items()}
            elif self._writes(key, item, value):
                written[key] = _write(item, value)
        written |= {key: value for key, value in self.extra.items() if key not in written}
        if self.present is None:
            return written
        first = {key: written[key] for key in self.present if key in written}
        return first | written

    def to_dict(self) -> dict:
        """`to_json` (the name the evaluation's readers use)."""
        return self.to_json()

    def _writes(self, key: str, item: dataclasses.Field, value) -> bool:
        if value is MISSING:
            return False
        if self.present is None:
            return value is not None or self.WRITE_NONE
        # A key the JSON lacked is written only once set since (a value other than its default).
        return key in self.present or (value is not None and value != _default(item))

    def has(self, key: str) -> bool:
        """Whether the JSON has `key` (read), or would have it (built in code, or set since).

        Args:
            key: a JSON key.

        Returns:
            True or False.
        """
        if key in self.extra:
            return True
        item = next((item for name, item in _layout(type(self)) if name == key), None)
        return item is not None and self._writes(key, item, getattr(self, item.name))
