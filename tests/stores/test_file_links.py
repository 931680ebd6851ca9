"""The file store follows no link it did not make and uses no folder it cannot trust.

A symbolic link planted at the name of any file of a run (pointing at a file outside
the store) leaves that file as it was and the operation fails with ``StoreError``
naming the path; a hard link planted as the log is refused too. A store folder or run
folder that is a symbolic link, another user's, or writable by its group or by every
user is refused before anything is written, so nothing committed is lost.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from statekernel._records.run import Run
from statekernel.errors import StoreError
from statekernel.stores import Checkpoint, FileStore, SQLiteStore, open_store
from statekernel.stores._host.owners import OwnerProofs
from statekernel.testing._store_cases import next_revision, sample_run

PRECIOUS = b"a file of someone else's that the store must never touch\n"
NOBODY = 65534
"""The uid of ``nobody``: another user than the tests' own."""


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the store that a planted link points at."""
    path = tmp_path / "victim.txt"
    path.write_bytes(PRECIOUS)
    path.chmod(0o600)
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The store's folder (made by the store on its first commit)."""
    return tmp_path / "store"


async def _committed(root: Path, run_id: str = "r") -> tuple[FileStore, Run]:
    """A store at ``root`` holding run ``run_id`` at revision 1."""
    store = FileStore(f"file://{root}")
    run = sample_run(run_id)
    await store.commit(Checkpoint.between(None, run))
    nxt = next_revision(run)
    await store.commit(Checkpoint.between(run, nxt))
    return store, nxt


def _files(top: Path) -> dict[str, bytes]:
    """Every regular file under ``top`` and its bytes (links not followed)."""
    found: dict[str, bytes] = {}
    for folder, _, names in os.walk(top):
        for name in names:
            path = Path(folder, name)
            if stat.S_ISREG(path.lstat().st_mode):
                found[str(path.relative_to(top))] = path.read_bytes()
    return found


def _untouched(victim: Path) -> bool:
    """Whether the victim file still holds what it held (``PRECIOUS``)."""
    return victim.read_bytes() == PRECIOUS


def _plant(link: Path, target: Path) -> None:
    """Put a symbolic link to ``target`` at ``link`` (in place of what is there)."""
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


async def _refused(work: Awaitable[Any], *named: str) -> StoreError:
    """Await ``work``, which must fail with ``StoreError`` naming each of ``named``."""
    with pytest.raises(StoreError) as info:
        await work
    for text in named:
        assert text in str(info.value), f"{info.value} does not name {text!r}"
    return info.value


# -- files planted as symbolic links -------------------------------------------------


@pytest.mark.parametrize("name", ["log.jsonl", "head.json.tmp", "lock", "head.json"])
async def test_a_link_at_a_file_a_commit_opens_is_refused(
    root: Path, victim: Path, name: str
) -> None:
    """A commit refuses the link before it writes anything: the victim keeps its bytes,
    the run keeps its last commit, and once the link is gone the store goes on."""
    store, run = await _committed(root)
    path = root / "r" / name
    aside = victim.with_name(f"{name}.aside")
    if path.exists():
        path.rename(aside)
    _plant(path, victim)
    before = _files(root)
    error = await _refused(store.commit(Checkpoint.between(run, next_revision(run))), str(path))
    assert "symbolic link" in str(error)
    assert _untouched(victim)
    assert _files(root) == before  # nothing of the commit was written
    path.unlink()
    if aside.exists():
        aside.rename(path)
    assert (await store.load("r")) == run
    await store.commit(Checkpoint.between(run, next_revision(run)))
    assert (await store.load("r")).revision == run.revision + 1
    assert _untouched(victim)
    await store.aclose()


@pytest.mark.parametrize("name", ["log.jsonl", "head.json.tmp", "lock"])
async def test_a_link_in_a_new_run_folder_is_refused(root: Path, victim: Path, name: str) -> None:
    """The first commit of a run whose folder already holds a planted link."""
    store = FileStore(f"file://{root}")
    os.mkdir(root, 0o700)
    os.mkdir(root / "r", 0o700)
    _plant(root / "r" / name, victim)
    await _refused(store.commit(Checkpoint.between(None, sample_run("r"))), name)
    assert _untouched(victim)
    if name != "log.jsonl":
        assert not (root / "r" / "log.jsonl").exists()  # refused before the append
    await store.aclose()


async def test_a_dangling_link_creates_nothing(root: Path, tmp_path: Path) -> None:
    """A link to a path that does not exist yet is not followed to create it."""
    store, run = await _committed(root)
    for name in ("log.jsonl", "lock"):
        target = tmp_path / f"made-through-{name}"
        _plant(root / "r" / name, target)
        await _refused(store.commit(Checkpoint.between(run, next_revision(run))), name)
        assert not target.exists()
    await store.aclose()


