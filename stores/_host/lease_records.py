"""How a stored lease record is read: checked, so that a damaged one is a
``CorruptCheckpoint`` naming its run and the record, never a ``ValueError`` or a
``UnicodeDecodeError`` on every drive.

Only the reading lives here. Who may take a lease, and when it ends, is decided by
``owners`` (memory, file and SQLite stores) and by the Redis store's scripts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from statekernel.errors import CorruptCheckpoint
from statekernel.stores._host.owners import LeaseRecord

__all__ = ["damaged_lease", "host_record", "kept_record", "redis_holder"]

_REDIS_VALUE = re.compile(r"[0-9]{1,20}/(.*)", re.DOTALL)


def damaged_lease(run_id: str, where: str, detail: str) -> CorruptCheckpoint:
    """The error for a run's lease record that cannot be read."""
    return CorruptCheckpoint(f"damaged lease record of run {run_id!r} in {where}: {detail}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def host_record(values: Sequence[Any], run_id: str, where: str) -> LeaseRecord:
    """The lease record a file or SQLite store keeps as (token, owner, expires): a
    token that is an int, an owner that is a string or None (released), an expiry in
    seconds that is a finite number."""
    if len(values) == 3:
        token, owner, expires = values
        if (
            type(token) is int
            and token >= 0
            and (owner is None or type(owner) is str)
            and type(expires) in (int, float)
            and math.isfinite(expires)
        ):
            return LeaseRecord(token, owner, float(expires))
    raise damaged_lease(
        run_id, where, f"it holds {_shown(tuple(values))}, not (token, owner, expiry)"
    )


def kept_record(
    record: LeaseRecord | None, run_id: str, where: str, *, expected: bool
) -> LeaseRecord | None:
    """``record``, the run's lease record as a fenced commit reads it. A store on one
    host keeps a run's record once a lease was taken (a release keeps its last token):
    with ``expected`` (the run is stored at the revision the lease holder expects, so
    it was not deleted meanwhile) a missing record is damage, not a lost lease."""
    if record is None and expected:
        raise damaged_lease(run_id, where, "it is missing, though a lease on the run was taken")
    return record


def redis_holder(value: bytes | str, run_id: str, where: str) -> tuple[str, str]:
    """(token, owner) of a Redis lease value ``<counter>/<owner>``."""
    try:
        text = value.decode("utf-8") if isinstance(value, bytes) else value
    except UnicodeDecodeError:
        text = None
    found = None if text is None else _REDIS_VALUE.fullmatch(text)
    if text is None or found is None:
        raise damaged_lease(run_id, where, f"it holds {_shown(value)}, not '<token>/<owner>'")
    return text, found.group(1)
