"""``LazyTuple`` behaves like a tuple and builds each deferred item once, when read."""

from __future__ import annotations

import pytest
from hypothesis import given

from statekernel._records.lazy import Deferred, LazyTuple
from statekernel.testing.strategies import SequenceOp, sequence_ops


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
    items: LazyTuple[str] = LazyTuple([counted(x, calls) for x in "abcd"])
    part = items[1:3]
    assert isinstance(part, LazyTuple)
    longer = items + ("e",)  # noqa: RUF005
    both = ("z",) + items  # noqa: RUF005
    joined = items + LazyTuple[str]([counted("f", calls)])
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


# -- shared buffers ------------------------------------------------------------------


def test_a_growing_sequence_and_its_prefixes_share_one_buffer() -> None:
    first = LazyTuple(["a"])
    second = first.grow(["b"])
    third = second.grow(["c", "d"])
    prefix = third[:2]
    # equal to tuples at run time, which mypy takes for never equal
    assert (first, second, prefix) == (("a",), ("a", "b"), ("a", "b"))  # type: ignore[comparison-overlap]
    assert third == ("a", "b", "c", "d")
    assert third.shares_prefix(first) == 1
    assert third.shares_prefix(prefix) == 2
    assert prefix.shares_prefix(third) == 2
    assert third.shares_prefix(LazyTuple(["a", "b"])) == 0, "equal, but not the same buffer"
    assert third[1:].shares_prefix(third) == 0, "another start"


def test_plus_never_takes_the_end_of_a_growing_buffer() -> None:
    transcript = LazyTuple(["a", "b"])
    request = transcript + ("note",)  # noqa: RUF005
    assert request == ("a", "b", "note")
    assert request.shares_prefix(transcript) == 2, "the prefix is shared, the note is its own"
    grown = transcript.grow(["c"])
    assert grown.shares_prefix(transcript) == 2, "the transcript still grows in place"
    assert request == ("a", "b", "note")


def test_growing_an_older_view_never_changes_a_newer_one() -> None:
    base = LazyTuple(["a", "b"])
    longer = base.grow(["c"])
    branch = base.grow(["x", "y"])
    assert longer == ("a", "b", "c")
    assert branch == ("a", "b", "x", "y")
    assert branch.shares_prefix(longer) == 0, "the branch grows into a buffer of its own"
    grown = branch.grow(["z"])
    assert grown.shares_prefix(branch) == 4
    assert longer == ("a", "b", "c")
    assert branch == ("a", "b", "x", "y")
    assert grown == ("a", "b", "x", "y", "z")


def test_a_long_tail_moves_to_a_buffer_of_its_own() -> None:
    from statekernel._records.lazy import TAIL_MAX

    base: LazyTuple[object] = LazyTuple(["a", "b"])
    branch = base
    for i in range(TAIL_MAX + 3):
        branch = branch + (i,)  # noqa: RUF005
    assert branch == ("a", "b", *range(TAIL_MAX + 3))
    assert branch.shares_prefix(base) == 0, "folded into a new buffer"
    ended = branch.grow(["end"])
    again = ended.grow(["more"])
    assert again == (*branch, "end", "more")
    assert again.shares_prefix(ended) == len(ended), "grown once into its own buffer, then in place"


@given(sequence_ops())
def test_behaves_like_a_tuple_under_any_appends_and_slices(ops: list[SequenceOp]) -> None:
    """Differential: every sequence made by grows, appends, prepends and slices (from any
    earlier one, so buffers are shared and branched) equals the same made from tuples,
    and stays equal after everything made later."""
    pool: list[tuple[LazyTuple[int], tuple[int, ...]]] = [(LazyTuple([0]), (0,))]
    fresh = iter(range(1, 10**6))
    for op, source, a, b in ops:
        lazy, plain = pool[source % len(pool)]
        if op in ("grow", "add", "radd"):
            items = tuple(next(fresh) for _ in range(b))
            operand = LazyTuple(items) if a % 2 else items
            if op == "radd":
                made: LazyTuple[int] = items + lazy
                pool.append((made, items + plain))
            elif op == "add":
                pool.append((lazy + operand, plain + items))
            else:
                pool.append((lazy.grow(operand), plain + items))
        elif op == "slice":
            pool.append((lazy[a:b], plain[a:b]))
        else:
            pool.append((lazy[a::2], plain[a::2]))
        for seq, model in pool:
            assert seq == model
            assert len(seq) == len(model)
    for seq, model in pool:
        assert tuple(seq) == model
        assert [seq[i] for i in range(-len(model), len(model))] == [*model, *model]
        assert hash(seq) == hash(model)
        assert seq == LazyTuple(model)