@pytest.mark.parametrize("name", ["log.jsonl", "head.json"])
async def test_reads_follow_no_link(root: Path, victim: Path, name: str) -> None:
    """A load, the events and the listing refuse a linked log or head file."""
    store, _ = await _committed(root)
    _plant(root / "r" / name, victim)
    await _refused(store.load("r"), name)
    await _refused(store.events("r"), name)
    assert _untouched(victim)
    await store.aclose()


@pytest.mark.parametrize("name", ["lease.json", "lease.json.tmp"])
async def test_a_link_at_a_lease_file_is_refused(root: Path, victim: Path, name: str) -> None:
    store, _ = await _committed(root)
    lease = await store.acquire("r", "owner-1", ttl=60.0)
    await store.release(lease)
    _plant(root / "r" / name, victim)
    await _refused(store.acquire("r", "owner-2", ttl=60.0), name, "symbolic link")
    assert _untouched(victim)
    await store.aclose()


async def test_a_hard_link_planted_as_the_log_is_refused(root: Path, victim: Path) -> None:
    """The log must be the store's own: a name shared with a file elsewhere is not."""
    store, run = await _committed(root)
    log = root / "r" / "log.jsonl"
    os.replace(log, victim)
    with open(victim, "ab") as f:  # noqa: ASYNC230 - a test sets the file up
        f.write(b"more than was committed\n")
    os.link(victim, log)
    kept = _files(victim.parent)[victim.name]
    await _refused(store.commit(Checkpoint.between(run, next_revision(run))), "hard link")
    assert _files(victim.parent)[victim.name] == kept  # not cut back to the committed length
    await store.aclose()


async def test_a_fifo_planted_as_the_lock_is_refused(root: Path) -> None:
    """A file the store writes or locks must be a regular file."""
    store, run = await _committed(root)
    (root / "r" / "lock").unlink()
    os.mkfifo(root / "r" / "lock", 0o600)
    await _refused(store.commit(Checkpoint.between(run, next_revision(run))), "not a regular file")
    await store.aclose()


async def test_a_temp_file_the_store_left_is_removed(root: Path) -> None:
    """Temp files of a writer that stopped before its rename are the store's own: the
    next writer removes them and goes on."""
    store, run = await _committed(root)
    for name in ("head.json.tmp", "lease.json.tmp"):
        path = root / "r" / name
        path.write_bytes(b'{"v": 4, "sz": 1')  # cut short
        path.chmod(0o600)
    nxt = next_revision(run)
    await store.commit(Checkpoint.between(run, nxt))
    lease = await store.acquire("r", "owner-1", ttl=60.0)
    await store.release(lease)
    assert not (root / "r" / "head.json.tmp").exists()
    assert not (root / "r" / "lease.json.tmp").exists()
    assert await store.load("r") == nxt
    await store.aclose()


async def test_a_link_at_the_owners_folder_is_refused(root: Path, tmp_path: Path) -> None:
    """The folder of the owner locks is the store's own too."""
    store, _ = await _committed(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    _plant(root / ".owners", elsewhere)
    await _refused(store.acquire("r", "owner-1", ttl=60.0), ".owners", "symbolic link")
    assert list(elsewhere.iterdir()) == []
    await store.aclose()


# -- folders ---------------------------------------------------------------------------


async def _every_operation_refused(store: FileStore, run: Run, folder: Path, *named: str) -> None:
    """Load, events, commit and a lease of run "r" (and, when ``folder`` is the store's,
    the first commit of a new run) all fail with ``StoreError`` naming ``folder`` and
    each of ``named``."""
    work: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.load("r"),
        lambda: store.events("r"),
        lambda: store.commit(Checkpoint.between(run, next_revision(run))),
        lambda: store.acquire("r", "owner-1", ttl=60.0),
    ]
    if folder == store.root:
        work.append(lambda: store.commit(Checkpoint.between(None, sample_run("r2"))))
    named = (str(folder), *named)
    for call in work:
        await _refused(call(), *named)


async def test_a_store_folder_that_is_a_link_is_refused(root: Path, tmp_path: Path) -> None:
    """``file:///link`` where ``link`` points at a real store: refused, nothing written."""
    _, run = await _committed(root)
    link = tmp_path / "link"
    link.symlink_to(root)
    before = _files(root)
    store = FileStore(f"file://{link}")
    await _every_operation_refused(store, run, link, "symbolic link")
    await _refused(store.list_runs(), str(link))
    assert _files(root) == before
    assert not (root / ".owners").exists()
    await store.aclose()


