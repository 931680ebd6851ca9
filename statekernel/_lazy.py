"""``LazyTuple``: an immutable, tuple-like sequence whose items may be built on first use.

A run loaded from a store holds every completed turn, but resuming it needs none of
them: the kernel only counts them and appends the next one. Stores hand the run its
completed turns as ``Deferred`` items, decoded the first time someone reads them
(and kept); everything else (appending, slicing, counting) never decodes anything.
Live runs hold plain items. Either way ``run.turns`` behaves like a tuple: indexing,
slicing, iteration, ``+``, equality with tuples and hashing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

__all__ = ["Deferred", "LazyTuple"]

T = TypeVar("T")


class Deferred(Generic[T]):
    """A value built by ``make()`` the first time ``get`` is called, then kept."""

    __slots__ = ("_make", "_value")

    def __init__(self, make: Callable[[], T]) -> None:
        self._make: Callable[[], T] | None = make
        self._value: T | None = None

    @property
    def built(self) -> bool:
        """True once the value has been built."""
        return self._make is None

    def get(self) -> T:
        """The value (built now if it was not yet); an error of ``make`` propagates."""
        make = self._make
        if make is not None:
            self._value = make()
            self._make = None
        return self._value  # type: ignore[return-value]


class LazyTuple(Sequence[T]):
    """An immutable sequence like a tuple; items given as ``Deferred`` are built when read.

    Equal to a tuple or another ``LazyTuple`` with equal items; ``+`` with either gives
    a ``LazyTuple``; a slice is a ``LazyTuple`` sharing the (deferred) items.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[T | Deferred[T]] = ()) -> None:
        self._items: tuple[Any, ...] = tuple(items)

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> LazyTuple[T]: ...

    def __getitem__(self, index: int | slice) -> T | LazyTuple[T]:
        if isinstance(index, slice):
            return LazyTuple(self._items[index])
        item = self._items[index]
        return item.get() if type(item) is Deferred else item  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[T]:
        for item in self._items:
            yield item.get() if type(item) is Deferred else item

    def __add__(self, other: Iterable[T]) -> LazyTuple[T]:
        extra = other._items if isinstance(other, LazyTuple) else tuple(other)
        return LazyTuple(self._items + extra)

    def __radd__(self, other: tuple[T, ...]) -> LazyTuple[T]:
        if not isinstance(other, tuple):
            return NotImplemented
        return LazyTuple(other + self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyTuple):
            if other._items is self._items:
                return True
        elif not isinstance(other, tuple):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"LazyTuple({tuple(self)!r})"

    def __reduce__(self) -> tuple[type[LazyTuple[T]], tuple[tuple[T, ...]]]:
        """Pickled and deep-copied with every item built (not with what builds them)."""
        return (LazyTuple, (tuple(self),))

    @property
    def deferred(self) -> int:
        """How many items are not built yet."""
        return sum(1 for item in self._items if type(item) is Deferred and not item.built)
