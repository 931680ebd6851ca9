"""``LazyTuple`` behaves like a tuple and builds each deferred item once, when read."""

from __future__ import annotations

import pytest

from statekernel._lazy import Deferred, LazyTuple


def counted(value: str, calls: list[str]) -> Deferred[str]:
    def make() -> str:
        calls.append(value)
        return value

    return Deferred(make)


def test_deferred_items_are_built_once_when_read() -> None:
    calls: list[str] = []
    items = LazyTuple(["a", counted("b", calls), counted("c", calls)])
    assert len(items) == 3
    assert items.deferred == 2
    assert calls == []
    assert items[1] == "b"
    assert items[1] == "b"
    assert calls == ["b"]
    assert items.deferred == 1
    assert list(items) == ["a", "b", "c"]
    assert calls == ["b", "c"]
    assert items.deferred == 0


def test_like_a_tuple() -> None:
    calls: list[str] = []
    items = LazyTuple(["a", counted("b", calls)])
    assert items == ("a", "b")
    assert ("a", "b") == items  # noqa: SIM300 (the reflected comparison)
    assert items != ("a", "b", "c")
    assert items != ("a", "x")
    assert items != ["a", "b"]  # like a tuple: never equal to a list
    assert items == LazyTuple(["a", "b"])
    assert hash(items) == hash(("a", "b"))
    assert repr(items) == "LazyTuple(('a', 'b'))"
    assert items[-1] == "b"
    assert "b" in items
    assert items.index("b") == 1
    with pytest.raises(IndexError):
        items[2]


def test_slices_and_concatenation_stay_lazy() -> None:
    calls: list[str] = []
    items = LazyTuple([counted(x, calls) for x in "abcd"])
    part = items[1:3]
    assert isinstance(part, LazyTuple)
    longer = items + ("e",)  # noqa: RUF005
    both = ("z",) + items  # noqa: RUF005
    joined = items + LazyTuple([counted("f", calls)])
    assert (len(part), len(longer), len(both), len(joined)) == (2, 5, 5, 5)
    assert calls == [], "slicing or adding built an item"
    assert part == ("b", "c")
    assert longer[-1] == "e"
    assert both[0] == "z"
    assert joined[-1] == "f"
    assert items[1] == "b"
    assert calls == ["b", "c", "f"], "items shared with a slice are built once"


def test_a_failing_item_fails_every_read() -> None:
    attempts: list[int] = []

    def broken() -> str:
        attempts.append(1)
        raise ValueError("damaged")

    items = LazyTuple(["ok", Deferred(broken)])
    assert items[0] == "ok"
    for _ in range(2):
        with pytest.raises(ValueError, match="damaged"):
            items[1]
    assert len(attempts) == 2
    assert items.deferred == 1


def test_pickled_and_copied_with_items_built() -> None:
    import copy
    import pickle

    calls: list[str] = []
    items = LazyTuple(["a", counted("b", calls)])
    for clone in (pickle.loads(pickle.dumps(items)), copy.deepcopy(items), copy.copy(items)):
        assert clone == ("a", "b")
        assert clone.deferred == 0
    assert calls == ["b"]
