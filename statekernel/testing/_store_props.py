"""The generated-runs round trip of the store conformance suite (uses Hypothesis)."""

from __future__ import annotations

import functools

import attrs

from statekernel._records.run import Run
from statekernel._storage.protocol import Checkpoint, CheckpointStore

__all__ = ["check_generated_runs"]


@functools.lru_cache(maxsize=4)
def _generate(examples: int) -> tuple[Run, ...]:
    """Generated runs (deterministic, so one list serves every store)."""
    from hypothesis import HealthCheck, given, settings

    from statekernel.testing.strategies import runs

    found: list[Run] = []

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(runs())
    def collect(run: Run) -> None:
        found.append(run)

    collect()
    return tuple(found)


async def check_generated_runs(store: CheckpointStore, examples: int) -> None:
    """Generated runs, grown revision by revision, load back equal at every revision.

    A last revision rewrites the transcript (as a hook may), and the earlier
    revisions must still load as they were.
    """
    from statekernel.testing.strategies import checkpoints_for

    for i, generated in enumerate(_generate(examples)):
        run_id = f"{generated.run_id}#{i}"
        revisions = checkpoints_for(attrs.evolve(generated, run_id=run_id))
        previous: Run | None = None
        for run in revisions:
            await store.commit(Checkpoint.between(previous, run))
            previous = run
        assert previous is not None
        rewritten = attrs.evolve(
            previous, revision=previous.revision + 1, messages=previous.messages[::-1]
        )
        await store.commit(Checkpoint.between(previous, rewritten))
        assert await store.load(run_id) == rewritten, f"generated run {i} at its head"
        for run in revisions:
            got = await store.load(run_id, revision=run.revision)
            assert got == run, f"generated run {i} at revision {run.revision}: {got!r} != {run!r}"
