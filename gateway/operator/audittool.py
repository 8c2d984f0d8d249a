"""``statusgate audit verify`` and ``statusgate audit story``: what they read, what they
print, their exit codes (SPEC 1, 8 and 25).

- ``verify PATH... [--config F] [--key-env NAME]``: each file's chain; with ``--config``
  also the config's audit file and, on a store that keeps every replica's lines
  (PostgreSQL), each chain kept there. Exit 1 naming the first bad seq of any.
- ``story --config F OP``: this replica's file and, on PostgreSQL, every replica's lines,
  merged in time order, each naming its replica (the file's alone, said so, when the
  database cannot be read). ``story --from FILE... OP``: several replicas' files merged,
  each file's chain verified first (a broken one is named, and nothing is told).

Printing and exit codes only; the reading is in ``gateway.observe.stories``. A problem a
user can cause is one line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from gateway import ConfigError, StoreError
from gateway.core.story import Entry, told, unreadable_note
from gateway.observe import stories
from gateway.observe.audit import Verdict, continues, verify_file
from gateway.observe.mirror import replica_name
from gateway.settings.config import GatewayFile, audit_path, load_gateway_file, resolved_store_url
from gateway.store import Store, store_from_url


@dataclass(frozen=True)
class Request:
    """What an audit command was asked: files, a config, a key's variable, an operation."""

    paths: list[Path]
    config: Path | None
    key_env: str | None
    operation_id: str = ""


def key_of(request: Request, gateway: GatewayFile | None, command: str) -> bytes | None:
    """The HMAC key: ``--key-env``'s variable, else the config's ``audit.hmac_key_env``."""
    name = request.key_env or (gateway.audit.hmac_key_env if gateway is not None else None)
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError([f"statusgate audit {command}: {name} is not set"])
    return value.encode()


def _gateway(request: Request) -> GatewayFile | None:
    return load_gateway_file(request.config) if request.config is not None else None


def _store(request: Request, gateway: GatewayFile) -> Store:
    assert request.config is not None
    return store_from_url(resolved_store_url(gateway.store, request.config.parent.resolve()))


# -- verify -------------------------------------------------------------------------------
def verify_command(request: Request) -> int:
    gateway = _gateway(request)
    key = key_of(request, gateway, "verify")
    paths = list(request.paths)
    store = None
    if gateway is not None and request.config is not None:
        own = audit_path(gateway, request.config.parent.resolve())
        if own is not None and own.exists() and own not in paths:
            paths.append(own)
        store = _store(request, gateway)
        if store.audit_lines is None and not paths:
            kind = gateway.store.split(":", 1)[0]
            print(f"{request.config}: the {kind} store keeps no audit lines and no audit file")
            return 1
    if not paths and store is None:
        print("statusgate audit verify: name audit files, or --config F", file=sys.stderr)
        return 1
    failed = not _verify_files(paths, key)
    if store is not None and store.audit_lines is not None:
        failed = not asyncio.run(_verify_store(store, key)) or failed
    return 1 if failed else 0


def _verify_files(paths: list[Path], key: bytes | None) -> bool:
    """Each file, one line each; a file that starts past seq 1 (it continues a rotated
    file) is verified from its first line, and against the file named with it that ends
    just before it, if one is. False when any is broken or unreadable."""
    verdicts: dict[Path, Verdict] = {}
    intact = True
    for path in paths:
        try:
            verdicts[path] = verify_file(path, key)
        except OSError as exc:
            print(f"{path}: cannot read ({exc.strerror})", file=sys.stderr)
            intact = False
    for path, verdict in verdicts.items():
        said = _verdict_said(verdict, _before(verdict, verdicts))
        print(f"{path}: {said}")
        intact = intact and "chain broken" not in said
    return intact


def _before(verdict: Verdict, verdicts: dict[Path, Verdict]) -> tuple[Path, bool] | None:
    """The named file that ends just before ``verdict``'s run starts, and whether the run
    takes up its last line's hash; None when no named file ends there. Several may end
    there (other replicas' files, rotated at the same seq): the one it takes up wins."""
    found: tuple[Path, bool] | None = None
    for other, earlier in verdicts.items():
        linked = continues(verdict, earlier) if earlier.intact else None
        if linked:
            return other, linked
        if linked is not None and found is None:
            found = other, linked
    return found


