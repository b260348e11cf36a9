"""A RecordDict's records of one type, read and written in place.

Flower's ``RecordDict.config_records`` (and ``array_records``, ``metric_records``) builds a
new dict of every record of that type, type-checking each, at every access, where reading the
record itself is one dict lookup. The ClientApp's mods and
the secure layer read the state and the message several times a message, so the copies are
a noticeable share of every message's time (in process as in a deployed ClientApp).
:func:`config_records`, :func:`array_records` and :func:`metric_records` give the same mapping without the copy:
reads, writes, ``pop`` and ``in`` go straight to the RecordDict, and a record of another type
under the key is absent, as in Flower's view.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Generic, TypeVar

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

R = TypeVar("R", ArrayRecord, ConfigRecord, MetricRecord)


class Records(MutableMapping, Generic[R]):
    """The records of type ``kind`` in ``records``, a live view (iteration takes a snapshot of the
    keys, so a loop may pop what it visits)."""

    __slots__ = ("_records", "_kind")

    def __init__(self, records: RecordDict, kind: type[R]) -> None:
        self._records = records
        self._kind = kind

    def __getitem__(self, key: str) -> R:
        value = self._records[key]
        if not isinstance(value, self._kind):
            raise KeyError(key)
        return value

    def get(self, key: str, default=None):
        value = self._records.get(key)
        return value if isinstance(value, self._kind) else default

    def __contains__(self, key: object) -> bool:
        return isinstance(self._records.get(key), self._kind)  # type: ignore[arg-type]

    def __setitem__(self, key: str, value: R) -> None:
        if not isinstance(value, self._kind):
            raise TypeError(f"{key!r}: expected a {self._kind.__name__}, got {type(value).__name__}")
        self._records[key] = value

    def __delitem__(self, key: str) -> None:
        self[key]  # a record of another type under the key is not this view's to delete
        del self._records[key]

    def __iter__(self) -> Iterator[str]:
        return iter([key for key, value in self._records.items() if isinstance(value, self._kind)])

    def __len__(self) -> int:
        return sum(1 for value in self._records.values() if isinstance(value, self._kind))


def config_records(records: RecordDict) -> Records[ConfigRecord]:
    """``records.config_records`` without the copy."""
    return Records(records, ConfigRecord)


def array_records(records: RecordDict) -> Records[ArrayRecord]:
    """``records.array_records`` without the copy."""
    return Records(records, ArrayRecord)


def metric_records(records: RecordDict) -> Records[MetricRecord]:
    """``records.metric_records`` without the copy."""
    return Records(records, MetricRecord)
