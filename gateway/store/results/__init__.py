"""The result store (SPEC 23, kept results): complete copies of succeeded jobs' results,
as files in a folder or objects in an S3-compatible bucket, chosen from a table by the
target's kind.

A copy is written to a partial file or a multipart upload and becomes visible under its name
only when ``commit`` ends (a rename, a completed upload): a crash mid-copy leaves nothing a
reader could take for a result. Nothing here knows operations or policies; gateway/flow/
keeping.py decides what to copy, and the record says what was kept.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator

from gateway import StoreError
from gateway.settings.keeping import FileTarget, S3Target, Target

CHUNK = 64 * 1024  # bytes read per step when a copy is served


class ResultStoreError(StoreError):
    """The result store could not be reached or refused a call."""


class CopyWriter(abc.ABC):
    """One copy being written; nothing is visible under its name until ``commit``."""

    @abc.abstractmethod
    async def write(self, chunk: bytes) -> None: ...

    @abc.abstractmethod
    async def commit(self) -> None:
        """Make the copy visible under its name, complete, or raise and leave nothing."""

    @abc.abstractmethod
    async def abort(self) -> None:
        """Throw the partial copy away (never raises)."""


class ResultStore(abc.ABC):
    @abc.abstractmethod
    async def open(self) -> None:
        """Ready the store (a folder made, credentials read)."""

    async def close(self) -> None:  # noqa: B027 - most stores hold nothing to give back
        """Give back what ``open`` took."""

    @abc.abstractmethod
    def writer(self, name: str) -> CopyWriter: ...

    @abc.abstractmethod
    def read(self, name: str) -> AsyncIterator[bytes]:
        """The copy's bytes in chunks; ResultStoreError when it cannot be read."""

    @abc.abstractmethod
    async def delete(self, name: str) -> None:
        """Delete a copy; deleting one that is gone is not an error."""

    @abc.abstractmethod
    async def names(self) -> list[str]:
        """The names of the complete copies."""

    @abc.abstractmethod
    async def forget_partial(self, started_before: float) -> int:
        """Throw away partial copies begun before ``started_before`` (epoch seconds) by a
        process that died; how many."""


def result_store(target: Target | None) -> ResultStore:
    """The store for ``target``; None: a temporary folder of this process's own (memory://)."""
    from gateway.store.results.files import FileResults, TemporaryResults

    if target is None:
        return TemporaryResults()
    if isinstance(target, FileTarget):
        return FileResults(target.folder)
    assert isinstance(target, S3Target)
    from gateway.store.results.s3 import S3Results

    return S3Results(target)
