"""Kept results as files in a folder: ``<folder>/<name>`` once complete, written first to
``<folder>/.partial/<name>.<token>``, flushed to disk and renamed (rename is atomic on one
filesystem, so a reader sees a whole copy or none). File calls run in a worker thread: a
slow disk never stalls the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from gateway.store.results import CHUNK, CopyWriter, ResultStore, ResultStoreError

PARTIAL = ".partial"


class FileWriter(CopyWriter):
    def __init__(self, folder: Path, name: str) -> None:
        self._final = folder / name
        self._path = folder / PARTIAL / f"{name}.{secrets.token_hex(6)}"
        self._file: BinaryIO | None = None

    async def write(self, chunk: bytes) -> None:
        try:
            if self._file is None:
                self._file = await asyncio.to_thread(self._path.open, "xb")
            await asyncio.to_thread(self._file.write, chunk)
        except OSError as exc:
            raise ResultStoreError(f"cannot write {self._path}: {exc.strerror}") from None

    async def commit(self) -> None:
        try:
            await asyncio.to_thread(self._commit)
        except OSError as exc:
            await self.abort()
            raise ResultStoreError(f"cannot keep {self._final}: {exc.strerror}") from None

    def _commit(self) -> None:
        if self._file is None:  # an empty result
            self._file = self._path.open("xb")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._path, self._final)
        folder = os.open(self._final.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself survives a power cut
        finally:
            os.close(folder)

    async def abort(self) -> None:
        def drop() -> None:
            if self._file is not None:
                self._file.close()
            self._path.unlink(missing_ok=True)

        with contextlib.suppress(OSError):
            await asyncio.to_thread(drop)


class FileResults(ResultStore):
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def open(self) -> None:
        try:
            await asyncio.to_thread((self.folder / PARTIAL).mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultStoreError(f"cannot make {self.folder}: {exc.strerror}") from None

    def writer(self, name: str) -> CopyWriter:
        return FileWriter(self.folder, name)

    async def read(self, name: str) -> AsyncIterator[bytes]:
        try:
            file = await asyncio.to_thread((self.folder / name).open, "rb")
        except OSError as exc:
            raise ResultStoreError(f"cannot read kept result {name}: {exc.strerror}") from None
        try:
            while chunk := await asyncio.to_thread(file.read, CHUNK):
                yield chunk
        finally:
            file.close()

    async def delete(self, name: str) -> None:
        try:
            await asyncio.to_thread((self.folder / name).unlink, missing_ok=True)
        except OSError as exc:
            raise ResultStoreError(f"cannot delete kept result {name}: {exc.strerror}") from None

    async def names(self) -> list[str]:
        def listing() -> list[str]:
            return [e.name for e in os.scandir(self.folder) if e.is_file() and e.name[0] != "."]

        try:
            return await asyncio.to_thread(listing)
        except OSError as exc:
            raise ResultStoreError(f"cannot list {self.folder}: {exc.strerror}") from None

    async def forget_partial(self, started_before: float) -> int:
        def sweep() -> int:
            dropped = 0
            for entry in os.scandir(self.folder / PARTIAL):
                if entry.stat().st_mtime < started_before:
                    Path(entry.path).unlink(missing_ok=True)
                    dropped += 1
            return dropped

        try:
            return await asyncio.to_thread(sweep)
        except OSError as exc:
            raise ResultStoreError(f"cannot clean {self.folder}: {exc.strerror}") from None


class TemporaryResults(FileResults):
    """A folder of this process's own, removed at close: for memory:// stores, whose
    records end with the process too."""

    def __init__(self) -> None:
        super().__init__(Path(tempfile.mkdtemp(prefix="statusgate-results-")))

    async def close(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.folder, True)
