"""The one exception tree of statekernel.

Every error the library raises on purpose derives from :class:`StatekernelError`.
Errors from sqlite3, redis and httpx are re-raised as one of these, ``from`` the
original, so callers never need to catch a driver's exception types.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationFailed",
    "BadRequest",
    "CancelRequested",
    "ConfigError",
    "ConflictError",
    "CorruptCheckpoint",
    "DeadlineExceeded",
    "InvalidArgument",
    "InvalidTag",
    "InvalidTransition",
    "LeaseLost",
    "OutputInvalid",
    "PauseTimedOut",
    "ProviderError",
    "ProviderUnavailable",
    "RateLimited",
    "RunBusy",
    "RunCancelled",
    "RunFailed",
    "RunHasChildren",
    "RunNotFound",
    "StatekernelError",
    "StoreError",
    "ToolError",
]


class StatekernelError(Exception):
    """Base class of every error statekernel raises."""


class ConflictError(StatekernelError):
    """A commit expected a revision that is no longer the head of the run.

    Another writer committed first; this writer must stop (reload to continue).
    """

    def __init__(self, run_id: str, expected: int, actual: int | None) -> None:
        self.run_id = run_id
        self.expected = expected
        self.actual = actual
        found = "no run" if actual is None else f"revision {actual}"
        if expected == -1 and actual is not None:  # a new run whose id is taken
            super().__init__(
                f"run {run_id!r} already exists (at revision {actual}): "
                "choose another run id, or resume or send to that run"
            )
            return
        super().__init__(f"run {run_id!r}: commit expected revision {expected}, store has {found}")


class LeaseLost(ConflictError):
    """A fenced commit was refused: the committer's lease on the run expired or passed to
    another worker (its fencing token is no longer the run's current one).

    The committer must stop driving the run: another worker owns it now.
    """

    def __init__(self, run_id: str, expected: int, token: str = "") -> None:
        self.run_id = run_id
        self.expected = expected
        self.actual = None
        self.token = token
        why = f"lease {token!r} is no longer held" if token else "no lease is held"
        StatekernelError.__init__(
            self, f"run {run_id!r}: commit at revision {expected + 1} refused: {why}"
        )


class RunBusy(StatekernelError):
    """Another live drive owns the run: its owner holds the run's lease.

    Raised after waiting ``waited`` seconds (the kernel's ``busy_timeout``) for the
    owner to finish. The owner's in-flight calls are its own, not crash remnants.
    """

    def __init__(self, run_id: str, owner: str, waited: float = 0.0) -> None:
        self.run_id = run_id
        self.owner = owner
        self.waited = waited
        super().__init__(
            f"run {run_id!r} is driven by {owner} (waited {waited:.1f} s for it to finish)"
        )


class CancelRequested(StatekernelError):
    """A commit was refused because someone asked to cancel the run (``Kernel.cancel``):
    the store keeps the request, and only the commit that carries it out (the run
    failed with ``Cancelled``) may land. Nothing was written.

    The kernel's drives handle it: they stop the run's calls and commit the cancellation.
    A command (``send``, ``resume``...) that meets it fails with it: the run is being
    cancelled.
    """

    def __init__(self, run_id: str, reason: str = "", by: str = "") -> None:
        self.run_id = run_id
        self.reason = reason
        self.by = by
        who = f" by {by}" if by else ""
        why = f": {reason}" if reason else ""
        super().__init__(f"run {run_id!r} is being cancelled{who}{why}")


class CorruptCheckpoint(StatekernelError):
    """Stored data cannot be read back as a valid record (garbled, truncated, unknown version)."""


class RunNotFound(StatekernelError, LookupError):
    """No run with this id (or not at the requested revision) exists in the store."""

    def __init__(self, run_id: str, detail: str = "") -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} not found" + (f": {detail}" if detail else ""))


class RunHasChildren(StatekernelError):
    """A run to delete has child runs and deleting them too was not asked for."""

    def __init__(self, run_id: str, children: list[str]) -> None:
        self.run_id = run_id
        self.children = children
        shown = ", ".join(children[:5]) + (" ..." if len(children) > 5 else "")
        super().__init__(
            f"run {run_id!r} has {len(children)} child run(s) ({shown}): delete them too"
            " with children=True (--with-children)"
        )


class InvalidTransition(StatekernelError):
    """An event was sent that the run's lifecycle does not allow in its current state.

    On a failed run ``detail`` names the failure and says that ``retry`` resumes it; on a
    completed run, that ``send`` gives it new input.
    """

    def __init__(self, event: str, state: str, detail: str = "") -> None:
        self.event = event
        self.state = state
        self.detail = detail
        msg = f"event {event!r} is not allowed in state {state!r}"
        super().__init__(msg + (f": {detail}" if detail else ""))


class RunFailed(StatekernelError):
    """A drive asked to raise on failure (``kernel.run(..., raise_on_failure=True)``,
    ``kernel.step``) ended with the run ``failed``; the failure is committed.

    ``error`` and ``message`` are the failure's (``Run.failure``), ``failed_in`` the state
    ``kernel.retry`` returns the run to, ``revision`` the commit that holds it.
    """

    def __init__(
        self, run_id: str, error: str, message: str, failed_in: str, revision: int
    ) -> None:
        self.run_id = run_id
        self.error = error
        self.message = message
        self.failed_in = failed_in
        self.revision = revision
        said = message if len(message) <= 300 else message[:299] + "…"
        super().__init__(
            f"run {run_id!r} failed in {failed_in} (revision {revision}): {error}: {said};"
            " kernel.retry(run_id) returns it to where it failed"
        )


class RunCancelled(RunFailed):
    """``RunFailed`` for a run stopped by ``Kernel.cancel``: ``error`` is ``"Cancelled"``,
    ``message`` the reason, ``by`` who asked for it."""

    def __init__(
        self, run_id: str, message: str, failed_in: str, revision: int, by: str = ""
    ) -> None:
        super().__init__(run_id, "Cancelled", message, failed_in, revision)
        self.by = by


class DeadlineExceeded(RunFailed):
    """``RunFailed`` for a run stopped because its deadline passed
    (``start(deadline=|timeout=)``): ``error`` is ``"DeadlineExceeded"``."""

    def __init__(self, run_id: str, message: str, failed_in: str, revision: int) -> None:
        super().__init__(run_id, "DeadlineExceeded", message, failed_in, revision)


class OutputInvalid(RunFailed):
    """``RunFailed`` for a run whose final answer did not satisfy its output type
    (``start(output_type=...)``) in the answers its ``output_retries`` allow: ``error``
    is ``"OutputInvalid"``, ``message`` what was wrong with the last one."""

    def __init__(self, run_id: str, message: str, failed_in: str, revision: int) -> None:
        super().__init__(run_id, "OutputInvalid", message, failed_in, revision)


class PauseTimedOut(RunFailed):
    """``RunFailed`` for a run whose pause timed out with ``on_timeout=FAIL``
    (``Pause(timeout=|until=)``, ``ask_user(timeout=)``): ``error`` is
    ``"PauseTimedOut"``; ``retry`` returns it to its pause, which then waits without a
    timer."""

    def __init__(self, run_id: str, message: str, failed_in: str, revision: int) -> None:
        super().__init__(run_id, "PauseTimedOut", message, failed_in, revision)


class InvalidArgument(StatekernelError, ValueError):
    """A caller passed a value the API cannot accept (bad run id, conflicting options...)."""


class InvalidTag(InvalidArgument):
    """A run's tags break a rule (``Kernel.start(tags=)``, ``Kernel.update_tags``,
    ``list_runs(tags=)``): a key not matching ``[A-Za-z0-9_.:-]{1,64}``, a value that is
    not a string of at most 256 characters, or more than 32 tags. ``key`` names the
    offending tag (None when the tags as a whole are wrong: too many, not a mapping)."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class StoreError(StatekernelError):
    """A checkpoint store could not be reached, opened or written."""


class ConfigError(StatekernelError):
    """Configuration (store URL, provider settings, model string) is invalid."""


class ToolError(StatekernelError):
    """Raised by a tool (or middleware) to report a failure as an error result to the model."""


class ProviderError(StatekernelError):
    """A model provider failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None, provider: str = "") -> None:
        self.status = status
        self.provider = provider
        super().__init__(message)


class RateLimited(ProviderError):
    """The provider refused the request for rate or quota reasons (HTTP 429)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = 429,
        provider: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.retry_after = retry_after
        super().__init__(message, status=status, provider=provider)


class AuthenticationFailed(ProviderError):
    """The provider rejected the credentials (HTTP 401/403)."""


class BadRequest(ProviderError):
    """The provider rejected the request as malformed (HTTP 400/404/422); retrying will not help."""


class ProviderUnavailable(ProviderError):
    """The provider is down, overloaded or unreachable (5xx, overload, connection errors)."""
