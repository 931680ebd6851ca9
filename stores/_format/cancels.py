"""A run's cancel request as a store keeps it (``CancelsRuns``): one checksummed JSON
document, written and read through the storage converter like every stored record."""

from __future__ import annotations

from statekernel._records.run import Cancellation
from statekernel.errors import CancelRequested, CorruptCheckpoint, InvalidTransition
from statekernel.stores._format.checksum import seal, unseal
from statekernel.stores._format.converter import INLINE, NO_BLOBS, reading, writing
from statekernel.stores._format.documents import dump_bytes, load_json

__all__ = ["AT_REST", "cancel_requested", "check_cancellable", "decode_cancel", "encode_cancel"]

AT_REST = ("completed", "failed")
"""The states of a run that keeps no cancel request: nothing runs in them."""


def encode_cancel(request: Cancellation) -> bytes:
    """``request`` as the bytes a store keeps (its checksum at the end)."""
    if not isinstance(request, Cancellation):
        raise TypeError(f"a cancel request is a Cancellation, not {type(request).__name__}")
    with writing(INLINE) as conv:
        return seal(dump_bytes(conv.unstructure(request)))


def decode_cancel(data: object, run_id: str, where: str) -> Cancellation:
    """The request kept as ``data`` for the run; ``CorruptCheckpoint`` naming the run and
    ``where`` when it is damaged."""
    what = f"cancel request of run {run_id!r} in {where}"
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, bytes):
        raise CorruptCheckpoint(f"invalid {what}: {type(data).__name__}, not bytes")
    doc = load_json(unseal(data, what), what)
    with reading(NO_BLOBS) as conv:
        return conv.load(doc, Cancellation, what)


def cancel_requested(run_id: str, data: object, where: str) -> CancelRequested:
    """The ``CancelRequested`` refusing a commit to the run, naming the request kept as
    ``data`` (a damaged one refuses the commit all the same: ``CorruptCheckpoint``)."""
    request = decode_cancel(data, run_id, where)
    return CancelRequested(run_id, request.reason, request.by)


def check_cancellable(run_id: str, state: str) -> None:
    """``InvalidTransition`` when a run in ``state`` can keep no cancel request."""
    if state in AT_REST:
        raise InvalidTransition("cancel", state, f"run {run_id!r} is {state}: nothing runs")
