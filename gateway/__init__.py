"""Statusgate: a policy gateway between AI agents and asynchronous provider jobs.

The package's root holds its version and its one exception tree (the base layer every
sub-package may import):

    StatusgateError
     +-- ConfigError             a config or policy file is wrong: "file: field: message" lines
     +-- StoreError              the store is unreachable or failed; the gateway fails closed (503)
     |    +-- AuditUnavailable       the audit log cannot be written (a full disk): no new work
     +-- NotAdmissible           the store's clock refused to spend a status request now
     +-- UpstreamError           one request to a provider did not produce a usable answer
          +-- UpstreamTimeout        no complete answer within limits.upstream_timeout
          +-- UpstreamUnavailable    connection failed; ``sent`` says whether the request may
          |                          have reached the provider
          +-- UpstreamBodyTooLarge   the answer exceeded limits.max_response_body (decompressed)

Driver exceptions (sqlite3, redis, aiohttp) are translated into these at the store and upstream
boundaries; nothing above those layers sees a driver type.
"""

from __future__ import annotations

__version__ = "0.2.0"


class StatusgateError(Exception):
    """Base of every error the gateway raises on purpose."""


class ConfigError(StatusgateError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class StoreError(StatusgateError):
    """The store could not be reached or refused the operation; ``operation`` names the
    store call (a metric label)."""

    def __init__(self, message: str, *, operation: str = "unknown") -> None:
        super().__init__(message)
        self.operation = operation


class AuditUnavailable(StoreError):
    """The audit log cannot be written (a full disk, a file size limit): the gateway takes
    no new work until it can, so nothing happens that its audit log would not show. A
    store error because the answer is the same: 503 with Retry-After, nothing forwarded."""

    def __init__(self) -> None:
        super().__init__("the audit log cannot be written", operation="audit")


class NotAdmissible(StatusgateError):
    """A write that spends a status request was refused by the store's own checks (by its
    clock the poll is not due, or it is past the deadline); the caller answers too-early."""


class UpstreamError(StatusgateError):
    """A provider request failed before a complete, usable answer arrived."""


class UpstreamTimeout(UpstreamError):
    pass


class UpstreamUnavailable(UpstreamError):
    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class UpstreamBodyTooLarge(UpstreamError):
    pass
