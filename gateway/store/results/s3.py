"""Kept results as objects in an S3-compatible bucket (AWS S3, MinIO, Ceph, moto), over
aiohttp with every request signed by botocore's SigV4 signer (the one the aws_sigv4
credential uses). botocore is already a runtime dependency; aiobotocore pins a botocore
range of its own that conflicts with it (docs/results.md).

A copy is a multipart upload (parts of PART_SIZE, the last one smaller): the object exists
only once the upload is completed, so a crash leaves an incomplete upload, never a partial
object; ``forget_partial`` aborts the ones a dead process left. Credentials are AWS-style,
found by botocore's chain (environment, shared files, web identity) when the store opens
and refreshed by it before they expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from botocore.exceptions import BotoCoreError

from gateway.settings.keeping import S3Target
from gateway.store.results import CHUNK, CopyWriter, ResultStore, ResultStoreError

PART_SIZE = 8 * 1024 * 1024  # S3 takes parts of 5 MiB or more, the last one excepted
TIMEOUT = 60.0  # seconds to connect, and between two reads of an answer
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class S3Results(ResultStore):
    def __init__(self, target: S3Target) -> None:
        self.target = target
        self._session: aiohttp.ClientSession | None = None
        self._credentials: Any = None

    async def open(self) -> None:
        import botocore.session

        try:
            self._credentials = await asyncio.to_thread(
                lambda: botocore.session.get_session().get_credentials()
            )
        except BotoCoreError as exc:  # a profile named that is not there, a failing process
            raise ResultStoreError(f"results_store: cannot read AWS credentials: {exc}") from None
        if self._credentials is None:
            raise ResultStoreError(
                "results_store: no AWS credentials found (set AWS_ACCESS_KEY_ID and"
                " AWS_SECRET_ACCESS_KEY, or a profile or web identity)"
            )
        # no bound on a whole answer: a copy read by a slow agent streams for as long as it reads
        bounds = aiohttp.ClientTimeout(total=None, sock_connect=TIMEOUT, sock_read=TIMEOUT)
        self._session = aiohttp.ClientSession(timeout=bounds)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, name: str = "", query: Mapping[str, str] | None = None) -> str:
        key = quote(self.target.prefix + name, safe="/-_.~") if name else ""
        url = f"{self.target.endpoint}/{self.target.bucket}/{key}"
        return url + ("?" + urlencode(sorted(query.items()), quote_via=quote) if query else "")

    async def _current(self) -> Any:
        """The credentials to sign with now: expiring ones (a web identity's last an hour)
        fetched again by botocore before they run out, off the loop (a refresh is a call)."""
        source = self._credentials
        refresh_needed = getattr(source, "refresh_needed", None)
        if refresh_needed is not None and refresh_needed():
            return await asyncio.to_thread(source.get_frozen_credentials)
        return source.get_frozen_credentials()

    def _signed(self, credentials: Any, method: str, url: str, body: bytes) -> dict[str, str]:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        payload = hashlib.sha256(body).hexdigest()
        request = AWSRequest(method, url, headers={"X-Amz-Content-SHA256": payload}, data=body)
        S3SigV4Auth(credentials, "s3", self.target.region).add_auth(request)
        return dict(request.headers.items())

    async def call(
        self, method: str, url: str, body: bytes = b"", *, ok: tuple[int, ...] = (200,)
    ) -> bytes:
        """One signed request read whole (the small XML answers of S3's API)."""
        async with self.send(method, url, body) as response:
            data: bytes = await response.read()
            if response.status not in ok:
                raise ResultStoreError(f"S3 {method} answered {response.status}")
            return data

    @contextlib.asynccontextmanager
    async def send(self, method: str, url: str, body: bytes) -> AsyncIterator[Any]:
        if self._session is None:
            raise ResultStoreError("the result store is not open")
        try:
            headers = self._signed(await self._current(), method, url, body)
        except BotoCoreError as exc:
            raise ResultStoreError(f"S3 credentials unavailable: {type(exc).__name__}") from None
        try:
            async with self._session.request(method, url, data=body, headers=headers) as answer:
                yield answer
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ResultStoreError(f"S3 {method} failed: {type(exc).__name__}") from None

    def writer(self, name: str) -> CopyWriter:
        return S3Writer(self, name)

    async def read(self, name: str) -> AsyncIterator[bytes]:
        async with self.send("GET", self.url(name), b"") as response:
            if response.status != 200:
                raise ResultStoreError(f"S3 GET of kept result {name} answered {response.status}")
            try:
                async for chunk in response.content.iter_chunked(CHUNK):
                    yield chunk
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ResultStoreError(f"S3 GET failed: {type(exc).__name__}") from None

    async def delete(self, name: str) -> None:
        await self.call("DELETE", self.url(name), ok=(200, 204, 404))

    async def names(self) -> list[str]:
        found: list[str] = []
        query = {"list-type": "2", "prefix": self.target.prefix}
        while True:
            root = _xml(await self.call("GET", self.url(query=query)))
            for key in root.iter(f"{NS}Key"):
                name = (key.text or "").removeprefix(self.target.prefix)
                if name and "/" not in name:
                    found.append(name)
            token = root.findtext(f"{NS}NextContinuationToken")
            if not token:
                return found
            query = {**query, "continuation-token": token}

    async def forget_partial(self, started_before: float) -> int:
        query = {"uploads": "", "prefix": self.target.prefix}
        root = _xml(await self.call("GET", self.url(query=query)))
        dropped = 0
        for upload in root.iter(f"{NS}Upload"):
            key, upload_id = upload.findtext(f"{NS}Key"), upload.findtext(f"{NS}UploadId")
            started = _instant(upload.findtext(f"{NS}Initiated") or "")
            if key and upload_id and started is not None and started < started_before:
                name = key.removeprefix(self.target.prefix)
                await self.call("DELETE", self.url(name, {"uploadId": upload_id}), ok=(204, 404))
                dropped += 1
        return dropped


class S3Writer(CopyWriter):
    """A multipart upload: parts sent as PART_SIZE bytes gather, completed at ``commit``."""

    def __init__(self, store: S3Results, name: str) -> None:
        self._store, self._name = store, name
        self._upload: str | None = None
        self._parts: list[str] = []  # ETags, in part order
        self._buffer = bytearray()

    async def write(self, chunk: bytes) -> None:
        self._buffer += chunk
        if len(self._buffer) >= PART_SIZE:
            await self._send_part()

    async def _send_part(self) -> None:
        store = self._store
        if self._upload is None:
            root = _xml(await store.call("POST", store.url(self._name, {"uploads": ""})))
            self._upload = root.findtext(f"{NS}UploadId")
            if not self._upload:
                raise ResultStoreError("S3 started no multipart upload")
        part, body = len(self._parts) + 1, bytes(self._buffer)
        self._buffer.clear()
        query = {"partNumber": str(part), "uploadId": self._upload}
        async with store.send("PUT", store.url(self._name, query), body) as response:
            await response.read()
            etag = response.headers.get("ETag")
            if response.status != 200 or not etag:
                raise ResultStoreError(f"S3 part upload answered {response.status}")
        self._parts.append(etag)

    async def commit(self) -> None:
        try:
            if self._buffer or not self._parts:
                await self._send_part()
            assert self._upload is not None
            parts = "".join(
                f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"
                for n, etag in enumerate(self._parts, 1)
            )
            body = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
            store = self._store
            url = store.url(self._name, {"uploadId": self._upload})
            answer = await store.call("POST", url, body)
            if b"<Error>" in answer:  # S3 may answer 200 and report the failure in the body
                raise ResultStoreError("S3 could not complete the upload")
        except ResultStoreError:
            await self.abort()
            raise

    async def abort(self) -> None:
        if self._upload is None:
            return
        store, upload, self._upload = self._store, self._upload, None
        with contextlib.suppress(ResultStoreError):
            await store.call("DELETE", store.url(self._name, {"uploadId": upload}), ok=(204, 404))


def _xml(data: bytes) -> ET.Element:
    try:
        return ET.fromstring(data)  # noqa: S314 - the operator's own storage endpoint
    except ET.ParseError:
        raise ResultStoreError("S3 answered with unreadable XML") from None


def _instant(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
