"""The individual store conformance checks and the sample data they commit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from statekernel._records.events import Event
from statekernel._records.messages import Message, ModelRequest, ModelResult, ToolCall
from statekernel._records.run import Run, StateId, ToolCallRecord, Turn
from statekernel._storage.protocol import Checkpoint, CheckpointStore, CreatesLeased, Lease
from statekernel.errors import ConflictError, InvalidArgument, LeaseLost, RunBusy, RunNotFound
from statekernel.testing._clock import ManualClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)


__all__ = [
    "T0",
    "check_bad_arguments",
    "check_bad_revision",
    "check_compare_and_set",
    "check_concurrent_committers",
    "check_deletion",
    "check_events",
    "check_group_commit",
    "check_isolation",
    "check_large_output",
    "check_leases",
    "check_listing",
    "check_many_events",
    "check_missing",
    "check_non_ascii",
    "check_past_revisions",
    "check_taken_from",
    "commit_chain",
    "events_for",
    "next_revision",
    "sample_run",
]


def sample_run(run_id: str, *, turns: int = 2, at: datetime = T0) -> Run:
    """A realistic run: a transcript of tool-using turns and a turn in progress."""
    messages: list[Message] = [Message.system("You help."), Message.user("Weather in Paris?")]
    done: list[Turn] = []
    for i in range(turns):
        call = ToolCall(f"call_{i}", "get_weather", f'{{"city": "Paris", "day": {i}}}')
        request = ModelRequest("scripted/test", tuple(messages))
        answer = Message.assistant(tool_calls=[call])
        messages.append(answer)
        record = ToolCallRecord(
            call.id, call.name, call.arguments, {"city": "Paris", "day": i}, f"sunny {i}",
            attempt=1, started_at=at, finished_at=at,
        )  # fmt: skip
        messages.append(Message.tool(call.id, call.name, f"sunny {i}"))
        result = ModelResult(answer, finish_reason="tool_calls")
        done.append(Turn(i, request, result, 1, completed=(record,)))
    current = Turn(turns, ModelRequest("scripted/test", tuple(messages)), model_attempts=1)
    return Run(
        run_id=run_id,
        model="scripted/test",
        state="calling_model",
        context={"user": "u1"},
        messages=tuple(messages),
        turns=tuple(done),
        current_turn=current,
        created_at=at,
        updated_at=at,
    )


def next_revision(run: Run, **changes: Any) -> Run:
    """``run`` at the next revision, one second later, with ``changes``."""
    later = run.updated_at + timedelta(seconds=1)
    return attrs.evolve(run, revision=run.revision + 1, updated_at=later, **changes)


def events_for(run: Run, count: int, first_seq: int) -> tuple[Event, ...]:
    """``count`` persisted events of the commit of ``run``."""
    return tuple(
        Event("tool_call_completed", run.run_id, run.revision, first_seq + i, {"n": i}, T0)
        for i in range(count)
    )


async def commit_chain(store: CheckpointStore, run: Run, revisions: int) -> list[Run]:
    """Commit ``run`` then ``revisions`` more revisions (a message each); all of them."""
    chain = [run]
    await store.commit(Checkpoint.between(None, run))
    for i in range(revisions):
        nxt = next_revision(chain[-1], messages=(*chain[-1].messages, Message.user(f"m{i}")))
        await store.commit(Checkpoint.between(chain[-1], nxt))
        chain.append(nxt)
    return chain


async def _raises(exc_type: type[BaseException], work: Awaitable[Any], what: str) -> None:
    try:
        await work
    except exc_type:
        return
    raise AssertionError(f"{what}: expected {exc_type.__name__}")


async def check_missing(store: CheckpointStore) -> None:
    """Unknown runs and revisions raise ``RunNotFound``."""
    await _raises(RunNotFound, store.load("nope"), "load of an unknown run")
    await _raises(RunNotFound, store.events("nope"), "events of an unknown run")
    assert await store.delete("nope") is False, "delete of an unknown run returned True"
    await store.commit(Checkpoint.between(None, sample_run("r1")))
    await _raises(RunNotFound, store.load("r1", revision=1), "load of a future revision")
    await _raises(RunNotFound, store.load("r1", revision=-1), "load of a negative revision")
    huge = store.load("r1", revision=10**30)
    await _raises(RunNotFound, huge, "load of a revision beyond 64 bits")
    await _raises(RunNotFound, store.load("r1", revision=2**63 - 1), "load of the last revision")


async def check_bad_revision(store: CheckpointStore) -> None:
    """A revision that is not an int is ``InvalidArgument``, for a run stored or not."""
    await store.commit(Checkpoint.between(None, sample_run("r1")))
    for run_id in ("r1", "nope"):
        for bad in ("abc", 1.0, True):
            work = store.load(run_id, revision=bad)  # type: ignore[arg-type]
            await _raises(InvalidArgument, work, f"load of {run_id!r} at revision {bad!r}")


async def check_bad_arguments(store: CheckpointStore) -> None:
    """Arguments of the wrong type or range are ``InvalidArgument`` (never a driver's
    ``TypeError``, ``OverflowError`` or ``UnicodeEncodeError``), and nothing changes."""
    run = sample_run("r1")
    await store.commit(Checkpoint.between(None, run, events_for(run, 2, 0)))
    bad: Any = None
    for run_id in (None, 5, b"r1", "", "\ud800"):
        bad = run_id
        await _raises(InvalidArgument, store.load(bad), f"load of run id {run_id!r}")
        await _raises(InvalidArgument, store.events(bad), f"events of run id {run_id!r}")
        await _raises(InvalidArgument, store.delete(bad), f"delete of run id {run_id!r}")
    for after in ("1", 1.0, None, True):
        bad = after
        work = store.events("r1", after_revision=bad)
        await _raises(InvalidArgument, work, f"events after revision {after!r}")
    for limit in ("5", -1, 1.5, True):
        bad = limit
        await _raises(InvalidArgument, store.events("r1", limit=bad), f"events limit {limit!r}")
        await _raises(InvalidArgument, store.list_runs(limit=bad), f"listing limit {limit!r}")
    wrong: tuple[tuple[str, Any], ...] = (("state", "bogus"), ("updated_after", "2030"))
    for name, value in (*wrong, ("cursor", 5)):
        listing = store.list_runs(**{name: value})
        await _raises(InvalidArgument, listing, f"listing with {name}={value!r}")
    for after in (2**64, 2**63 - 1):
        assert await store.events("r1", after_revision=after) == [], f"events after {after}"
    assert len(await store.events("r1", after_revision=-(2**64))) == 2, "events after -2**64"
    page = await store.list_runs(limit=2**64)
    assert [s.run_id for s in page.runs] == ["r1"], "listing with a limit beyond 64 bits"
    assert (await store.load("r1")).revision == 0, "the run changed"


async def check_compare_and_set(store: CheckpointStore) -> None:
    """A commit lands only on the expected head; a failed one changes nothing."""
    run = sample_run("cas")
    await store.commit(Checkpoint.between(None, run))
    await _raises(ConflictError, store.commit(Checkpoint.between(None, run)), "second create")
    skip = attrs.evolve(run, revision=2)
    await _raises(ConflictError, store.commit(Checkpoint.between(run, skip)), "skipped revision")
    orphan = attrs.evolve(sample_run("orphan"), revision=1)
    await _raises(ConflictError, store.commit(Checkpoint.between(None, orphan)), "no run yet")
    one = next_revision(run, state="dispatching_tools")
    await store.commit(Checkpoint.between(run, one))
    stale = next_revision(run, state="paused")
    await _raises(ConflictError, store.commit(Checkpoint.between(run, stale)), "stale revision")
    assert await store.load("cas") == one, "a failed commit changed the run"


async def check_concurrent_committers(store: CheckpointStore) -> None:
    """Two commits on one revision at once: exactly one wins, and it is what loads."""
    run = sample_run("race")
    await store.commit(Checkpoint.between(None, run))
    for round_ in range(10):
        a = next_revision(run, context={"winner": "a", "round": round_})
        b = next_revision(run, context={"winner": "b", "round": round_})
        results = await asyncio.gather(
            store.commit(Checkpoint.between(run, a, events_for(a, 1, round_))),
            store.commit(Checkpoint.between(run, b, events_for(b, 1, round_))),
            return_exceptions=True,
        )
        wins = [r for r in results if r is None]
        losses = [r for r in results if isinstance(r, ConflictError)]
        assert len(wins) == 1, f"round {round_}: {results!r}"
        assert len(losses) == 1, f"round {round_}: {results!r}"
        run = a if results[0] is None else b
        assert await store.load("race") == run, f"round {round_}: the winner did not land"
    events = await store.events("race")
    assert [e.seq for e in events] == list(range(10)), "a losing commit wrote events"


async def check_past_revisions(store: CheckpointStore) -> None:
    """Every revision stays loadable, also past many revisions."""
    chain = await commit_chain(store, sample_run("past"), 70)
    for run in chain:
        got = await store.load("past", revision=run.revision)
        assert got == run, f"revision {run.revision} does not load back equal"
    assert await store.load("past") == chain[-1], "the head does not load back equal"


async def check_events(store: CheckpointStore) -> None:
    """Events come back in seq order, after a revision, limited, with their data."""
    run = sample_run("ev")
    first = events_for(run, 2, 0)
    await store.commit(Checkpoint.between(None, run, first))
    chain, expected = [run], list(first)
    for i in range(5):
        nxt = next_revision(chain[-1])
        batch = events_for(nxt, i % 3, len(expected))
        await store.commit(Checkpoint.between(chain[-1], nxt, batch))
        chain.append(nxt)
        expected += batch
    assert await store.events("ev") == expected, "events do not read back equal"
    for after in range(-1, 7):
        got = await store.events("ev", after_revision=after)
        assert got == [e for e in expected if e.revision > after], f"events after {after}"
    assert (
        await store.events("ev", after_revision=1, limit=2)
        == [e for e in expected if e.revision > 1][:2]
    ), "limit is not honoured"


async def check_many_events(store: CheckpointStore) -> None:
    """10,000 events on one run (100 commits of 100 events)."""
    run = sample_run("many")
    await store.commit(Checkpoint.between(None, run, events_for(run, 100, 0)))
    for _ in range(99):
        nxt = next_revision(run)
        await store.commit(Checkpoint.between(run, nxt, events_for(nxt, 100, nxt.revision * 100)))
        run = nxt
    events = await store.events("many")
    assert len(events) == 10_000, f"{len(events)} events instead of 10,000"
    assert [e.seq for e in events] == list(range(10_000)), "events out of seq order"
    tail = await store.events("many", after_revision=97)
    assert [e.seq for e in tail] == list(range(9_800, 10_000)), "events after revision 97"
    assert len(await store.events("many", limit=150)) == 150, "limit over commits"


async def check_listing(store: CheckpointStore) -> None:
    """Listing: newest update first, by state, by update time, paginated by cursor."""
    states: list[StateId] = ["completed", "paused", "failed", "completed", "init"]
    expected = []
    for i in range(15):
        run = sample_run(f"list-{i:02d}", turns=i % 3, at=T0 + timedelta(minutes=i))
        run = attrs.evolve(run, state=states[i % len(states)])
        await store.commit(Checkpoint.between(None, run))
        expected.append(run)
    # two runs updated at the same instant are ordered by run id
    tie = attrs.evolve(sample_run("list-tie", at=T0 + timedelta(minutes=14)), state="paused")
    await store.commit(Checkpoint.between(None, tie))
    expected.append(tie)
    order = sorted(expected, key=lambda r: (r.updated_at, r.run_id), reverse=True)
    page = await store.list_runs()
    assert [s.run_id for s in page.runs] == [r.run_id for r in order], "order of list_runs"
    assert page.next_cursor is None, "a complete listing has a next cursor"
    top = page.runs[0]
    assert (top.state, top.revision, top.model, top.turns) == (
        order[0].state, 0, "scripted/test", order[0].turn_count,
    ), f"summary fields {top!r}"  # fmt: skip
    assert top.updated_at == order[0].updated_at, "summary updated_at"
    assert top.created_at == order[0].created_at, "summary created_at"
    done = await store.list_runs(state="completed")
    assert [s.run_id for s in done.runs] == [r.run_id for r in order if r.state == "completed"]
    since = T0 + timedelta(minutes=9)
    recent = await store.list_runs(updated_after=since)
    assert [s.run_id for s in recent.runs] == [r.run_id for r in order if r.updated_at > since]
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(20):
        chunk = await store.list_runs(limit=3, cursor=cursor)
        seen += [s.run_id for s in chunk.runs]
        cursor = chunk.next_cursor
        if cursor is None:
            break
    assert seen == [r.run_id for r in order], f"pagination gave {seen}"
    paused = await store.list_runs(state="paused", limit=1)
    rest = await store.list_runs(state="paused", limit=5, cursor=paused.next_cursor)
    got = [s.run_id for s in (*paused.runs, *rest.runs)]
    assert got == [r.run_id for r in order if r.state == "paused"], "paginated state filter"


async def check_deletion(store: CheckpointStore) -> None:
    """Deletion removes the run, its revisions and events; the id can be reused."""
    chain = await commit_chain(store, sample_run("del"), 3)
    keep = sample_run("keep")
    await store.commit(Checkpoint.between(None, keep, events_for(keep, 2, 0)))
    assert await store.delete("del") is True, "delete returned False"
    await _raises(RunNotFound, store.load("del"), "load after delete")
    await _raises(RunNotFound, store.load("del", revision=1), "past revision after delete")
    await _raises(RunNotFound, store.events("del"), "events after delete")
    assert await store.delete("del") is False, "second delete returned True"
    assert [s.run_id for s in (await store.list_runs()).runs] == ["keep"], "listed after delete"
    fresh = attrs.evolve(sample_run("del", turns=0), context={"new": True})
    await store.commit(Checkpoint.between(None, fresh, events_for(fresh, 1, 0)))
    assert await store.load("del") == fresh, "a recreated run mixes in old data"
    assert len(await store.events("del")) == 1, "a recreated run has old events"
    assert await store.load("keep") == keep, "deleting one run changed another"
    assert len(await store.events("keep")) == 2, "deleting one run changed another's events"
    assert chain[-1].revision == 3


async def check_isolation(store: CheckpointStore) -> None:
    """Fifty runs committed interleaved each load back as themselves."""
    runs = {f"iso-{i}": sample_run(f"iso-{i}", turns=i % 4) for i in range(50)}
    for run in runs.values():
        await store.commit(Checkpoint.between(None, run, events_for(run, 1, 0)))
    for step in range(3):
        for run_id, run in list(runs.items()):
            nxt = next_revision(run, messages=(*run.messages, Message.user(f"{run_id}/{step}")))
            await store.commit(Checkpoint.between(run, nxt, events_for(nxt, 1, step + 1)))
            runs[run_id] = nxt
    for run_id, run in runs.items():
        assert await store.load(run_id) == run, f"{run_id} does not load back as itself"
        events = await store.events(run_id)
        assert {e.run_id for e in events} == {run_id}, f"events of {run_id}"
        assert len(events) == 4, f"events of {run_id}"


async def check_large_output(store: CheckpointStore) -> None:
    """A 10 MB tool output (in the record and the tool message) round-trips."""
    big = "".join(f"{i:09d}\n" for i in range(1_000_000))
    run = sample_run("big")
    assert run.current_turn is not None
    call = ToolCall("call_big", "dump", "{}")
    answer = Message.assistant(tool_calls=[call])
    record = ToolCallRecord(call.id, call.name, "{}", {}, big, attempt=1, started_at=T0)
    turn = attrs.evolve(
        run.current_turn,
        result=ModelResult(answer, finish_reason="tool_calls"),
        completed=(record,),
    )
    run = attrs.evolve(run, state="dispatching_tools", current_turn=turn)
    await store.commit(Checkpoint.between(None, run))
    closed = next_revision(
        run,
        messages=(*run.messages, answer, Message.tool(call.id, call.name, big)),
        turns=run.turns + (turn,),  # noqa: RUF005 (keeps stored turns deferred)
        current_turn=None,
        state="preparing_turn",
    )
    await store.commit(Checkpoint.between(run, closed))
    assert await store.load("big") == closed, "the head with 10 MB does not load back"
    assert await store.load("big", revision=0) == run, "revision 0 with 10 MB"


async def check_non_ascii(store: CheckpointStore) -> None:
    """Text in any script (and NUL, emoji, combining marks) in ids, messages, context."""
    text = "Grüße, 東京 🌧️ — مرحبا \u0000 e\u0301 \U0001f600 " * 5
    run_id = "ран-東京-🌧️"
    run = attrs.evolve(
        sample_run(run_id),
        messages=(Message.user(text), Message.system("ß" * 200)),
        context={"città": text, "$b": "looks like a marker", "nested": [{"$v": "x"}]},
    )
    event = Event("input_received", run_id, 0, 0, {"text": text}, T0)
    await store.commit(Checkpoint.between(None, run, (event,)))
    assert await store.load(run_id) == run, "non-ASCII run does not load back equal"
    assert await store.events(run_id) == [event], "non-ASCII event does not read back equal"
    assert [s.run_id for s in (await store.list_runs()).runs] == [run_id]


async def check_leases(store: CheckpointStore, clock: ManualClock | None = None) -> None:
    """One owner per run: a held lease is refused to others, tokens grow, commits and
    renewals under a lease that moved on are refused, a released or expired lease is
    taken over. ``clock``: the one the store expires leases on (None: real time)."""
    run = sample_run("leased")
    await store.commit(Checkpoint.between(None, run))
    await _raises(RunNotFound, store.acquire("no-such-run", "a", ttl=30), "lease of no run")
    first = await store.acquire(run.run_id, "owner-a", ttl=30)
    await _raises(RunBusy, store.acquire(run.run_id, "owner-b", ttl=30), "second owner")
    one = next_revision(run)
    await store.commit(Checkpoint.between(run, one), lease=first)
    await store.renew(first, ttl=30)
    await store.release(first)
    second = await store.acquire(run.run_id, "owner-b", ttl=0.2)
    assert int(second.token.split("/")[0]) > int(first.token.split("/")[0]), "token must grow"
    two = next_revision(one)
    stale = store.commit(Checkpoint.between(one, two), lease=first)
    await _raises(LeaseLost, stale, "commit under a released lease")
    await _raises(LeaseLost, store.renew(first, ttl=30), "renewal of a released lease")
    assert (await store.load(run.run_id)).revision == 1, "a refused commit changed the run"
    await _outlast(0.2, clock)  # owner-b never renews: its lease expires
    third = await store.acquire(run.run_id, "owner-c", ttl=30)
    await _raises(LeaseLost, store.commit(Checkpoint.between(one, two), lease=second), "expired")
    await store.commit(Checkpoint.between(one, two), lease=third)
    await store.release(second)  # giving up a lease that moved on changes nothing
    await _raises(RunBusy, store.acquire(run.run_id, "owner-a", ttl=30), "after a stale release")
    await store.release(third)


async def _outlast(ttl: float, clock: ManualClock | None) -> None:
    """Wait until a lease of ``ttl`` seconds taken before has expired on ``clock`` (None:
    real time, which no store's clock measures as shorter)."""
    if clock is None:
        await asyncio.sleep(ttl + 0.1)
    else:
        clock.advance(ttl + 0.1)


def _from(lease: Lease, expected: str | None, what: str) -> None:
    assert lease.taken_from == expected, (
        f"{what}: taken_from is {lease.taken_from!r}, expected {expected!r}"
    )


async def check_taken_from(store: CheckpointStore, clock: ManualClock | None = None) -> None:
    """``Lease.taken_from`` tells whose lease an ``acquire`` took over: nobody's for a
    lease never taken, given back (also after it expired) or the owner's own that
    expired; the holder's for a lease that expired in its hands. A run created with its
    lease (``CreatesLeased``) is taken over from its creator. ``clock``: the one the
    store expires leases on (None: real time)."""
    run = sample_run("taken-over")
    await store.commit(Checkpoint.between(None, run))
    first = await store.acquire(run.run_id, "owner-a", ttl=0.2)
    _from(first, None, "a lease never taken")
    await _outlast(0.2, clock)
    again = await store.acquire(run.run_id, "owner-a", ttl=0.2)
    _from(again, None, "the same owner's expired lease")
    await _outlast(0.2, clock)
    taken = await store.acquire(run.run_id, "owner-b", ttl=0.2)
    _from(taken, "owner-a", "another owner's expired lease")
    await _outlast(0.2, clock)
    await store.release(taken)  # expired, then given back: free
    freed = await store.acquire(run.run_id, "owner-c", ttl=30)
    _from(freed, None, "a lease given back after it expired")
    await store.release(freed)
    given = await store.acquire(run.run_id, "owner-d", ttl=30)
    _from(given, None, "a lease given back")
    await store.release(given)
    if isinstance(store, CreatesLeased):
        born = sample_run("taken-over-born")
        lease = await store.create_leased(Checkpoint.between(None, born), "creator", ttl=0.2)
        assert lease is not None, "a new run was created without its lease"
        _from(lease, None, "the lease of a new run")
        await _outlast(0.2, clock)
        late = await store.acquire(born.run_id, "owner-e", ttl=30)
        _from(late, "creator", "the expired lease a run was created with")
        await store.release(late)


async def check_group_commit(store: CheckpointStore) -> None:
    """Many commits of different runs at once, some refused (stale revision, stale lease,
    a run that exists or does not): each caller gets exactly the outcome of its own
    commit, and each run's head and events are what its own commits left."""
    kinds = ("lands", "stale", "leased", "lease lost", "create", "exists", "no run")
    refused: dict[str, type[Exception]] = {
        "stale": ConflictError, "exists": ConflictError, "no run": ConflictError,
        "lease lost": LeaseLost,
    }  # fmt: skip
    heads: dict[str, Run] = {}
    seqs: dict[str, int] = {}  # events committed per run
    leases: dict[str, tuple[Lease, Lease]] = {}  # run -> (lease that moved on, current)
    for i in range(42):
        run = sample_run(f"group-{i}", turns=i % 3)
        await store.commit(Checkpoint.between(None, run, events_for(run, 1, 0)))
        heads[run.run_id], seqs[run.run_id] = run, 1
        if i % 2:
            old = await store.acquire(run.run_id, f"old-{i}", ttl=30)
            await store.release(old)
            leases[run.run_id] = (old, await store.acquire(run.run_id, f"new-{i}", ttl=30))
    for round_ in range(3):
        commits: list[tuple[str, type[Exception] | None, Awaitable[None]]] = []
        for i, (run_id, run) in enumerate(list(heads.items())):
            kind = kinds[(i + round_) % len(kinds)]
            held = leases.get(run_id)
            if kind in ("leased", "lease lost") and held is None:
                kind = "lands"
            nxt = next_revision(run, messages=(*run.messages, Message.user(f"{run_id}/{round_}")))
            cp = Checkpoint.between(run, nxt, events_for(nxt, 2, seqs[run_id]))
            lease = None if held is None else held[1]
            fresh = sample_run(f"group-new-{round_}-{i}", turns=1)
            target = run_id
            if kind == "stale":  # another commit moves the head first
                await store.commit(cp, lease=lease)
                heads[run_id], seqs[run_id] = nxt, seqs[run_id] + 2
                cp = Checkpoint.between(run, next_revision(run, context={"late": True}))
            elif kind == "lease lost":
                lease = None if held is None else held[0]
            elif kind == "create":
                cp, target = Checkpoint.between(None, fresh, events_for(fresh, 1, 0)), fresh.run_id
                lease = None
            elif kind == "exists":
                cp, lease = Checkpoint.between(None, attrs.evolve(run, context={"x": 1})), None
            elif kind == "no run":
                cp, target = Checkpoint.between(fresh, next_revision(fresh)), fresh.run_id
                lease = None
            want = refused.get(kind)
            if want is None:
                heads[target] = cp.run
                seqs[target] = seqs.get(target, 0) + len(cp.events)
            commits.append((target, want, store.commit(cp, lease=lease)))
        results = await asyncio.gather(*(c for _, _, c in commits), return_exceptions=True)
        for (run_id, want, _), got in zip(commits, results, strict=True):
            if want is None:
                assert got is None, f"round {round_}: commit of {run_id} failed: {got!r}"
            else:
                assert isinstance(got, want), f"round {round_}: {run_id} got {got!r}, not {want}"
                assert getattr(got, "run_id", run_id) == run_id, f"{got!r} names another run"
        for run_id, run in heads.items():
            assert await store.load(run_id) == run, f"round {round_}: head of {run_id}"
    for run_id, count in seqs.items():
        events = await store.events(run_id)
        assert [e.seq for e in events] == list(range(count)), f"events of {run_id}"
    for _, lease in leases.values():
        await store.release(lease)
