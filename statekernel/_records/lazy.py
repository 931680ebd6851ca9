"""``LazyTuple``: an immutable, tuple-like sequence that shares its items with the
sequences it was made from, and whose items may be built on first use.

Two things make a long run's memory grow faster than its transcript, and this type
answers both:

* **Sharing.** A run's transcript grows by one or two messages a turn, and every
  turn's ``ModelRequest.messages`` is the transcript as it was sent. As tuples, each
  of those is a copy, so a run of n turns holds n²/2 references. A ``LazyTuple`` is a
  *view* of an append-only buffer: a prefix of it (``items[:k]``) is another view of
  the same buffer, and ``items.grow(more)`` appends to the buffer in place when
  ``items`` ends where the buffer ends (the kernel grows a run's transcript and turn
  log this way), so every request of a run and its transcript share one buffer.
  ``items + more`` never touches the buffer: it keeps what it adds in a short tail of
  its own (a hook's ``run.messages + (note,)`` costs the note, not a copy), folded
  into a new buffer once that tail grows long. Nothing a view holds ever changes: a
  buffer is only appended to, past the end of every view of it.
* **Deferred items.** A run loaded from a store holds every completed turn, but
  resuming it needs none of them: the kernel only counts them and appends the next
  one. Stores hand the run its completed turns as ``Deferred`` items, decoded the
  first time someone reads them (and kept); appending, slicing and counting never
  decode anything.

Either way a ``LazyTuple`` behaves like a tuple: indexing, slicing, iteration, ``+``,
equality with tuples and hashing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

__all__ = ["Deferred", "LazyTuple", "as_lazy"]

T = TypeVar("T")

TAIL_MAX = 32
"""A view that has added this many items past the end of its buffer moves to a new one."""

_APPEND = threading.Lock()
"""Appending to a shared buffer is check-then-extend; the lock makes it one step."""


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


def _raw_of(items: Iterable[Any]) -> tuple[Any, ...]:
    return items._raw() if isinstance(items, LazyTuple) else tuple(items)


def _built(item: Any) -> Any:
    return item.get() if type(item) is Deferred else item


class LazyTuple(Sequence[T]):
    """An immutable sequence like a tuple: ``buffer[start:stop] + tail``.

    Equal to a tuple or another ``LazyTuple`` with equal items; ``+`` with either gives
    a ``LazyTuple``; a slice is a ``LazyTuple`` sharing the (deferred) items.
    """

    __slots__ = ("_buf", "_start", "_stop", "_tail")

    def __init__(self, items: Iterable[T | Deferred[T]] = ()) -> None:
        self._buf: list[Any] = list(_raw_of(items))
        self._start = 0
        self._stop = len(self._buf)
        self._tail: tuple[Any, ...] = ()

    @classmethod
    def view(cls, buffer: list[Any], start: int, stop: int) -> LazyTuple[T]:
        """``buffer[start:stop]`` without copying it: the caller only ever appends to
        ``buffer`` (through ``+`` on a view that ends at its end)."""
        out: LazyTuple[T] = object.__new__(cls)
        out._buf, out._start, out._stop, out._tail = buffer, start, stop, ()
        return out

    def _with_tail(self, tail: tuple[Any, ...]) -> LazyTuple[T]:
        out: LazyTuple[T] = object.__new__(type(self))
        out._buf, out._start, out._stop, out._tail = self._buf, self._start, self._stop, tail
        return out

    def _raw(self) -> tuple[Any, ...]:
        """The items as stored (``Deferred`` ones not built)."""
        return tuple(self._buf[self._start : self._stop]) + self._tail

    def shares_prefix(self, other: LazyTuple[Any]) -> int:
        """How many leading items this view and ``other`` share by construction (views
        of one buffer from one start): a lower bound of their common prefix, found
        without comparing items."""
        if other._buf is not self._buf or other._start != self._start:
            return 0
        return min(self._stop, other._stop) - self._start

    def __len__(self) -> int:
        return self._stop - self._start + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> LazyTuple[T]: ...

    def __getitem__(self, index: int | slice) -> T | LazyTuple[T]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1 and stop <= self._stop - self._start:
                begin = self._start + start
                return LazyTuple.view(self._buf, begin, max(begin, self._start + stop))
            return LazyTuple(self._raw()[index])
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("tuple index out of range")
        head = self._stop - self._start
        item = self._buf[self._start + index] if index < head else self._tail[index - head]
        return _built(item)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[T]:
        buf = self._buf
        for i in range(self._start, self._stop):
            yield _built(buf[i])
        for item in self._tail:
            yield _built(item)

    def __add__(self, other: Iterable[T]) -> LazyTuple[T]:
        """This sequence followed by ``other``; the buffer is never touched (see ``grow``)."""
        return self._extended(_raw_of(other), in_place=False)

    def grow(self, items: Iterable[T]) -> LazyTuple[T]:
        """This sequence followed by ``items``, appended to the shared buffer in place
        when this view ends where the buffer ends, so the next revision shares it (a
        run's transcript and turn log grow this way; other views use ``+``, so they
        never take the end of a buffer a transcript is still growing into). Otherwise
        the result is copied once into a buffer of its own, to grow in place after."""
        return self._extended(_raw_of(items), in_place=True)

    def _extended(self, extra: tuple[Any, ...], *, in_place: bool) -> LazyTuple[T]:
        if in_place:
            if not self._tail:
                with _APPEND:
                    if self._stop == len(self._buf):
                        self._buf.extend(extra)
                        return LazyTuple.view(self._buf, self._start, self._stop + len(extra))
            return LazyTuple(self._raw() + extra)  # a buffer of its own to grow into
        tail = self._tail + extra
        if len(tail) >= TAIL_MAX:
            return LazyTuple(self._raw() + extra)
        return self._with_tail(tail)

    def __radd__(self, other: tuple[T, ...]) -> LazyTuple[T]:
        if not isinstance(other, tuple):
            return NotImplemented
        return LazyTuple(other + self._raw())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyTuple):
            if len(other) != len(self):
                return False
            if self.shares_prefix(other) == len(self) or other._raw() == self._raw():
                return True
        elif not isinstance(other, tuple):
            return NotImplemented
        elif len(self) != len(other):
            return False
        return all(a is b or a == b for a, b in zip(self, other, strict=True))

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
        return sum(1 for item in self._raw() if type(item) is Deferred and not item.built)


def as_lazy(items: Sequence[T]) -> LazyTuple[T]:
    """``items`` as a ``LazyTuple`` (itself when it is one)."""
    return items if isinstance(items, LazyTuple) else LazyTuple(items)
