"""The store conformance check of tags: listing by tags, kept right by every commit."""

from __future__ import annotations

from datetime import timedelta

import attrs

from statekernel._records.run import Run
from statekernel._storage.protocol import Checkpoint, CheckpointStore
from statekernel.errors import InvalidTag
from statekernel.testing._store_cases import T0, next_revision, sample_run

__all__ = ["check_tags"]


async def _ids(store: CheckpointStore, **filters: object) -> list[str]:
    """The run ids of every page of a listing with ``filters``, two runs a page."""
    found: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.list_runs(limit=2, cursor=cursor, **filters)  # type: ignore[arg-type]
        found += [s.run_id for s in page.runs]
        cursor = page.next_cursor
        if cursor is None:
            return found


async def check_tags(store: CheckpointStore) -> None:
    """Tags: kept with the run and its summary; ``list_runs(tags=)`` lists the runs that
    carry every pair given, in order and paginated; a commit that changes a run's tags,
    removes them or keeps them, a deletion and a run created again are all listed right;
    a pair that breaks the rules is ``InvalidTag``."""
    made: dict[str, Run] = {}
    given = {
        "t-a": {"team": "a", "env": "prod"},
        "t-b": {"team": "b", "env": "prod"},
        "t-c": {},
        "t-d": {"team": "a", "env": "dev", "ticket": "x" * 256},
        "t-e": {"team": "a", "env": "prod"},
    }
    for i, (run_id, tags) in enumerate(given.items()):
        run = attrs.evolve(sample_run(run_id, at=T0 + timedelta(minutes=i)), tags=tags)
        await store.commit(Checkpoint.between(None, run))
        made[run_id] = run
    assert (await store.load("t-d")).tags == given["t-d"], "tags of a loaded run"
    summaries = {s.run_id: s.tags for s in (await store.list_runs()).runs}
    assert summaries == given, f"tags of the summaries: {summaries}"
    assert await _ids(store, tags={"team": "a"}) == ["t-e", "t-d", "t-a"], "by one pair"
    both = await _ids(store, tags={"team": "a", "env": "prod"})
    assert both == ["t-e", "t-a"], f"by two pairs: {both}"
    assert await _ids(store, tags={"team": "z"}) == [], "a pair no run carries"
    assert len(await _ids(store, tags={})) == 5, "empty tags filter nothing"
    paused = attrs.evolve(next_revision(made["t-a"]), state="paused")
    await store.commit(Checkpoint.between(made["t-a"], paused))
    made["t-a"] = paused
    assert await _ids(store, tags={"env": "prod"}, state="paused") == ["t-a"], "with a state"
    # a commit that changes tags, one that keeps them, one that removes them all
    changed = next_revision(made["t-b"], tags={"team": "a"})
    await store.commit(Checkpoint.between(made["t-b"], changed))
    kept = next_revision(changed, context={"more": 1})
    await store.commit(Checkpoint.between(changed, kept))
    cleared = next_revision(made["t-e"], tags={})
    await store.commit(Checkpoint.between(made["t-e"], cleared))
    by_team = await _ids(store, tags={"team": "a"})
    assert by_team == ["t-d", "t-b", "t-a"], f"after tag changes: {by_team}"
    by_env = await _ids(store, tags={"env": "prod"})
    assert by_env == ["t-a"], f"a pair removed by a commit: {by_env}"
    assert await _ids(store, tags={"ticket": "x" * 256}) == ["t-d"], "a value of 256 chars"
    assert await store.delete("t-d"), "delete"
    again = sample_run("t-d", at=T0 + timedelta(hours=1))
    await store.commit(Checkpoint.between(None, again))
    assert await _ids(store, tags={"env": "dev"}) == [], "a deleted run's tags"
    for bad in ({"bad key": "x"}, {"k": 1}, {"k": "v" * 257}, "team=a"):
        try:
            await store.list_runs(tags=bad)  # type: ignore[arg-type]
        except InvalidTag:
            continue
        raise AssertionError(f"list_runs(tags={bad!r}) was not refused with InvalidTag")
