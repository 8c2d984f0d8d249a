"""Where an operation's story is read from, and the checks of what it is read from (SPEC 25,
"Audit across replicas").

On a store that keeps every replica's audit lines (PostgreSQL), a story is this replica's
file merged with the store's lines (the file's own lines, shipped a moment later, count
once), each line naming its replica; a store that fails leaves the file's lines, said so.
Elsewhere ``from_files`` merges files from several replicas, each file's chain verified
first. ``verify_chains`` checks every chain the store keeps as ``verify`` checks a file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gateway import StoreError
from gateway.core.story import Entry, merged, readable, unreadable_note
from gateway.observe.audit import (
    GENESIS,
    Verdict,
    link_problem,
    parse_line,
    read_lines,
    verify_file,
)
from gateway.observe.mirror import chain_of
from gateway.store.auditlines import AuditLines, Chain

VERIFY_PAGE = 5000  # lines read from the store at a time by verify_chains


def file_entries(path: Path, operation_id: str, replica: str) -> tuple[list[Entry], int]:
    """``operation_id``'s lines in one file, as ``replica``'s, and how many of its lines
    could not be told (``story.readable``; a complete line that is no JSON object counts
    when it names the operation; a torn tail, still being written, is skipped)."""
    if not path.exists():
        return [], 0
    chain = chain_of(path, replica) or f"file:{path}"
    found, unreadable = [], 0
    for raw in read_lines(path):
        line = parse_line(raw)
        if line is None:
            unreadable += raw.endswith(b"\n") and operation_id.encode() in raw
        elif line.get("operation_id") != operation_id:
            continue
        elif readable(line):
            found.append(Entry(replica, chain, line["seq"], line))
        else:
            unreadable += 1
    return found, unreadable


async def gathered(
    operation_id: str, *, path: Path | None, replica: str, lines: AuditLines | None
) -> tuple[list[Entry], str | None]:
    """The operation's lines from this replica's file and, when the store keeps them,
    every replica's, merged in time order; and a note saying why some are missing, if
    they are (the store's unavailable, lines that could not be told left out)."""
    local: list[Entry] = []
    unreadable, own = 0, None
    if path is not None:  # a large file: read it off the event loop
        local, unreadable = await asyncio.to_thread(file_entries, path, operation_id, replica)
        own = await asyncio.to_thread(chain_of, path, replica)
    if lines is None:
        return local, unreadable_note(unreadable)
    try:
        kept = await lines.of_operation(operation_id)
    except StoreError as exc:
        said = f"only this replica's lines: the store's are unavailable ({exc})"
        return merged(local), "; ".join(filter(None, [said, unreadable_note(unreadable)]))
    stored = []
    for row in kept:
        line = parse_line(row.line)
        if line is not None and readable(line):
            stored.append(Entry(row.replica, row.chain, row.seq, line))
        elif row.chain != own:  # this file's own lines were counted as the file was read
            unreadable += 1
    return merged([*local, *stored]), unreadable_note(unreadable)


@dataclass(frozen=True)
class FileProblem:
    path: Path
    problem: str


def from_files(
    paths: Iterable[Path], operation_id: str, key: bytes | None
) -> tuple[list[Entry], list[FileProblem]]:
    """The operation's lines from several replicas' files, merged in time order, each file
    named by its name (its path when two names are alike); a file that cannot be read or
    whose chain is broken gives a problem instead of lines."""
    paths = list(paths)
    names = [path.name for path in paths]
    entries: list[Entry] = []
    problems: list[FileProblem] = []
    for path in paths:
        label = path.name if names.count(path.name) == 1 else str(path)
        try:
            verdict = verify_file(path, key)
            if not verdict.intact:
                said = f"chain broken at seq {verdict.bad_seq}: {verdict.problem}"
                problems.append(FileProblem(path, said))
                continue
            entries += file_entries(path, operation_id, label)[0]  # the chain is intact
        except OSError as exc:
            problems.append(FileProblem(path, f"cannot read ({exc.strerror or exc})"))
    return merged(entries), problems


@dataclass(frozen=True)
class ChainVerdict:
    chain: Chain
    verdict: Verdict
    first: int | None  # the seq the kept run starts at (the lines before it were purged)


async def verify_chains(lines: AuditLines, key: bytes | None) -> list[ChainVerdict]:
    """Every chain the store keeps, verified as its file would be: from its oldest kept line
    (anchored there), every line's hash and seq, the columns it is looked up by, and the
    last line shipped still there."""
    return [await verify_chain(lines, chain, key) for chain in await lines.chains()]


async def verify_chain(lines: AuditLines, chain: Chain, key: bytes | None) -> ChainVerdict:
    prev, expected, count, first, after = GENESIS, 1, 0, None, 0
    while True:
        page = await lines.lines(chain.chain, after, VERIFY_PAGE)
        for row in page:
            line = parse_line(row.line)
            if first is None:
                first = row.seq
                if line is not None and row.seq > 1:  # the run starts where it starts
                    prev, expected = str(line.get("prev")), row.seq
            problem = _row_problem(row.seq, row.operation_id, line, prev, expected, key)
            if problem is not None:
                return ChainVerdict(chain, Verdict(count, expected, problem), first)
            assert line is not None
            prev, expected, count = str(line["hash"]), expected + 1, count + 1
        if len(page) < VERIFY_PAGE:
            break
        after = page[-1].seq
    if expected - 1 != chain.last_seq:
        missing = f"lines from seq {expected} on are missing (shipped up to seq {chain.last_seq})"
        return ChainVerdict(chain, Verdict(count, expected, missing), first)
    return ChainVerdict(chain, Verdict(count), first)


def _row_problem(
    seq: int,
    operation_id: str | None,
    line: dict[str, object] | None,
    prev: str,
    expected: int,
    key: bytes | None,
) -> str | None:
    if line is None:
        return f"the line kept for seq {seq} is not a JSON object"
    if line.get("seq") != seq or line.get("operation_id") != operation_id:
        return f"the row of seq {seq} does not match its line (altered)"
    return link_problem(dict(line), prev, expected, key)
