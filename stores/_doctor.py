"""``diagnose(url)``: a health check of a store that changes nothing it reads.

For the store as a whole it reports what its ``Probe`` finds (``_doctor_probe``; one
module per kind of store): durability settings, permissions, integrity. For every run:

- ``records``: the head and every message, completed turn and blob it references
  decode, and each stored record matches its checksum;
- ``commit log``: every stored revision decodes from the commit log, revisions run
  0..head without a gap, the events are numbered 0..n-1 without a gap and each
  carries its commit's revision, ``event_count`` grows by the events of each commit,
  each commit is a transition the lifecycle declares (or a data-only commit that
  keeps the state) and ends in the state it stored, and the head is the last
  revision of its log;
- ``lease``: free, or held by whom and until when; expired, or left by a process
  that is gone.

A finding is ``ok``, a ``warning`` (worth knowing, nothing is lost) or ``damaged``
(a run or the store cannot be served as stored).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from statekernel._lifecycle.trace import DATA_EVENTS, DECLARED, transitions_of
from statekernel._records.events import Event
from statekernel._records.run import STATE_IDS, Run
from statekernel._storage.protocol import RevisionHistory
from statekernel.errors import CorruptCheckpoint, RunNotFound, StoreError
from statekernel.stores._doctor_probe import (
    DAMAGED,
    OK,
    WARNING,
    Finding,
    LeaseView,
    Probe,
    RunRef,
    Status,
)
from statekernel.stores._open import backend

__all__ = ["DAMAGED", "OK", "WARNING", "Finding", "Status", "diagnose", "lease_finding"]


async def diagnose(url: str) -> list[Finding]:
    """Every finding about the store at ``url``: the store's own first, then each run's.

    A store that does not exist, cannot be reached or has an unknown scheme raises
    (``StoreError``, ``ConfigError``): nothing is created to check it.
    """
    probe = open_probe(url)
    try:
        findings = await probe.settings()
        refs = await probe.runs()
        findings += await probe.cross_checks()
        for ref in refs:
            findings += await check_run(probe, ref)
        return findings
    finally:
        await probe.aclose()


async def check_run(probe: Probe, ref: RunRef) -> list[Finding]:
    """The findings about one run found in the store's storage."""
    if ref.problem is not None or ref.run_id is None or probe.store is None:
        return [] if ref.problem is None else [ref.problem]
    run_id = ref.run_id
    try:
        head, records = await _records(probe, run_id)
        found = [records]
        found.append(await _commit_log(probe, run_id, head))
        lease, problem = await _guarded(probe, "lease", run_id, lambda: probe.lease(run_id))
        found.append(problem or lease_finding(run_id, lease))
    except RunNotFound:
        return [Finding("records", run_id, OK, "deleted while the doctor ran")]
    return found


async def _guarded(
    probe: Probe, check: str, run_id: str, work: Callable[[], Any]
) -> tuple[Any, Finding | None]:
    """``await work()``, or the finding of a run whose stored records cannot be read."""
    try:
        return await work(), None
    except RunNotFound:
        raise
    except CorruptCheckpoint as exc:
        return None, Finding(check, run_id, DAMAGED, str(exc))
    except StoreError as exc:
        if not probe.local_errors:
            raise
        return None, Finding(check, run_id, DAMAGED, f"cannot be read: {exc}")


def _touch(run: Run) -> None:
    """Decode what a loaded run decodes only when read: its transcript, its completed
    turns and the messages of their requests."""
    for _ in run.messages:
        pass
    for turn in (*run.turns, *((run.current_turn,) if run.current_turn else ())):
        for _ in turn.request.messages:
            pass


async def _records(probe: Probe, run_id: str) -> tuple[Run | None, Finding]:
    assert probe.store is not None
    store = probe.store

    async def load() -> Run:
        run = await store.load(run_id)
        _touch(run)
        return run

    run, problem = await _guarded(probe, "records", run_id, load)
    if problem is not None:
        return None, problem
    assert isinstance(run, Run)
    if run.run_id != run_id:
        return None, Finding("records", run_id, DAMAGED, f"the head names run {run.run_id!r}")
    detail = (
        f"head at revision {run.revision} ({run.state}), {len(run.messages)} messages,"
        f" {len(run.turns)} completed turns: decoded, checksums match"
    )
    return run, Finding("records", run_id, OK, detail)


