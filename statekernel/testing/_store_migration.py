"""The conformance check of persisting migrations: a run stored at an older schema
version is read through the registered migrations, and the commit after the load
leaves its head reading current records only.

The older version is synthetic: version 0, where a head calls the model
``model_name`` (not ``model``), a turn its index ``number`` (not ``index``) and a
message its content ``parts`` (not ``content``). The check writes a run in that shape
into the store's own storage through ``RawDocuments`` and registers the migration
from version 0 while it runs (so it must not run beside other code that loads runs
at an older version).
"""

from __future__ import annotations

from typing import Any

from statekernel._records import convert
from statekernel._records.messages import Message
from statekernel._storage.protocol import Checkpoint, CheckpointStore
from statekernel.testing._raw import RawDocuments
from statekernel.testing._store_cases import next_revision, sample_run
from statekernel.testing._store_damage import corrupt_raised

__all__ = ["check_persisting_migrations", "to_current"]


def _old_turn(doc: dict[str, Any]) -> dict[str, Any]:
    doc["number"] = doc.pop("index")
    return doc


def _old_head(doc: dict[str, Any]) -> dict[str, Any]:
    doc["schema_version"] = 0
    doc["model_name"] = doc.pop("model")
    if "current_turn" in doc:
        _old_turn(doc["current_turn"])
    return doc


def _old_message(doc: dict[str, Any]) -> dict[str, Any]:
    doc["parts"] = doc.pop("content")
    return doc


def _old_entry(entry: dict[str, Any]) -> dict[str, Any]:
    if "f" in entry:
        _old_head(entry["f"])
    patch = entry.get("p", {})
    if "model" in patch:
        patch["model_name"] = patch.pop("model")
    if "current_turn" in patch:
        _old_turn(patch["current_turn"])
    return entry


_OLD = {"head": _old_head, "entry": _old_entry, "message": _old_message, "turn": _old_turn}


def to_current(kind: str, doc: Any) -> Any:
    """The migration from the synthetic version 0 to 1: renames the fields back (the
    registered migrations take it on from version 1)."""
    if kind == "head":
        doc["model"] = doc.pop("model_name")
    elif kind == "turn":
        doc["index"] = doc.pop("number")
    elif kind == "message":
        doc["content"] = doc.pop("parts")
    return doc


async def _make_old(store: CheckpointStore, raw: RawDocuments, run_id: str) -> None:
    """Rewrite every head, entry, message and turn of the run in the version 0 shape."""
    for key, data in (await raw.read(store, run_id)).items():
        change = _OLD.get(key[0])
        if change is not None:
            doc = change(raw.decode(key, data))
            await raw.write(store, run_id, key, raw.encode(key, doc, data))


async def _refused(store: CheckpointStore, run_id: str, revision: int | None, why: str) -> None:
    words = ("unknown schema_version 0",)
    await corrupt_raised(store.load(run_id, revision=revision), run_id, words, why)


async def check_persisting_migrations(store: CheckpointStore, raw: RawDocuments) -> None:
    """A run in an older shape loads through its migration only; the next commit writes
    it back at the current version (later loads need no migration), and the revisions
    before stay as they were stored."""
    run = sample_run("old")
    one = next_revision(run, messages=run.messages + (Message.user("more"),))  # noqa: RUF005
    await store.commit(Checkpoint.between(None, run))
    await store.commit(Checkpoint.between(run, one))
    await _make_old(store, raw, "old")
    saved = dict(convert._MIGRATIONS)
    try:
        convert._MIGRATIONS.pop(0, None)
        await _refused(store, "old", None, "a version 0 run without a migration")
        convert._MIGRATIONS[0] = to_current
        loaded = await store.load("old")
        assert loaded == one, "the migrated run differs from the one committed"
        assert list(loaded.turns) == list(one.turns), "its completed turns differ"
        assert await store.load("old", revision=0) == run, "revision 0 through the migration"
        listed = [s.model for s in (await store.list_runs()).runs]
        assert listed == [run.model], f"the listing reads {listed}"
        two = next_revision(loaded, messages=loaded.messages + (Message.user("after"),))  # noqa: RUF005
        await store.commit(Checkpoint.between(loaded, two))
        head = raw.decode(("head", 0), (await raw.read(store, "old"))[("head", 0)])
        assert head["schema_version"] == convert.SCHEMA_VERSION, "the head was not rewritten"
        assert head["model"] == run.model, "the rewritten head keeps the old field name"

        convert._MIGRATIONS.clear()  # from now on the head reads current records only
        loaded = await store.load("old")
        assert loaded == two, "the run after the commit needs the migration still"
        assert list(loaded.turns) == list(two.turns), "completed turns need the migration still"
        three = next_revision(loaded, state="completed", current_turn=None)
        await store.commit(Checkpoint.between(loaded, three))
        assert await store.load("old") == three
        assert await store.load("old", revision=2) == two
        await _refused(store, "old", 0, "the revisions before the migration stay as stored")
    finally:
        convert._MIGRATIONS.clear()
        convert._MIGRATIONS.update(saved)
