"""``statekernel runs resume RUN --limit NAME=VALUE``: a run paused with ``limit_reached``
has the named limits raised, its others kept, and goes on; a bad name or value is a usage
error naming it, and changes nothing (click's runner, on a SQLite store)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner, Result

import statekernel as sk
from statekernel._cli.main import cli
from statekernel._front.limits import (
    limit_is_float,
    limit_names,
    parse_limit,
    raised_limits,
    suggested_limit,
)
from statekernel.errors import InvalidArgument
from statekernel.pauses import LimitReached
from statekernel.testing import ScriptedProvider

from .limits_agent import kernel_options

HERE = Path(__file__).resolve().parent
AGENT = "limits_agent:kernel_options"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A SQLite store holding run ``capped``, paused at its limit of one tool call (its
    token limit far off); the agent's module importable by name (``--agent``)."""
    monkeypatch.syspath_prepend(str(HERE))
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def pause() -> None:
        async with sk.Kernel(url, **kernel_options()) as kernel:
            limits = sk.Limits(tool_calls=1, total_tokens=1_000)
            await kernel.start(model="scripted/m", messages=["go"], run_id="capped", limits=limits)
            async for _ in kernel.run("capped"):
                pass

    asyncio.run(pause())
    return url


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"STATEKERNEL_STORE": None, "COLUMNS": "200"})


def load(url: str) -> sk.Run:
    async def get() -> sk.Run:
        async with sk.Kernel(url, providers={"scripted": ScriptedProvider([])}) as k:
            return await k.get("capped")

    return asyncio.run(get())


def test_a_raised_limit_lets_the_run_go_on_and_keeps_the_others(store: str) -> None:
    paused = load(store)
    assert paused.pause is not None
    assert paused.pause.details == LimitReached("tool_calls", 1, 1)
    shown = invoke("runs", "list", "--store", store)
    assert "limit_reached: tool_calls used 1 of 1" in shown.output
    details = invoke("runs", "show", "capped", "--store", store)
    assert "total_tokens=1000 tool_calls=1 (tool calls 1)" in details.output
    done = invoke(
        "runs", "resume", "capped", "--limit", "tool_calls=5", "--store", store, "--agent", AGENT
    )
    assert done.exit_code == 0, (done.output, done.stderr)
    assert "limits of run capped: total_tokens=1000 tool_calls=5" in done.output
    run = load(store)
    assert run.state == "completed"
    assert run.limits == sk.Limits(tool_calls=5, total_tokens=1_000)
    assert run.output == "done"
    assert run.tool_calls_started == 2


def test_the_pause_says_how_to_raise_the_limit(store: str) -> None:
    done = invoke("runs", "resume", "capped", "--store", store, "--agent", AGENT)
    assert done.exit_code == 0, (done.output, done.stderr)  # resumed as it was: paused again
    assert load(store).pause is not None
    said = " ".join(done.output.split())
    hint = "statekernel runs resume capped --limit tool_calls=2"
    assert f"tool_calls used 1 of 1; raise it: {hint} --store {store} --agent {AGENT}" in said


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("budget=3", "no limit 'budget': a limit is one of input_tokens, output_tokens"),
        ("tool_calls=1.5", "'1.5' is not a whole number"),
        ("tool_calls=-1", "'-1' is not a whole number"),
        ("tool_calls=lots", "'lots' is not a whole number"),
        ("tool_calls", "must look like NAME=VALUE"),
    ],
)
def test_a_bad_limit_is_a_usage_error_naming_it(store: str, given: str, says: str) -> None:
    before = load(store)
    done = invoke("runs", "resume", "capped", "--limit", given, "--store", store, "--agent", AGENT)
    assert done.exit_code == 2, (done.output, done.stderr)
    assert "Invalid value for --limit" in done.stderr
    assert says in done.stderr
    assert given.partition("=")[0] in done.stderr
    assert load(store) == before


def test_a_limit_given_twice_or_not_above_what_was_used_is_refused(store: str) -> None:
    before = load(store)
    twice = invoke(
        "runs",
        "resume",
        "capped",
        "--limit",
        "tool_calls=3",
        "--limit",
        "tool_calls=4",
        "--store",
        store,
    )
    assert twice.exit_code == 2
    assert "tool_calls is given twice, 3 and 4" in twice.stderr
    low = invoke(
        "runs", "resume", "capped", "--limit", "tool_calls=1", "--store", store, "--agent", AGENT
    )
    assert low.exit_code == 2
    assert "has used 1 of limit tool_calls: a limit of 1 pauses it again at once" in low.stderr
    assert load(store) == before


def test_a_limit_is_refused_for_a_run_that_is_not_paused(store: str) -> None:
    ok = invoke(
        "runs", "resume", "capped", "--limit", "tool_calls=9", "--store", store, "--agent", AGENT
    )
    assert ok.exit_code == 0, ok.stderr
    again = invoke(
        "runs", "resume", "capped", "--limit", "tool_calls=10", "--store", store, "--agent", AGENT
    )
    assert again.exit_code == 2
    assert "completed" in again.stderr


def test_a_float_limit_takes_a_number_and_the_others_whole_ones() -> None:
    assert limit_names() == tuple(f.name for f in attrs.fields(sk.Limits))
    assert not any(limit_is_float(name) for name in ("input_tokens", "tool_calls"))
    assert limit_is_float("cost")
    assert parse_limit("cost=2.5") == ("cost", 2.5)
    assert parse_limit("cost=3") == ("cost", 3.0)
    assert type(parse_limit("cost=3")[1]) is float
    assert parse_limit("tool_calls=3") == ("tool_calls", 3)
    for bad in ("cost=nan", "cost=inf", "cost=-1", "cost=", "tool_calls=3.0"):
        with pytest.raises(InvalidArgument):
            parse_limit(bad)
    assert suggested_limit(LimitReached("tool_calls", 7, 3)) == 8
    assert suggested_limit(LimitReached("cost", 0.31, 0.3)) == pytest.approx(1.31)
    assert raised_limits(sk.Limits(tool_calls=2), {"cost": 1.5}) == sk.Limits(
        tool_calls=2, cost=1.5
    )
    assert raised_limits(None, {"tool_calls": 4}) == sk.Limits(tool_calls=4)
    with pytest.raises(InvalidArgument, match="no limit 'budget'"):
        raised_limits(sk.Limits(tool_calls=1), {"budget": 1})
