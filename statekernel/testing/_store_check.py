"""``check_store(factory)``: the conformance suite every checkpoint store passes.

No test framework needed: ``await check_store(factory)`` raises ``AssertionError``
naming the first check that failed. ``factory()`` (sync or async) must return a
new, empty store each time it is called; each check runs on its own store and
closes it. With ``raw`` (``RawRecords`` of the store: ``MemoryRecords``,
``FileRecords``, ``SQLiteRecords``, ``RedisRecords``, ``PostgresRecords`` or one of
your own), the checks on damaged storage run too (with ``RawCopies``, those of the
copies of head fields and lease records a store keeps outside its checksums), and with
``RawDocuments`` (the built-in ones are)
the check that migrations of a run stored at an older version persist. What a store
declares beyond the protocol (``RevisionHistory``, ``SettlesOnCancel``,
``ReleasesWithCommit``, ``CreatesLeased``, ``CancelsRuns``) is checked too.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from statekernel._storage.protocol import (
    CancelsRuns,
    CheckpointStore,
    CreatesLeased,
    ReleasesWithCommit,
    RevisionHistory,
    settles_on_cancel,
)
from statekernel.testing import _store_cases as c
from statekernel.testing._clock import ManualClock
from statekernel.testing._raw import RawCopies, RawDocuments, RawRecords
from statekernel.testing._store_cancelling import check_cancellations
from statekernel.testing._store_cancels import check_cancels_runs
from statekernel.testing._store_damage import (
    check_damaged_copies,
    check_damaged_records,
    check_log_gaps,
    check_missing_records,
)
from statekernel.testing._store_features import (
    check_creates_leased,
    check_history,
    check_releases_with_commit,
    check_settles_on_cancel,
)
from statekernel.testing._store_migration import check_persisting_migrations
from statekernel.testing._store_tags import check_tags

__all__ = ["StoreFactory", "check_store"]

StoreFactory = Callable[[], CheckpointStore | Awaitable[CheckpointStore]]
Check = Callable[[CheckpointStore], Awaitable[None]]


async def check_store(
    factory: StoreFactory,
    *,
    examples: int = 25,
    raw: RawRecords | None = None,
    clock: ManualClock | None = None,
) -> list[str]:
    """Run every conformance check on fresh stores from ``factory``; the checks' names.

    ``examples`` is the number of generated runs round-tripped (needs Hypothesis).
    ``raw`` reaches the stores' own storage, for the checks on damaged records.
    ``clock``: the clock the factory's stores expire leases on; the lease check moves
    it instead of waiting for a lease to expire in real time.

    Returns:
        The names of the checks run, in order (those of the optional features the
            store declares, and of ``raw``'s checks, included).

    Raises:
        AssertionError: a check failed (named in the message), or ``factory`` returned
            something that is not a store.
    """
    from statekernel.testing._store_props import check_generated_runs

    checks: list[tuple[str, Check]] = [
        ("round trip of generated runs", lambda s: check_generated_runs(s, examples)),
        ("missing runs and revisions", c.check_missing),
        ("revisions that are not ints", c.check_bad_revision),
        ("arguments of the wrong type or range", c.check_bad_arguments),
        ("compare-and-set", c.check_compare_and_set),
        ("concurrent committers", c.check_concurrent_committers),
        ("concurrent commits of many runs", c.check_group_commit),
        ("past revisions", c.check_past_revisions),
        ("events after a revision", c.check_events),
        ("10,000 events on one run", c.check_many_events),
        ("listing", c.check_listing),
        ("listing by tags", check_tags),
        ("deletion", c.check_deletion),
        ("many runs are isolated", c.check_isolation),
        ("10 MB tool output", c.check_large_output),
        ("non-ASCII text", c.check_non_ascii),
        ("leases", lambda s: c.check_leases(s, clock)),
        ("whose lease an acquire took over", lambda s: c.check_taken_from(s, clock)),
        ("a cancelled call raises its cancellation", check_cancellations),
    ]
    probe = await _open(factory)
    if isinstance(probe, RevisionHistory):
        checks.append(("history of every revision (RevisionHistory)", check_history))
    if settles_on_cancel(probe):
        checks.append(("a cancelled commit has settled (SettlesOnCancel)", check_settles_on_cancel))
    if isinstance(probe, ReleasesWithCommit):
        name = "a commit gives its lease up with it (ReleasesWithCommit)"
        checks.append((name, check_releases_with_commit))
    if isinstance(probe, CancelsRuns):
        checks.append(("cancel requests (CancelsRuns)", check_cancels_runs))
    if isinstance(probe, CreatesLeased):
        name = "a new run's commit takes its lease (CreatesLeased)"
        checks.append((name, check_creates_leased))
    await probe.aclose()
    if raw is not None:
        checks.append(("damaged records", lambda s: check_damaged_records(s, raw)))
        checks.append(("missing records", lambda s: check_missing_records(s, raw)))
        checks.append(("commit log gaps", lambda s: check_log_gaps(s, raw)))
    if isinstance(raw, RawCopies):
        copies = raw
        checks.append(("damaged copies", lambda s: check_damaged_copies(s, copies)))
    if isinstance(raw, RawDocuments):
        documents = raw
        checks.append(
            ("persisting migrations", lambda s: check_persisting_migrations(s, documents))
        )
    for name, check in checks:
        store = await _open(factory)
        try:
            await check(store)
        except AssertionError as exc:
            raise AssertionError(f"store check {name!r} failed: {exc}") from exc
        finally:
            await store.aclose()
    return [name for name, _ in checks]


async def _open(factory: StoreFactory) -> CheckpointStore:
    store = factory()
    if inspect.isawaitable(store):
        store = await store
    assert isinstance(store, CheckpointStore), f"factory returned {store!r}, not a store"
    return store
