"""``statekernel runs ...`` through the installed console script, on a SQLite store."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statekernel._lifecycle.diagram import can_render_svg

EXE = shutil.which("statekernel")
pytestmark = pytest.mark.skipif(
    EXE is None, reason="the statekernel console script is not installed"
)


def sk(
    *args: str, cwd: Path, timeout: float = 60, preexec: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the console script with ``args`` in ``cwd``, capturing its output."""
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    env.update(COLUMNS="200", NO_COLOR="1")
    return subprocess.run(
        [str(EXE), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store holding two completed demo runs and one stopped mid-run."""
    cwd = tmp_path_factory.mktemp("runs")
    store = f"sqlite:///{cwd / 'runs.db'}"
    for run_id in ("run-a", "run-b"):
        ok(sk("demo", "--model", "scripted/demo", "--store", store, "--run-id", run_id, cwd=cwd))
    sk(
        "demo", "--model", "scripted/demo", "--store", store, "--run-id", "run-c",
        "--crash-after", "model_completed", cwd=cwd,
    )  # fmt: skip
    return cwd, store


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(done))


def test_list(work: tuple[Path, str]) -> None:
    cwd, store = work
    rows = as_json(sk("runs", "list", "--store", store, "--json", cwd=cwd))
    assert {r["run_id"]: r["state"] for r in rows} == {
        "run-a": "completed",
        "run-b": "completed",
        "run-c": "dispatching_tools",
    }
    assert rows[0]["run_id"] == "run-c"  # newest update first
    table = ok(sk("runs", "list", "--store", store, cwd=cwd))
    for word in ("run id", "state", "turns", "model", "updated", "run-a", "scripted/demo"):
        assert word in table
    only = as_json(sk("runs", "list", "--state", "completed", "--store", store, "--json", cwd=cwd))
    assert sorted(r["run_id"] for r in only) == ["run-a", "run-b"]
    limited = as_json(sk("runs", "list", "--limit", "1", "--store", store, "--json", cwd=cwd))
    assert len(limited) == 1


def test_show(work: tuple[Path, str]) -> None:
    cwd, store = work
    text = ok(sk("runs", "show", "run-c", "--store", store, cwd=cwd))
    words = ("dispatching_tools", "transcript", "in-flight tool calls", "get_forecast", "usage")
    for word in words:
        assert word in text
    assert '{"demo": 1}' in text
    data = as_json(sk("runs", "show", "run-c", "--store", store, "--json", cwd=cwd))
    # the answer landed with the intent of its call: the crash left the call in flight
    assert data["current_turn"]["in_flight"][0]["name"] == "get_forecast"
    old = as_json(
        sk("runs", "show", "run-a", "--revision", "0", "--store", store, "--json", cwd=cwd)
    )
    assert old["state"] == "init"


def test_events(work: tuple[Path, str]) -> None:
    cwd, store = work
    out = ok(sk("runs", "events", "run-a", "--store", store, "--json", cwd=cwd))
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["type"] == "run_started"
    assert events[-1]["type"] == "run_completed"
    assert [e["seq"] for e in events] == list(range(len(events)))
    later = ok(sk("runs", "events", "run-a", "--after", "2", "--store", store, "--json", cwd=cwd))
    assert later
    assert all(json.loads(line)["revision"] > 2 for line in later.splitlines())
    text = ok(sk("runs", "events", "run-a", "--follow", "--store", store, cwd=cwd, timeout=120))
    assert "run_completed" in text  # --follow stops once the run is at rest


def test_follow_sees_a_run_finish(work: tuple[Path, str]) -> None:
    cwd, store = work
    ok(sk("runs", "fork", "run-c", "--store", store, "--json", cwd=cwd))
    forked = as_json(sk("runs", "list", "--limit", "1", "--store", store, "--json", cwd=cwd))
    run_id = forked[0]["run_id"]
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    follow = subprocess.Popen(
        [
            str(EXE),
            "runs",
            "events",
            run_id,
            "-f",
            "--interval",
            "0.05",
            "--json",
            "--store",
            store,
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    ok(sk("runs", "resume", run_id, "--store", store, cwd=cwd))
    out, _ = follow.communicate(timeout=120)  # it ends by itself when the run completes
    assert follow.returncode == 0
    types = [json.loads(line)["type"] for line in out.splitlines()]
    assert types[0] == "run_forked"
    assert types[-1] == "run_completed"


def test_fork_and_resume(work: tuple[Path, str]) -> None:
    cwd, store = work
    forked = as_json(sk("runs", "fork", "run-a", "--at", "3", "--store", store, "--json", cwd=cwd))
    assert forked["from_run_id"] == "run-a"
    new = forked["run_id"]
    shown = as_json(sk("runs", "show", new, "--store", store, "--json", cwd=cwd))
    assert shown["state"] == "calling_model"
    assert shown["context"] == {"demo": 1}
    ok(sk("runs", "resume", new, "--store", store, cwd=cwd))
    assert as_json(sk("runs", "show", new, "--store", store, "--json", cwd=cwd))["state"] == (
        "completed"
    )


def test_delete(work: tuple[Path, str]) -> None:
    cwd, store = work
    forked = as_json(sk("runs", "fork", "run-b", "--store", store, "--json", cwd=cwd))
    for asked in (["--json"], []):  # nobody can confirm: no terminal, or JSON wanted
        refused = sk("runs", "delete", forked["run_id"], *asked, "--store", store, cwd=cwd)
        assert refused.returncode == 2
        assert "pass --yes" in refused.stderr
    assert ok(sk("runs", "show", forked["run_id"], "--store", store, cwd=cwd))
    out = ok(sk("runs", "delete", forked["run_id"], "--yes", "--store", store, cwd=cwd))
    assert "deleted" in out
    gone = sk("runs", "show", forked["run_id"], "--store", store, cwd=cwd)
    assert gone.returncode == 2


def test_run_diagram(work: tuple[Path, str]) -> None:
    cwd, store = work
    if can_render_svg():
        ok(sk("runs", "diagram", "run-a", "-o", "run-a.svg", "--store", store, cwd=cwd))
        ET.parse(cwd / "run-a.svg")
        svg = ok(sk("runs", "diagram", "run-a", "-o", "-", "--store", store, cwd=cwd))
        assert "<svg" in svg  # '-' writes SVG to stdout
    else:  # SVG needs graphviz: a one-line error, the text formats still work
        no_dot = sk("runs", "diagram", "run-a", "-o", "run-a.svg", "--store", store, cwd=cwd)
        assert no_dot.returncode == 2
        assert "graphviz is not installed" in no_dot.stderr
    ok(sk("runs", "diagram", "run-a", "-o", "run-a.dot", "--store", store, cwd=cwd))
    text = (cwd / "run-a.dot").read_text()
    assert 'completed [label="Completed \u00d71\\n(current)"' in text
    assert 'label="tool_call_started \u00d72"' in text
    assert 'label="turn_prepared \u00d73"' in text
    ok(sk("runs", "diagram", "run-c", "-o", "run-c.mmd", "--store", store, cwd=cwd))
    mermaid = (cwd / "run-c.mmd").read_text()
    assert "class dispatching_tools current" in mermaid
    assert "class failed unvisited" in mermaid
    bad = sk("runs", "diagram", "run-a", "-o", "run-a.png", "--store", store, cwd=cwd)
    assert bad.returncode == 2


AGENT_MODULE = '''
import statekernel as sk
from statekernel.testing import ScriptedProvider, call


@sk.tool
def shout(text: str) -> str:
    """Shout the text."""
    return text.upper()


def kernel_options():
    script = [call("shout", {"text": "hey"}), "done shouting"]
    return {"tools": [shout], "providers": {"scripted": ScriptedProvider(script)}}
'''


def test_resume_an_application_run_with_its_agent(tmp_path: Path) -> None:
    import asyncio
    import sys

    (tmp_path / "my_agent.py").write_text(AGENT_MODULE)
    store = f"sqlite:///{tmp_path / 'app.db'}"
    sys.path.insert(0, str(tmp_path))
    try:
        import my_agent

        async def start_and_stop() -> None:
            import statekernel as statek

            async with statek.Kernel(store, **my_agent.kernel_options()) as kernel:
                await kernel.start(model="scripted/app", messages=["hi"], run_id="app-1")
                while (await kernel.get("app-1")).state != "dispatching_tools":
                    await kernel.step("app-1")

        asyncio.run(start_and_stop())
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_agent", None)

    refused = sk("runs", "resume", "app-1", "--store", store, cwd=tmp_path)
    assert refused.returncode == 2
    assert "shout" in refused.stderr
    assert "--agent" in refused.stderr
    assert "Traceback" not in refused.stderr

    # the module is found in the current directory, without PYTHONPATH
    done = sk(
        "runs", "resume", "app-1", "--agent", "my_agent:kernel_options", "--store", store,
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = as_json(sk("runs", "show", "app-1", "--store", store, "--json", cwd=tmp_path))
    assert shown["state"] == "completed"
    bad = sk(
        "runs", "resume", "app-1", "--agent", "no_such_module:x", "--store", store, cwd=tmp_path
    )
    assert bad.returncode == 2
    assert "cannot load --agent" in bad.stderr


def test_a_damaged_run_is_named_and_the_others_still_listed(tmp_path: Path) -> None:
    import asyncio

    import statekernel as statek
    from statekernel.testing import ScriptedProvider, SQLiteRecords

    store = f"sqlite:///{tmp_path / 'mixed.db'}"

    async def two_runs() -> None:
        kernel = statek.Kernel(store, providers={"scripted": ScriptedProvider(["ok"])})
        async with kernel:
            for run_id in ("good", "bad"):
                await kernel.start(model="scripted/x", messages=["hi"], run_id=run_id)
            raw = SQLiteRecords()
            head = (await raw.read(kernel.store, "bad"))[("head", 0)]
            await raw.write(kernel.store, "bad", ("head", 0), head[:-3] + b"xyz")

    asyncio.run(two_runs())
    listed = sk("runs", "list", "--store", store, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "good" in listed.stdout
    assert "skipped damaged run bad:" in listed.stderr
    rows = as_json(sk("runs", "list", "--json", "--store", store, cwd=tmp_path))
    assert [r["run_id"] for r in rows] == ["good", "bad"]
    assert "damaged" not in rows[0]
    assert "checksum mismatch" in rows[1]["damaged"]


def test_reading_a_store_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "data" / "typo.db"
    for args in (
        ("runs", "list", "--store", f"sqlite:///{typo}"),
        ("runs", "show", "x", "--store", f"sqlite:///{typo}"),
        ("migrate", f"sqlite:///{typo}", f"file://{tmp_path}/out"),
    ):
        done = sk(*args, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == f"error: no SQLite store at '{typo}': the file does not exist"
    assert not typo.exists()
    assert not (tmp_path / "data").exists()
    assert not (tmp_path / "out").exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    done = sk("runs", "list", "--store", f"sqlite:///{empty}", cwd=tmp_path)
    assert done.returncode == 2
    assert "is empty: not a statekernel store" in done.stderr
    assert empty.stat().st_size == 0
    missing = sk("runs", "list", "--store", f"file://{tmp_path}/nowhere", cwd=tmp_path)
    assert missing.returncode == 2
    assert "no file store at" in missing.stderr
    assert not (tmp_path / "nowhere").exists()
    blank = sk("runs", "list", "--store", "", cwd=tmp_path)
    assert blank.returncode == 2
    assert "--store is empty" in blank.stderr


def test_config_is_found_from_a_subfolder_and_an_unknown_key_is_an_error(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    sub = tmp_path / "pkg" / "deep"
    sub.mkdir(parents=True)
    ok(sk("demo", "--model", "scripted/demo", "--run-id", "at-root", cwd=tmp_path))
    assert (tmp_path / ".statekernel" / "runs.db").is_file()
    rows = as_json(sk("runs", "list", "--json", cwd=sub))
    assert [r["run_id"] for r in rows] == ["at-root"]
    assert not (sub / ".statekernel").exists()
    (tmp_path / "statekernel.toml").write_text(
        'store = "sqlite:///.statekernel/runs.db"\nstroe = 1\n'
    )
    bad = sk("runs", "list", cwd=sub)
    assert bad.returncode == 2
    assert "unknown key(s) stroe" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_python_dash_m_runs_the_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-P", "-m", "statekernel", "--help"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "statekernel: durable run loops" in done.stdout


def test_times_are_iso_utc_and_a_missing_revision_is_named(work: tuple[Path, str]) -> None:
    cwd, store = work
    iso = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
    listed = ok(sk("runs", "list", "--store", store, cwd=cwd))
    assert iso.search(listed)
    shown = ok(sk("runs", "show", "run-a", "--store", store, cwd=cwd))
    assert len(iso.findall(shown)) >= 2
    events = ok(sk("runs", "events", "run-a", "--store", store, cwd=cwd))
    assert iso.search(events.splitlines()[0])
    missing = sk("runs", "show", "run-a", "--revision", "999", "--store", store, cwd=cwd)
    assert missing.returncode == 2
    assert "run run-a has no revision 999 (its head is at revision" in missing.stderr


def test_following_a_run_nobody_drives_says_so(work: tuple[Path, str]) -> None:
    cwd, store = work  # run-c stopped mid-run (its process died)
    proc = subprocess.Popen(
        [str(EXE), "runs", "events", "run-c", "--follow", "--interval", "0.2", "--store", store],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    resume = f"statekernel runs resume run-c --store {store}"
    hung = threading.Timer(120, proc.terminate)  # it follows until stopped: a last resort
    hung.start()
    said = ""
    try:
        assert proc.stdout is not None
        while resume not in " ".join(said.split()) and (line := proc.stdout.readline()):
            said += line  # read until it said so, however long it takes to start
    finally:
        hung.cancel()
        proc.terminate()
        said += proc.communicate(timeout=60)[0]
    assert "no process drives it" in " ".join(said.split())
    assert resume in " ".join(said.split())


def _no_write_override() -> None:
    """Drop root's power to write where permissions forbid it (CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH) for the command, so a read-only folder is read-only to it."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_store_in_read_only_folder(tmp_path: Path) -> None:
    """A SQLite store in a folder the command cannot write is listed, shown and checked;
    a command that writes fails with one line saying the store is read-only."""
    folder = tmp_path / "shared"
    folder.mkdir()
    store = f"sqlite:///{folder / 'runs.db'}"
    ok(sk("demo", "--model", "scripted/demo", "--store", store, "--run-id", "ro-1", cwd=tmp_path))
    before = sorted(p.name for p in folder.iterdir())
    folder.chmod(0o555)
    preexec = _no_write_override if os.geteuid() == 0 else None

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        try:
            return sk(*args, "--store", store, cwd=tmp_path, preexec=preexec)
        except subprocess.SubprocessError as exc:  # no CAP_SETPCAP in this container
            pytest.skip(f"cannot drop root's write override here: {exc}")

    try:
        assert "ro-1" in ok(cli("runs", "list"))
        assert "completed" in ok(cli("runs", "show", "ro-1"))
        assert {f["status"] for f in as_json(cli("doctor", "--json"))} == {"ok"}
        refused = cli("runs", "delete", "ro-1", "--yes")
        assert refused.returncode == 2
        assert "opened read-only" in refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        folder.chmod(0o755)
    assert sorted(p.name for p in folder.iterdir()) == before
    assert "ro-1" in ok(sk("runs", "list", "--store", store, cwd=tmp_path))


READER = """
import asyncio, sys
from statekernel.stores import SQLiteStore

async def main() -> None:
    store = SQLiteStore(sys.argv[1])
    print(store.read_only, len((await store.list_runs()).runs), flush=True)
    sys.stdin.readline()
    print(len((await store.list_runs()).runs), flush=True)
    await store.aclose()

asyncio.run(main())
"""


def _commit_sample(url: str, run_id: str) -> None:
    from statekernel.stores import Checkpoint, SQLiteStore
    from statekernel.testing._store_cases import sample_run

    async def commit() -> None:
        store = SQLiteStore(url)
        await store.commit(Checkpoint.between(None, sample_run(run_id)))
        await store.aclose()

    asyncio.run(commit())


def test_a_read_only_store_sees_what_a_writer_adds_later(tmp_path: Path) -> None:
    """A store opened read-only (``immutable`` in a folder it cannot write) sees runs that
    a process with more rights commits after it opened the file."""
    folder = tmp_path / "shared"
    folder.mkdir()
    url = f"sqlite:///{folder / 'runs.db'}"
    _commit_sample(url, "first")
    folder.chmod(0o555)
    preexec = _no_write_override if os.geteuid() == 0 else None
    try:
        reader = subprocess.Popen(
            [sys.executable, "-P", "-c", READER, url], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec,
        )  # fmt: skip
        assert reader.stdout is not None
        assert reader.stdout.readline().split() == ["True", "1"]
        if os.geteuid() != 0:
            folder.chmod(0o755)  # the writer has the rights the reader lacks
        _commit_sample(url, "second")
        out, err = reader.communicate("go\n", timeout=30)
        assert (out.strip(), reader.returncode) == ("2", 0), err
    finally:
        folder.chmod(0o755)
