"""The file store's commit point (layout 4): one fsync of the log per commit, each
commit ending with its head record; ``head.json`` a hint. Torn commits read as the
revision before, committed data lost or damaged is ``CorruptCheckpoint``, and a store
of layout 3 still loads and is upgraded by its next commit."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pytest

from statekernel._records.run import Run
from statekernel.errors import CorruptCheckpoint
from statekernel.stores import Checkpoint, FileStore, open_store
from statekernel.stores._format.checksum import seal_line, unseal_line
from statekernel.stores._format.documents import dump_bytes
from statekernel.stores.file._io import RunFolder
from statekernel.stores.file._log import LAYOUT_VERSION
from statekernel.testing._raw import FileRecords
from statekernel.testing._store_cases import next_revision, sample_run


async def _chain(url: str, revisions: int) -> list[Run]:
    """Revisions 0..``revisions`` of run "r", committed; the list of them."""
    store = open_store(url)
    chain = [sample_run("r")]
    await store.commit(Checkpoint.between(None, chain[0]))
    for _ in range(revisions):
        nxt = next_revision(chain[-1], messages=(*chain[-1].messages, chain[-1].messages[0]))
        await store.commit(Checkpoint.between(chain[-1], nxt))
        chain.append(nxt)
    await store.aclose()
    return chain


def _commits(log: bytes) -> list[tuple[int, int]]:
    """(start, end) of each commit in a layout 4 log."""
    found, start, pos = [], 0, 0
    for line in log.split(b"\n")[:-1]:
        pos += len(line) + 1
        if line.startswith(b'["h",'):
            found.append((start, pos))
            start = pos
    return found


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x04]) + data[at + 1 :]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"file://{tmp_path}"


# -- one fsync a commit ------------------------------------------------------------------


async def test_a_commit_after_the_first_costs_one_fsync(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    store = open_store(url)
    run = sample_run("r")
    await store.commit(Checkpoint.between(None, run))
    first = len(calls)
    assert first <= 3, f"the first commit made {first} fsyncs (log, run folder, store folder)"
    for _ in range(5):
        calls.clear()
        nxt = next_revision(run, messages=(*run.messages, run.messages[0]))
        await store.commit(Checkpoint.between(run, nxt))
        run = nxt
        assert len(calls) == 1, f"a commit made {len(calls)} fsyncs"
    calls.clear()
    assert await store.load("r") == run
    await store.list_runs()
    assert calls == [], "a read with an up-to-date hint fsynced"


# -- torn commits --------------------------------------------------------------------------


@pytest.mark.parametrize("hint", ["stale", "missing", "torn"])
async def test_a_torn_last_commit_reads_the_revision_before(
    url: str, tmp_path: Path, hint: str
) -> None:
    chain = await _chain(url, 1)
    folder = tmp_path / "r"
    hint_1 = (folder / "head.json").read_bytes()
    store = open_store(url)
    two = next_revision(chain[1], messages=(*chain[1].messages, chain[1].messages[0]))
    await store.commit(Checkpoint.between(chain[1], two))
    log = (folder / "log.jsonl").read_bytes()
    start, end = _commits(log)[-1]
    if hint == "stale":
        (folder / "head.json").write_bytes(hint_1)  # its rename never reached the disk
    elif hint == "missing":
        (folder / "head.json").unlink()
    else:
        (folder / "head.json").write_bytes(b"\0" * 20)
    for cut in (start + 5, (start + end) // 2, end - 12, end - 1):
        (folder / "log.jsonl").write_bytes(log[:cut])
        assert await open_store(url).load("r") == chain[1], f"log cut at {cut}"
        assert [s.revision for s in (await store.list_runs()).runs] == [1]
        assert len(await store.events("r")) == 0
    three = next_revision(chain[1], messages=(*chain[1].messages, chain[1].messages[0]))
    await store.commit(Checkpoint.between(chain[1], three))  # cuts the torn commit off
    assert await open_store(url).load("r") == three
    assert _commits((folder / "log.jsonl").read_bytes())[-1][0] == start


@pytest.mark.parametrize("hint", ["stale", "missing"])
async def test_a_whole_commit_past_the_hint_is_committed(
    url: str, tmp_path: Path, hint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committer that stopped between its fsync and its hint: the log wins; a reader
    takes the run's lock shared and fsyncs the log before serving it."""
    chain = await _chain(url, 1)
    folder = tmp_path / "r"
    hint_1 = (folder / "head.json").read_bytes()
    two = next_revision(chain[1])
    store = open_store(url)
    await store.commit(Checkpoint.between(chain[1], two))
    if hint == "stale":
        (folder / "head.json").write_bytes(hint_1)
    else:
        (folder / "head.json").unlink()
    locks: list[int] = []
    fsyncs: list[int] = []
    real_flock, real_fsync = fcntl.flock, os.fsync

    def flock(fd: int, op: int) -> None:
        locks.append(op)
        real_flock(fd, op)

    def fsync(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(os, "fsync", fsync)
    assert await store.load("r") == two
    assert locks == [fcntl.LOCK_SH]
    assert len(fsyncs) == 1
    assert [s.revision for s in (await store.list_runs()).runs] == [2]
    three = next_revision(two)
    await store.commit(Checkpoint.between(two, three))
    locks.clear()
    assert await store.load("r") == three
    assert locks == [], "the hint is up to date again"


async def test_a_commit_being_written_is_not_read(url: str, tmp_path: Path) -> None:
    """A whole commit past the hint while a committer holds the lock is read only once
    the lock is free; bytes of a commit not yet whole are never read."""
    chain = await _chain(url, 1)
    folder = tmp_path / "r"
    hint_1 = (folder / "head.json").read_bytes()
    log_1 = (folder / "log.jsonl").read_bytes()
    two = next_revision(chain[1])
    store = open_store(url)
    await store.commit(Checkpoint.between(chain[1], two))
    log_2 = (folder / "log.jsonl").read_bytes()
    (folder / "head.json").write_bytes(hint_1)
    (folder / "log.jsonl").write_bytes(log_2[: len(log_1) + 40])  # being appended
    fd = os.open(folder / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a committer between its append and its hint
        assert await store.load("r") == chain[1]
    finally:
        os.close(fd)
    (folder / "log.jsonl").write_bytes(log_2)
    assert await store.load("r") == two


# -- damage --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["head record", "message", "entry"])
async def test_a_flipped_bit_in_the_last_commit_with_its_hint_is_corrupt(
    url: str, tmp_path: Path, where: str
) -> None:
    await _chain(url, 2)
    folder = tmp_path / "r"
    log = (folder / "log.jsonl").read_bytes()
    start, end = _commits(log)[-1]
    needle = {"head record": b'["h",', "message": b'["m",', "entry": b'["c",'}[where]
    at = log.index(needle, start) + 9
    assert at < end
    (folder / "log.jsonl").write_bytes(_flip(log, at))
    store = open_store(url)
    for work in (store.load("r"), store.events("r"), store.load("r", revision=1)):
        with pytest.raises(CorruptCheckpoint, match="'r'"):
            await work
    page = await store.list_runs()
    if where == "head record":  # a listing reads the head records only
        assert [d.run_id for d in page.damaged] == ["r"]
        assert "head" in page.damaged[0].problem
    one = next_revision(sample_run("r"))
    with pytest.raises(CorruptCheckpoint):
        await store.commit(Checkpoint.between(one, next_revision(one)))


async def test_a_damaged_commit_before_a_whole_one_is_corrupt_without_a_hint(
    url: str, tmp_path: Path
) -> None:
    await _chain(url, 3)
    folder = tmp_path / "r"
    (folder / "head.json").unlink()
    log = (folder / "log.jsonl").read_bytes()
    start, _ = _commits(log)[1]
    (folder / "log.jsonl").write_bytes(_flip(log, log.index(b'["h",', start) + 12))
    store = open_store(url)
    with pytest.raises(CorruptCheckpoint, match="head record"):
        await store.load("r")
    page = await store.list_runs()  # a listing reads no more than the commits' ends
    assert page.runs == ()
    assert [d.run_id for d in page.damaged] == ["r"]
    assert "head record" in page.damaged[0].problem


async def test_a_log_cut_at_a_commit_the_hint_covers_is_corrupt(url: str, tmp_path: Path) -> None:
    await _chain(url, 2)
    folder = tmp_path / "r"
    log = (folder / "log.jsonl").read_bytes()
    start, _ = _commits(log)[-1]
    (folder / "log.jsonl").write_bytes(log[:start])  # the whole last commit lost
    with pytest.raises(CorruptCheckpoint, match=r"log\.jsonl"):
        await open_store(url).load("r")
    (folder / "head.json").unlink()  # without the hint nothing says it was committed
    assert (await open_store(url).load("r")).revision == 1


async def test_a_hint_from_a_newer_layout_is_refused(url: str, tmp_path: Path) -> None:
    await _chain(url, 1)
    path = tmp_path / "r" / "head.json"
    doc = json.loads(unseal_line(path.read_bytes(), "hint"))
    doc["v"] = 99
    path.write_bytes(seal_line(dump_bytes(doc)))
    with pytest.raises(Exception, match="unknown file store layout 99"):
        await open_store(url).load("r")


# -- layout 3 ------------------------------------------------------------------------------


def _as_layout_3(folder: Path) -> dict[str, Any]:
    """The run in layout 3: its log without head records, its head in ``head.json``
    with the length of the log it covers (fsynced there: the commit point)."""
    lines = (folder / "log.jsonl").read_bytes().split(b"\n")[:-1]
    head = FileRecords().decode(("head", 0), lines[-1])
    log = b"".join(line + b"\n" for line in lines if not line.startswith(b'["h",'))
    (folder / "log.jsonl").write_bytes(log)
    doc = {"v": 3, "sz": len(log), "head": head}
    (folder / "head.json").write_bytes(seal_line(dump_bytes(doc)))
    return doc


async def test_a_layout_3_run_loads_and_its_next_commit_upgrades_it(
    url: str, tmp_path: Path
) -> None:
    chain = await _chain(url, 2)
    folder = tmp_path / "r"
    store = open_store(url)
    events = await store.events("r")
    _as_layout_3(folder)
    with (folder / "log.jsonl").open("ab") as f:
        f.write(b'["m",99,"a torn tail of layout 3')
    assert await store.load("r") == chain[2]
    assert await store.load("r", revision=1) == chain[1]
    assert await store.events("r") == events
    assert [s.revision for s in (await store.list_runs()).runs] == [2]
    three = next_revision(chain[2], messages=(*chain[2].messages, chain[2].messages[0]))
    await store.commit(Checkpoint.between(chain[2], three))
    hint = json.loads(unseal_line((folder / "head.json").read_bytes(), "hint"))
    assert hint["v"] == LAYOUT_VERSION
    assert await open_store(url).load("r") == three
    assert await store.load("r", revision=2) == chain[2]
    (folder / "head.json").unlink()  # a hint lost: the upgraded log still knows its head
    assert await open_store(url).load("r") == three


async def test_a_layout_3_head_file_is_still_the_commit_point(url: str, tmp_path: Path) -> None:
    """Layout 3 fsynced its head file: damaged, with no commit of layout 4 in the log,
    it is ``CorruptCheckpoint``; a log shorter than it says too."""
    await _chain(url, 2)
    folder = tmp_path / "r"
    _as_layout_3(folder)
    head = (folder / "head.json").read_bytes()
    (folder / "head.json").write_bytes(_flip(head, len(head) // 2))
    with pytest.raises(CorruptCheckpoint, match=r"head file"):
        await open_store(url).load("r")
    (folder / "head.json").write_bytes(head)
    log = (folder / "log.jsonl").read_bytes()
    (folder / "log.jsonl").write_bytes(log[:-3])
    with pytest.raises(CorruptCheckpoint, match=r"log\.jsonl"):
        await open_store(url).load("r")


async def test_an_upgrade_commit_whose_hint_never_landed(url: str, tmp_path: Path) -> None:
    """The first commit of layout 4 on a layout 3 run, its hint's rename lost: the
    layout 3 head file is a hint too, and the commit after it wins."""
    chain = await _chain(url, 1)
    folder = tmp_path / "r"
    _as_layout_3(folder)
    old = (folder / "head.json").read_bytes()
    two = next_revision(chain[1])
    await open_store(url).commit(Checkpoint.between(chain[1], two))
    (folder / "head.json").write_bytes(old)
    assert await open_store(url).load("r") == two


async def test_a_layout_4_run_loads_and_its_next_fenced_commit_keeps_the_fence(
    url: str, tmp_path: Path
) -> None:
    chain = await _chain(url, 1)
    folder = tmp_path / "r"
    hint = json.loads(unseal_line((folder / "head.json").read_bytes(), "hint"))
    hint["v"] = 4  # layout 4: the same log, heads without a fence
    (folder / "head.json").write_bytes(seal_line(dump_bytes(hint)))
    store = open_store(url)
    try:
        assert await store.load("r") == chain[1]
        lease = await store.acquire("r", "owner", ttl=60)
        two = next_revision(chain[1])
        await store.commit(Checkpoint.between(chain[1], two), lease=lease)
        await store.release(lease)
        assert await store.load("r") == two
        assert await store.load("r", revision=1) == chain[1]
        upgraded = json.loads(unseal_line((folder / "head.json").read_bytes(), "hint"))
        assert upgraded["v"] == LAYOUT_VERSION
        lines = (folder / "log.jsonl").read_bytes().split(b"\n")[:-1]
        assert FileRecords().decode(("head", 0), lines[-1])["$f"] == int(lease.token)
    finally:
        await store.aclose()


async def test_a_commit_landing_while_a_reader_looks_is_not_taken_for_lost_data(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain = await _chain(url, 1)
    writer, reader = FileStore(url), FileStore(url)
    two = next_revision(chain[1])
    real = RunFolder._hint
    landed: list[bool] = []

    def hint_after_a_commit(folder: RunFolder, dir_fd: int) -> Any:
        if not landed:  # another process's whole commit, hint included, lands here
            landed.append(True)
            writer._commit(Checkpoint.between(chain[1], two), None)
        return real(folder, dir_fd)

    monkeypatch.setattr(RunFolder, "_hint", hint_after_a_commit)
    try:
        assert (await reader.load("r")).revision in (1, 2)
        assert landed == [True]
        monkeypatch.setattr(RunFolder, "_hint", real)
        assert await reader.load("r") == two
    finally:
        await writer.aclose()
        await reader.aclose()
