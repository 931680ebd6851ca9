"""The doctor's probe of the file store."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import (
    StatekernelError,
    StoreError,
)
from statekernel.stores._doctor_probe import (
    DAMAGED,
    WARNING,
    Finding,
    LeaseView,
    RunRef,
    host_lease,
    permissions,
)
from statekernel.stores.file._io import RunFolder, read_lease
from statekernel.stores.file._store import FileStore, folder_name

__all__ = ["FileProbe"]

# -- file --------------------------------------------------------------------------


class FileProbe:
    """``file:///dir``: one folder per run."""

    local_errors = True

    def __init__(self, url: str) -> None:
        store = FileStore(url)
        self.root = store.root
        if not self.root.is_dir():
            what = "is not a folder" if self.root.exists() else "does not exist"
            raise StoreError(f"no file store at {str(self.root)!r}: the path {what}")
        self.subject = str(self.root)
        self.url = url
        self.store: CheckpointStore | None = store

    def _walk(self) -> Iterator[Path]:
        yield self.root
        for top, folders, files in os.walk(self.root):
            for name in (*folders, *files):
                yield Path(top, name)

    async def settings(self) -> list[Finding]:
        """The permissions of every file and folder of the store."""
        return [await asyncio.to_thread(permissions, self._walk(), "permissions", self.subject)]

    async def runs(self) -> list[RunRef]:
        """Every run folder (``.``-folders are the store's own)."""
        return await asyncio.to_thread(self._runs)

    def _runs(self) -> list[RunRef]:
        found: list[RunRef] = []
        for name in sorted(os.listdir(self.root)):
            path = self.root / name
            if name.startswith(".") or not path.is_dir():
                continue
            found.append(self._run(name, path))
        return found

    def _run(self, name: str, path: Path) -> RunRef:
        named = None if name.startswith("~") else name  # a plain run id is its own folder
        try:
            head = RunFolder(path, self.url).head()
        except StatekernelError as exc:
            if named is not None:
                return RunRef(named, named)  # the run's own checks report the damage
            return RunRef(None, str(path), Finding("records", str(path), DAMAGED, str(exc)))
        if head is None:
            detail = "a run folder without a committed head: a first commit that never landed"
            return RunRef(None, str(path), Finding("records", str(path), WARNING, detail))
        run_id = head.get("run_id") if isinstance(head, dict) else None
        if not isinstance(run_id, str) or folder_name(run_id) != name:
            detail = f"the head names run {run_id!r}, which does not belong in this folder"
            return RunRef(None, str(path), Finding("records", str(path), DAMAGED, detail))
        return RunRef(run_id, run_id)

    async def lease(self, run_id: str) -> LeaseView | None:
        """The run's ``lease.json``."""
        return await asyncio.to_thread(self._lease, run_id)

    def _lease(self, run_id: str) -> LeaseView | None:
        record = read_lease(RunFolder(self.root / folder_name(run_id), self.url, run_id))
        if record is None:
            return None
        return host_lease((record.token, record.owner, record.expires), self.root / ".owners")

    async def cross_checks(self) -> list[Finding]:
        """None."""
        return []

    async def aclose(self) -> None:
        """Nothing stays open (the store holds no owner lock: it took no lease)."""
        if self.store is not None:
            await self.store.aclose()