def _verdict_said(verdict: Verdict, before: tuple[Path, bool] | None) -> str:
    if not verdict.intact:
        return f"chain broken at seq {verdict.bad_seq}: {verdict.problem}"
    if before is not None and not before[1]:
        return (
            f"chain broken at seq {verdict.start}: its prev is not the hash of seq"
            f" {verdict.start - 1} in {before[0]}"
        )
    start = ""
    if verdict.start > 1:
        where = f"continues {before[0]}" if before else "continues a rotated file not named here"
        start = f" from seq {verdict.start} ({where})"
    tail = ""
    if verdict.torn_tail:
        tail = f"; torn final line after seq {verdict.start + verdict.records - 1}"
        tail += " (an interrupted write)"
    return f"{verdict.records} records{start}, chain intact{tail}"


async def _verify_store(store: Store, key: bytes | None) -> bool:
    """Each chain the store keeps, one line each; False when one is broken or the store
    cannot be read."""
    try:
        await store.open()
        assert store.audit_lines is not None
        verdicts = await stories.verify_chains(store.audit_lines, key)
    except StoreError as exc:
        print(f"statusgate audit verify: {exc}", file=sys.stderr)
        return False
    finally:
        await store.close()
    if not verdicts:
        print("postgresql store: no audit lines kept yet")
    intact = True
    for found in verdicts:
        name = f"postgresql audit chain of {found.chain.replica} ({found.chain.chain})"
        verdict = found.verdict
        if not verdict.intact:
            print(f"{name}: chain broken at seq {verdict.bad_seq}: {verdict.problem}")
            intact = False
            continue
        start = ""
        if found.first is not None and found.first > 1:
            start = f" from seq {found.first} (the lines before were purged or never shipped)"
        print(f"{name}: {verdict.records} records{start}, chain intact")
    return intact


# -- story --------------------------------------------------------------------------------
def story_command(request: Request) -> int:
    gateway = _gateway(request)
    if request.paths:
        return _story_of_files(request, key_of(request, gateway, "story"))
    if gateway is None or request.config is None:
        print("statusgate audit story: give --config F, or --from FILE...", file=sys.stderr)
        return 1
    path = audit_path(gateway, request.config.parent.resolve())
    store = _store(request, gateway)
    if store.audit_lines is None:
        if path is None:
            print(f"{request.config}: audit.path: no audit log is configured", file=sys.stderr)
            return 1
        if not path.exists():
            print(f"{path}: no audit log yet", file=sys.stderr)
            return 1
        entries, unreadable = stories.file_entries(path, request.operation_id, "")
        if unreadable:
            print(unreadable_note(unreadable), file=sys.stderr)
        return _tell(entries, named=False, where=str(path), operation_id=request.operation_id)
    replica = replica_name(gateway.audit.replica)
    entries = asyncio.run(_gather(store, request.operation_id, path, replica))
    return _tell(entries, named=True, where="the store", operation_id=request.operation_id)


async def _gather(store: Store, operation_id: str, path: Path | None, replica: str) -> list[Entry]:
    try:
        await store.open()
    except StoreError as exc:
        await store.close()
        print(f"only this replica's lines: the store is unavailable ({exc})", file=sys.stderr)
        found, _ = await stories.gathered(operation_id, path=path, replica=replica, lines=None)
        return found
    try:
        found, note = await stories.gathered(
            operation_id, path=path, replica=replica, lines=store.audit_lines
        )
    finally:
        await store.close()
    if note is not None:
        print(note, file=sys.stderr)
    return found


def _story_of_files(request: Request, key: bytes | None) -> int:
    entries, problems = stories.from_files(request.paths, request.operation_id, key)
    for problem in problems:
        print(f"{problem.path}: {problem.problem}", file=sys.stderr)
    if problems:
        print("statusgate audit story: not told (a file above cannot be trusted)", file=sys.stderr)
        return 1
    where = ", ".join(str(path) for path in request.paths)
    return _tell(entries, named=True, where=where, operation_id=request.operation_id)


def _tell(entries: list[Entry], *, named: bool, where: str, operation_id: str) -> int:
    if not entries:
        print(f"{where}: no events for {operation_id}", file=sys.stderr)
        return 1
    for line in told(entries, named=named):
        print(line)
    return 0