async def _commit_log(probe: Probe, run_id: str, head: Run | None) -> Finding:
    assert probe.store is not None
    store = probe.store
    if not isinstance(store, RevisionHistory):
        return Finding("commit log", run_id, WARNING, "this store cannot read past revisions")

    async def revisions() -> list[tuple[Run, list[Event]]]:
        found = []
        async for run, events in store.history(run_id):
            found.append((run, events))
        return found

    found, problem = await _guarded(probe, "commit log", run_id, revisions)
    if problem is not None:
        return problem
    try:
        problems = log_problems(found, head)  # compares revisions: decodes what they hold
    except CorruptCheckpoint as exc:
        return Finding("commit log", run_id, DAMAGED, str(exc))
    if problems:
        return Finding("commit log", run_id, DAMAGED, "; ".join(problems[:3]))
    last = found[-1][0]
    detail = (
        f"revisions 0-{last.revision} decode, contiguous; events seq 0-{last.event_count - 1}"
        f" contiguous, event_count {last.event_count}; every commit a declared transition"
    )
    return Finding("commit log", run_id, OK, detail)


def log_problems(revisions: list[tuple[Run, list[Event]]], head: Run | None) -> list[str]:
    """What is wrong with a run's history: every revision with its commit's events,
    oldest first (empty: nothing)."""
    if not revisions:
        return ["no revisions"]
    problems: list[str] = []
    runs = [run for run, _ in revisions]
    if [r.revision for r in runs] != list(range(len(runs))):
        problems.append("revisions are not contiguous from 0")
    events = [e for _, batch in revisions for e in batch]
    seqs = [e.seq for e in events]
    if seqs != list(range(len(events))):
        gap = next(i for i, s in enumerate([*seqs, -1]) if s != i)
        problems.append(f"event seq is not contiguous: {gap} missing or out of place")
    for run, batch in revisions:
        wrong = [e.seq for e in batch if e.revision != run.revision]
        if wrong:
            problems.append(f"events {wrong[:3]} of revision {run.revision} name another")
    first, first_events = revisions[0]
    if first.event_count != len(first_events):
        problems.append(
            f"revision 0 has event_count {first.event_count}, {len(first_events)} events"
        )
    for (before, _), (after, batch) in itertools.pairwise(revisions):
        problems += _commit_problems(before, after, batch)
    if head is not None and head.revision != runs[-1].revision:
        problems.append(f"the head is at revision {head.revision}, its log at {runs[-1].revision}")
    elif head is not None and head != runs[-1]:
        problems.append(f"the head differs from revision {head.revision} of its log")
    return problems


def _commit_problems(before: Run, after: Run, batch: list[Event]) -> list[str]:
    at = f"revision {after.revision}"
    if after.state not in STATE_IDS:
        return [f"{at} is in an undeclared state {after.state!r}"]
    if not batch:
        return [f"{at} committed no events"]
    if after.event_count - before.event_count != len(batch):
        grown = after.event_count - before.event_count
        return [f"{at}: event_count grew by {grown} for {len(batch)} events"]
    steps = transitions_of(before.state, batch)
    if not steps:
        if not {e.type for e in batch} <= DATA_EVENTS:
            return [f"{at}: events {sorted({e.type for e in batch})} are no transition"]
        if after.state != before.state:
            return [f"{at}: a data-only commit moved {before.state} to {after.state}"]
        return []
    for step in steps:
        if step not in DECLARED:
            return [f"{at}: {step[2]} from {step[0]} to {step[1]} is not a declared transition"]
    if steps[-1][1] != after.state:
        return [f"{at} is {after.state}, its events end in {steps[-1][1]}"]
    return []


def lease_finding(run_id: str, lease: LeaseView | None) -> Finding:
    """The ``lease`` finding of a run."""
    if lease is None:
        return Finding("lease", run_id, OK, "never leased")
    if lease.owner is None:
        return Finding("lease", run_id, OK, f"free (last fencing token {lease.token})")
    held = f"held by {lease.owner} (fencing token {lease.token})"
    left: Status = WARNING
    if lease.expires_in is None:
        detail = f"{held}, with no expiry: the run stays busy until its owner releases it"
        return Finding("lease", run_id, left, detail)
    if lease.expires_in <= 0:
        detail = (
            f"{held}, expired {-lease.expires_in:.0f} s ago without being released (its owner"
            " stopped or stalled): the next drive takes the run over"
        )
        if lease.alive:
            detail += "; its process still holds its owner lock"
        return Finding("lease", run_id, left, detail)
    if lease.alive is False:
        detail = (
            f"{held}, whose process is gone (its owner lock is free): the next drive takes"
            " the run over at once"
        )
        return Finding("lease", run_id, left, detail)
    alive = ", its process alive" if lease.alive else ""
    detail = f"{held}{alive}; expires in {lease.expires_in:.1f} s unless renewed"
    return Finding("lease", run_id, OK, detail)


def open_probe(url: str) -> Probe:
    """The probe for a store URL. An unknown scheme is a ``ConfigError``; a SQLite file
    or file-store folder that does not exist is a ``StoreError`` naming its path (the
    doctor never creates a store)."""
    probe: Probe = backend(url, "probe")(url)
    return probe