async def test_a_run_folder_that_is_a_link_is_refused(root: Path, tmp_path: Path) -> None:
    """A run folder moved out of the store and a link left in its place: refused, and
    the listing names it as a run it could not read rather than following it."""
    _, run = await _committed(root)
    store, _ = await _committed(root, "r2")
    outside = tmp_path / "outside"
    (root / "r").rename(outside)
    (root / "r").symlink_to(outside)
    before = _files(outside)
    await _refused(store.load("r"), str(root / "r"), "symbolic link")
    await _refused(store.commit(Checkpoint.between(run, next_revision(run))), "symbolic link")
    await _refused(store.acquire("r", "owner-1", ttl=60.0), "symbolic link")
    page = await store.list_runs()
    assert [s.run_id for s in page.runs] == ["r2"]
    assert [d.run_id for d in page.damaged] == ["r"]
    assert "symbolic link" in page.damaged[0].problem
    assert _files(outside) == before
    await store.aclose()


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777])
@pytest.mark.parametrize("which", ["store", "run"])
async def test_a_folder_others_can_write_is_refused(root: Path, mode: int, which: str) -> None:
    """Group- or world-writable (sticky or not): refused, nothing committed is lost,
    and the store goes on once the folder is private again."""
    store, run = await _committed(root)
    folder = root if which == "store" else root / "r"
    before = _files(root)
    folder.chmod(mode)
    try:
        await _every_operation_refused(store, run, folder, "writable")
        assert _files(root) == before
    finally:
        folder.chmod(0o700)
    assert await store.load("r") == run
    await store.commit(Checkpoint.between(run, next_revision(run)))
    await store.aclose()


async def test_a_new_store_under_a_folder_others_can_write(tmp_path: Path) -> None:
    """Folders above the store's may be shared (``/tmp``); the store's own may not."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    store = FileStore(f"file://{shared / 'runs'}")
    await store.commit(Checkpoint.between(None, sample_run("r")))
    assert stat.S_IMODE((shared / "runs").stat().st_mode) == 0o700
    await store.aclose()
    store = FileStore(f"file://{shared}")
    await _refused(store.commit(Checkpoint.between(None, sample_run("r"))), "writable")
    assert not (shared / "r").exists()
    await store.aclose()


def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a folder to another user (os.chown)")


@pytest.mark.parametrize("which", ["store", "run", "log"])
async def test_what_another_user_owns_is_refused(root: Path, which: str) -> None:
    _as_root()
    store, run = await _committed(root)
    path = {"store": root, "run": root / "r", "log": root / "r" / "log.jsonl"}[which]
    before = _files(root)
    os.chown(path, NOBODY, NOBODY)
    try:
        if which == "log":
            await _refused(
                store.commit(Checkpoint.between(run, next_revision(run))), str(path), "uid"
            )
        else:
            await _every_operation_refused(store, run, path, f"uid {NOBODY}")
        assert _files(root) == before
    finally:
        os.chown(path, os.geteuid(), os.getegid())
    assert await store.load("r") == run
    await store.aclose()


async def test_a_store_folder_made_by_another_user_is_not_reused(tmp_path: Path) -> None:
    """A folder another user made where the store is to be: refused, not written in."""
    _as_root()
    planted = tmp_path / "store"
    planted.mkdir(mode=0o700)
    os.chown(planted, NOBODY, NOBODY)
    store = open_store(f"file://{planted}")
    await _refused(store.commit(Checkpoint.between(None, sample_run("r"))), str(planted))
    assert list(planted.iterdir()) == []
    await store.aclose()


async def test_a_sqlite_owners_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    """The owner locks of a SQLite store live in a folder of the store's own as well."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'runs.db'}")
    await store.commit(Checkpoint.between(None, sample_run("r")))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "runs.db-owners").symlink_to(elsewhere)
    await _refused(store.acquire("r", "owner-1", ttl=60.0), "runs.db-owners", "symbolic link")
    assert list(elsewhere.iterdir()) == []
    await store.aclose()


def test_an_owner_lock_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    """A link planted where an owner's lock file goes is never followed: taking the lock
    through it, or checking it, is a ``StoreError`` and the target is never created."""
    folder = tmp_path / "owners"
    proofs = OwnerProofs(folder)
    folder.mkdir(mode=0o700)
    target = tmp_path / "victim"
    os.symlink(target, proofs.lock_path("owner-1"))
    with pytest.raises(StoreError, match="owner lock"):
        proofs.hold("owner-1")
    with pytest.raises(StoreError, match="owner lock"):
        OwnerProofs(folder).alive("owner-1")
    assert not target.exists()
