"""Cancel requests on Redis (``CancelsRuns``): a run's request is the key
``<prefix>:{run}:cancel``, beside its lease in the run's hash slot.

The commit scripts (``_scripts``) read it after the lease and the head: while it is
kept they refuse every commit to the run (status 4: ``CancelRequested``, nothing
written) but the one that carries it out (``Checkpoint.cancels``), which deletes it as
it lands; a new run's creation deletes a key its id kept. ``delete`` removes it with
the run's keys.

The head keeps the run's state in its document, which only Python reads (checksum,
schema upgrades), so ``KEEP_CANCEL_SCRIPT`` keeps a request only while the head is the
document whose state was checked here (its SHA-1, as a commit names the head it
expects): a commit that lands between the check and the script makes the script send
the new head back, and the check runs again on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

from statekernel._records.run import Cancellation
from statekernel.errors import RunNotFound
from statekernel.stores._format.cancels import (
    AT_REST,
    check_cancellable,
    decode_cancel,
    encode_cancel,
)
from statekernel.stores._format.checksum import unseal
from statekernel.stores._format.codec import check_run_id, head_summary
from statekernel.stores._format.documents import load_json
from statekernel.stores.redis._fencing import AnyRedis
from statekernel.stores.redis._replicas import Replication
from statekernel.stores.redis._scripts import KEEP_CANCEL_SCRIPT

__all__ = ["CANCEL_KEY", "CancelRequests"]

CANCEL_KEY = "cancel"
"""The name of a run's cancel request key (``RedisStore.run_key``)."""

Call = Callable[[Awaitable[Any]], Awaitable[Any]]


class CancelRequests:
    """The cancel requests of one store's runs. ``call`` runs a Redis call as the store
    does (``StoreError`` for a failure); ``where`` names the store in errors."""

    def __init__(self, client: AnyRedis, replication: Replication, call: Call, where: str) -> None:
        self._client = client
        self._replication = replication
        self._call = call
        self._where = where
        self._keep = client.register_script(KEEP_CANCEL_SCRIPT)

    async def keep(
        self, run_id: str, keys: list[str], request: Cancellation, seen: bytes | None
    ) -> Cancellation | None:
        """Keep ``request`` for the run whose head and request keys are ``keys`` unless
        a request is kept (returned, unchanged), once the replicas asked for have it.

        ``seen``: the head document as this store last saw it (None: not known), whose
        state is checked first. The same request found kept (this call's own, sent
        again after a cut connection) is kept now: None.

        Raises:
            RunNotFound: no run has the id.
            InvalidTransition: the run is completed or failed (nothing kept).
            StoreError: the storage failed, or the replicas asked for were not confirmed.
        """
        data = encode_cancel(request)
        doc = seen
        while True:
            state = "" if doc is None else self._state(run_id, doc)
            sha = "" if doc is None else hashlib.sha1(doc).hexdigest()
            args: list[Any] = [sha, int(state in AT_REST), data]
            script = self._replication.script(self._keep, keys, args)
            (status, found), short = await self._call(script)
            status, found = int(status), found.encode() if isinstance(found, str) else found
            if status == 0:
                raise RunNotFound(run_id)
            if status == 1:
                return None if found == data else decode_cancel(found, run_id, self._where)
            if status == 2:
                doc = found
                continue
            check_cancellable(run_id, state)  # 3, at rest: raises; 4: kept
            if short is not None:
                what = f"the cancel request of run {run_id!r}"
                raise self._replication.error(what, short)
            return None

    async def kept(self, run_id: str, key: str) -> Cancellation | None:
        """The request kept in ``key`` for the run, or None."""
        found = await self._call(self._client.get(key))
        return None if found is None else decode_cancel(found, run_id, self._where)

    def _state(self, run_id: str, doc: bytes) -> str:
        """The state of the run's head document ``doc`` (``CorruptCheckpoint`` if damaged)."""
        what = f"run {run_id!r} in {self._where}"
        head = load_json(unseal(doc, f"head of {what}"), what)
        check_run_id(head, run_id, what)
        return head_summary(head, what=f"head of {what}").state
