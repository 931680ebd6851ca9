"""The Redis store's run index, kept right when a client dies between its two steps.

The index ``<prefix>:runs`` (a sorted set of run ids by ``updated_at`` in
microseconds) lives outside the runs' hash slots, so the commit script cannot
update it. Instead each commit is *announced* first in ``<prefix>:runs:pending``
(run id -> revision, only ever raised), in the same round trip as the commit
script; once the commit landed, the index is moved and the announcement settled
(removed if no later one replaced it), in the round trip of the client's next
commit or listing, or when it closes. A client killed in between leaves the
announcement behind, and every listing first repairs the announced runs from
their heads, which are the truth. So a committed run is never missing from a
listing nor listed with a stale time, whatever happened to its writer.

Tags are indexed the same way: ``<prefix>:tag:<key>=<value>`` is the set of the runs
that carry that tag. A commit that gives a run tags adds the run to their sets with its
index move; a repair adds an announced run to the sets of its head's tags. The sets are
only ever added to (a set a commit took a run's tag from keeps the run: removing it
could race a later commit that gives the tag back, whose move may come first), so they
hold every run that carries a tag and perhaps runs that carried it: a listing by tags
reads the candidates from the sets and keeps those whose head (the truth) carries every
pair. Deleting a run takes it out of the sets of every tag its head carried.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import NoScriptError

from statekernel.stores.redis._fencing import AnyRedis
from statekernel.stores.redis._wire import Command, Wire

__all__ = ["SETTLE_SCRIPT", "Pairs", "RunIndex", "execute_pipeline"]

SETTLE_SCRIPT = """
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) <= tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
"""
"""Remove the announcement of a run if it is for ``ARGV[2]`` or an earlier revision."""

Call = Callable[[Awaitable[Any]], Awaitable[Any]]
Pairs = frozenset[tuple[str, str]]
"""A run's tags as (key, value) pairs."""
HeadOf = Callable[[list[str]], Awaitable[list[tuple[int, int, Pairs] | None]]]
Move = tuple[int, int, Pairs]
"""An index move of a run: its score, its revision, the tags whose sets it joins."""


class RunIndex:
    """The run index and the pending announcements of one key prefix."""

    def __init__(self, client: AnyRedis, prefix: str, call: Call, wire: Wire) -> None:
        self.client = client
        self.wire = wire
        self.key = f"{prefix}:runs"
        self.pending = f"{prefix}:runs:pending"
        self.tags = f"{prefix}:tag:"
        self._call = call
        self._settle = client.register_script(SETTLE_SCRIPT)
        self._landed: dict[str, Move] = {}

    def tag_key(self, key: str, value: str) -> str:
        """The set of the runs that carry the tag ``key=value``."""
        return f"{self.tags}{key}={value}"

    def take_moves(self, commands: list[Command]) -> dict[str, Move]:
        """Add to ``commands`` the index moves of the commits that landed since the last
        round trip; returned: their results go to ``settled``."""
        taken, self._landed = self._landed, {}
        commands += self._moves(taken)
        return taken

    def announcement(self, run_id: str, revision: int) -> Command:
        """The announcement of a commit, sent before its commit script."""
        return ("ZADD", self.pending, "GT", revision, run_id)

    def _moves(self, moves: dict[str, Move]) -> list[Command]:
        """Per run: its index entry at its update time and its tags' sets, then its
        announcement settled."""
        commands: list[Command] = []
        for run_id, (score, revision, pairs) in moves.items():
            commands.append(("ZADD", self.key, "GT", score, run_id))
            commands += [("SADD", self.tag_key(k, v), run_id) for k, v in sorted(pairs)]
            commands.append(("EVALSHA", self._settle.sha, 1, self.pending, run_id, revision))
        return commands

    def landed(self, run_id: str, score: int, revision: int, pairs: Pairs = frozenset()) -> None:
        """Note a commit that landed: its index move goes with the next round trip (with
        the sets of ``pairs`` to join, and those of the moves of the run not sent yet)."""
        before = self._landed.get(run_id)
        self._landed[run_id] = (score, revision, pairs if before is None else before[2] | pairs)

    async def settled(
        self, taken: dict[str, Move], results: list[Any], *, quiet: bool = False
    ) -> None:
        """Check the results of the index moves of ``taken``; failed ones are kept for
        the next round trip (``quiet``: without raising, as a commit that landed must
        not be reported as failed)."""
        errors = [r for r in results if isinstance(r, Exception)]
        if not errors:
            return
        for run_id, move in taken.items():
            self._landed.setdefault(run_id, move)
        if not all(isinstance(e, NoScriptError) for e in errors) and not quiet:
            await self._call(_raise(errors[0]))
        await self._call(self.client.script_load(SETTLE_SCRIPT))

    async def flush(self) -> None:
        """Send the index moves of commits that landed (before a listing, when closing)."""
        if self._landed:
            taken, self._landed = self._landed, {}
            results = await self._call(self.wire.round_trip(self._moves(taken)))
            await self.settled(taken, results)

    def forget_landed(self, run_id: str) -> None:
        """Drop the index move of a run that is being deleted."""
        self._landed.pop(run_id, None)

    async def repair(self, heads: HeadOf) -> None:
        """Bring every announced run into the index from its head, then settle it.

        ``heads(run_ids)`` gives each run's (revision, update score), None when
        the run does not exist (yet): its announcement stays until it does.
        """
        await self.flush()
        pending: list[Any] = await self._call(self.client.zrange(self.pending, 0, -1))
        if not pending:
            return
        run_ids = [m.decode() if isinstance(m, bytes) else str(m) for m in pending]
        found = await heads(run_ids)
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            for run_id, head in zip(run_ids, found, strict=True):
                if head is not None:
                    pipe.zadd(self.key, {run_id: head[1]}, gt=True)
                    for key, value in sorted(head[2]):
                        pipe.sadd(self.tag_key(key, value), run_id)
                    pipe.execute_command(
                        "EVALSHA", self._settle.sha, 1, self.pending, run_id, head[0]
                    )
            if not len(pipe) or await self._run(pipe):
                return

    async def forget(self, run_id: str, pairs: Pairs = frozenset()) -> None:
        """Remove a deleted run from the index, its announcements and the sets of
        ``pairs`` (the tags its head carried)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.key, run_id)
        pipe.zrem(self.pending, run_id)
        for key, value in sorted(pairs):
            pipe.srem(self.tag_key(key, value), run_id)
        await self._call(pipe.execute())

    async def tagged(self, tags: dict[str, str]) -> set[str]:
        """The runs in the sets of every pair of ``tags`` (candidates: their heads say
        whether they carry the tags still)."""
        pipe = self.client.pipeline(transaction=False)
        for key, value in tags.items():
            pipe.smembers(self.tag_key(key, value))
        found: list[Any] = await self._call(pipe.execute())
        members = [{m.decode() if isinstance(m, bytes) else str(m) for m in s} for s in found]
        return set.intersection(*members) if members else set()

    async def _run(self, pipe: Any) -> bool:
        """Execute ``pipe``; False (after loading it) when the server lost the script."""
        if await self._call(execute_pipeline(pipe)) is not None:
            return True
        await self._call(self.client.script_load(SETTLE_SCRIPT))
        return False


async def _raise(exc: Exception) -> None:
    raise exc


async def execute_pipeline(pipe: Any) -> list[Any] | None:
    """The results of a pipeline; None when a script in it was unknown to the server
    (after a restart or ``SCRIPT FLUSH``: load it and execute again)."""
    try:
        results: list[Any] = await pipe.execute()
    except NoScriptError:
        return None
    return results
