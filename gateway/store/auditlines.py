"""The audit lines a shared store keeps for every replica (SPEC 25, "Audit across replicas"):
the capability, its rows, and nothing about how a backend keeps them.

A replica's audit file is the source of truth; a store with this capability (PostgreSQL)
keeps a copy of each file's lines, one chain a file, so an operation's story can be told
from every replica's lines at once and each copy verified as the file is. Stores without it
(memory, SQLite, Redis) have ``Store.audit_lines`` None: ``audit story --from FILE...``
merges the files instead.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ShippedLine:
    """One audit line as shipped: its seq, instant and operation (what it is looked up by)
    and its text exactly as the file holds it, without the newline."""

    seq: int
    at: float
    operation_id: str | None
    line: str


@dataclass(frozen=True, slots=True)
class KeptLine:
    """One audit line as kept: the chain and replica it came from, and its text."""

    chain: str
    replica: str
    seq: int
    line: str


@dataclass(frozen=True, slots=True)
class Chain:
    """One chain the store keeps: its id, its replica, and the last seq shipped into it."""

    chain: str
    replica: str
    last_seq: int


@dataclass(frozen=True, slots=True)
class RowLine:
    """A kept line with the columns it is looked up by, for ``verify`` to check them."""

    seq: int
    operation_id: str | None
    line: str


class AuditLines(abc.ABC):
    """Every replica's audit lines. Writes are idempotent (a line shipped twice is kept
    once), so a shipper that is not sure a batch arrived sends it again."""

    @abc.abstractmethod
    async def ship(self, chain: str, replica: str, lines: list[ShippedLine]) -> None:
        """Keep ``lines`` (in seq order) of ``chain``, written by ``replica``, and move the
        chain's last shipped seq to the last of them, in one write."""

    @abc.abstractmethod
    async def last_seq(self, chain: str) -> int | None:
        """The last seq shipped into ``chain``; None when nothing has been."""

    @abc.abstractmethod
    async def of_operation(self, operation_id: str) -> list[KeptLine]:
        """Every replica's lines about ``operation_id``."""

    @abc.abstractmethod
    async def chains(self) -> list[Chain]:
        """Every chain kept, by replica name."""

    @abc.abstractmethod
    async def lines(self, chain: str, after: int, limit: int) -> list[RowLine]:
        """Up to ``limit`` lines of ``chain`` with a seq past ``after``, in seq order."""

    @abc.abstractmethod
    async def purge(self, written_before: float, limit: int) -> int:
        """Forget lines written before ``written_before`` whose operation the store no
        longer keeps, from the start of each chain only (so what is kept is one unbroken
        run of each chain, still verifiable), never a chain's last line; at most ``limit``
        a chain. How many went."""
