"""Interactive tools: a tool call that asks the user, and the answer as its result.

A tool raises ``NeedsInput(question, schema=...)`` (a tool made by ``ask_user`` does
nothing else). Its intent was committed before it started, like any call's; when it
asks, the run pauses with reason ``input_required`` as soon as no other call of the turn
is running, the question in the pause's details. ``kernel.resume(run_id,
value=answer)`` checks the answer against the schema and commits in one commit the
resume and the answer as the call's result (and, when several calls of the turn asked,
the pause for the next question).

Where a crash can land: before the pause commits, the asking call is in flight with no
result, as after any crash inside a call: an idempotent tool runs again (an
``ask_user`` tool is idempotent: it asks again), any other pauses the run with
``uncertain_tool_calls``. After the pause commits, the question waits in the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

from statekernel._kernel.schema import schema_problem, schema_violation
from statekernel._kernel.tools import Tool, tool
from statekernel._records.messages import JSON
from statekernel._records.pauses import Ask, Question, make_timer
from statekernel._records.values import as_stored
from statekernel.errors import ConfigError, InvalidArgument

__all__ = ["NeedsInput", "answered", "ask_user", "asked", "questions", "sleep_until"]


class NeedsInput(Exception):
    """Raise from a tool to ask the user; the answer becomes the call's result.

    ``question`` (JSON: a string, or an object a user interface renders) is stored in
    the pause's metadata; ``schema`` (a JSON Schema) is what an answer must satisfy
    (none: any JSON value). A question that is not JSON, or a schema that cannot check
    answers (invalid, or a ``$ref`` that resolves nowhere), is not asked: the call gets
    an error result saying why.

    ``timeout`` (seconds from now) or ``until`` (an aware datetime): the question stops
    waiting then, with nobody watching, and ``on_timeout`` is taken as its answer (it
    must satisfy ``schema``), or the run fails with ``PauseTimedOut`` for
    ``on_timeout=FAIL``. A timeout that is not one is an error result for the call.
    """

    def __init__(
        self,
        question: JSON,
        *,
        schema: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        until: datetime | None = None,
        on_timeout: JSON = None,
    ) -> None:
        super().__init__(question)
        self.question = question
        self.schema = schema
        self.timeout, self.until, self.on_timeout = timeout, until, on_timeout


def asked(request: NeedsInput) -> tuple[dict[str, Any] | None, str | None]:
    """The stored form of what a tool asked (question and schema), or why it cannot be
    stored (then the call gets an error result)."""
    question, problem = as_stored(request.question, "question")
    if problem is not None:
        return None, f"the tool asked a question that is not JSON: {problem}"
    doc: dict[str, Any] = {"question": question}
    if request.schema is not None:
        problem = schema_problem(request.schema)
        if problem is not None:
            return None, f"the tool asked with a schema that is {problem}"
        doc["schema"], _ = as_stored(request.schema, "schema")
    try:
        timer = make_timer(request.timeout, request.until, request.on_timeout, what="the question")
    except InvalidArgument as exc:
        return None, f"the tool asked with {exc}"
    if timer is not None and not timer.fail and request.schema is not None:
        violation = schema_violation(doc["schema"], timer.value)
        if violation is not None:
            return None, f"the tool asked with an on_timeout answer{violation[0]}: {violation[1]}"
    if timer is not None:
        doc["timer"] = timer
    return doc, None


def questions(waiting: Sequence[tuple[Sequence[str], str, Mapping[str, Any]]]) -> Question:
    """The pause's details for calls that asked (ids, tool name, what ``asked`` stored),
    in call order: the first is the question now asked, the rest wait behind it."""
    return Question(
        tuple(
            Ask(tuple(ids), name, doc.get("question"), doc.get("schema"), doc.get("timer"))
            for ids, name, doc in waiting
        )
    )


def answered(question: Question, value: JSON) -> tuple[list[str], str | None, Question | None]:
    """The calls ``value`` answers, the error result they get instead of ``value`` (None:
    ``value`` is their result), and the details of the next question's pause (None: none
    waits). ``InvalidArgument`` naming what is wrong if ``value`` does not satisfy the
    question's schema. A stored schema that cannot check answers (a question asked before
    schemas were checked when asked) never blocks the answer: the calls get an error
    result saying so, which the model reads."""
    ask = question.asked
    schema = ask.schema
    error = None
    problem = schema_problem(schema) if schema is not None else None
    if problem is not None:
        error = f"the question's schema is {problem}: the answer could not be checked"
    violation = schema_violation(schema, value) if schema is not None and error is None else None
    if violation is not None:
        where, why = violation
        raise InvalidArgument(
            f"answer{where} to {ask.name!r} ({ask.calls[0]!r}) does not"
            f" satisfy the question's schema: {why}"
        )
    rest = question.asks[1:]
    return list(ask.calls), error, (Question(rest) if rest else None)


def ask_user(
    name: str = "ask_user",
    description: str = "Ask the user a question and wait for the answer.",
    *,
    answer_schema: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    on_timeout: JSON = None,
) -> Tool:
    """A tool the model calls to ask the user something: the run pauses with reason
    ``input_required`` and the question; the answer given to ``kernel.resume(run_id,
    value=...)`` (checked against ``answer_schema``) is the call's result. It is
    idempotent: after a crash before its pause was committed, it asks again. An
    ``answer_schema`` that cannot check answers (see ``schema_problem``) raises
    ``ConfigError``.

    ``timeout``: seconds a question waits; then ``on_timeout`` is its answer (checked
    against ``answer_schema``) or, for ``on_timeout=FAIL``, the run fails with
    ``PauseTimedOut`` (see ``NeedsInput``), whether or not any process is running.

    Returns:
        The tool, taking one ``question`` argument.

    Raises:
        ConfigError: ``answer_schema`` is not a JSON schema that can check answers.
    """

    def ask(question: str) -> JSON:
        raise NeedsInput(question, schema=answer_schema, timeout=timeout, on_timeout=on_timeout)

    ask.__doc__ = f"""{description}

    Args:
        question: The question, as the user should read it.
    """
    if answer_schema is not None:
        problem = schema_problem(answer_schema)
        if problem is not None:
            raise ConfigError(f"tool {name!r}: its answer_schema is {problem}")
    try:  # the timeout and the answer it gives, checked now rather than at each call
        timer = make_timer(timeout, None, on_timeout, what=f"tool {name!r}")
    except InvalidArgument as exc:
        raise ConfigError(str(exc)) from None
    if timer is not None and not timer.fail and answer_schema is not None:
        violation = schema_violation(answer_schema, timer.value)
        if violation is not None:
            raise ConfigError(f"tool {name!r}: on_timeout{violation[0]}: {violation[1]}")
    return tool(name=name, description=description, idempotent=True)(ask)


def sleep_until(when: datetime, result: JSON = "woke up") -> NoReturn:
    """Call from a tool to sleep durably until ``when`` (an aware datetime): the run
    pauses (``input_required``, the question ``{"sleep_until": ...}``) with nobody
    waiting, a worker's timer loop or whoever touches the run next wakes it, and
    ``result`` is the call's result. An answer given before then wakes it early."""
    raise NeedsInput({"sleep_until": when.isoformat()}, until=when, on_timeout=result)
