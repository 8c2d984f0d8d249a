"""The aiohttp internals the agent lane (gateway/http/lane/) leans on, named in one place.

The lane writes answers with aiohttp's own header serializer and registers its connections
with aiohttp's server so the runner stops both alike; neither is aiohttp's public API, so
pyproject.toml bounds aiohttp below the next minor version, and this test says which
internal moved when a new aiohttp is tried. How aiohttp reads a head (its C parser's field
limits, upgrades, a FIN) is behaviour, compared on real sockets by tests/http/test_lane.py.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

from multidict import CIMultiDict

LANE = Path(__file__).resolve().parents[2] / "gateway" / "http" / "lane"
PUBLIC = ("aiohttp.web", "aiohttp.hdrs", "aiohttp.abc")  # aiohttp's public API: not internals


def _source(thing: Any) -> str:
    return inspect.getsource(thing)


def _serialized(serialize: Callable[[str, CIMultiDict[str]], bytes]) -> bool:
    head = serialize("HTTP/1.1 200 OK", CIMultiDict([("X-A", "b"), ("X-A", "c")]))
    return head == b"HTTP/1.1 200 OK\r\nX-A: b\r\nX-A: c\r\n\r\n"


def _empty_bodies(empty: Callable[[str, int], bool]) -> bool:
    cases = {("GET", 200): False, ("HEAD", 200): True, ("GET", 204): True, ("GET", 304): True}
    return all(empty(method, code) is want for (method, code), want in cases.items())


def _no_length(remove: Callable[[str, int], bool]) -> bool:
    cases = {("GET", 200): False, ("HEAD", 200): False, ("GET", 204): True, ("GET", 101): True}
    return all(remove(method, code) is want for (method, code), want in cases.items())


def _has(*names: str) -> Callable[[Any], bool]:
    return lambda thing: all(callable(getattr(thing, name, None)) for name in names)


# (module, name): what the lane uses it for, and a check that it still does that
INTERNALS: dict[tuple[str, str], tuple[str, Callable[[Any], bool]]] = {
    ("aiohttp.http_writer", "_serialize_headers"): (
        "the status line and header fields of every answer, as aiohttp writes them",
        _serialized,
    ),
    ("aiohttp.helpers", "must_be_empty_body"): (
        "which answers carry no body (HEAD, 1xx, 204, 304)",
        _empty_bodies,
    ),
    ("aiohttp.helpers", "should_remove_content_length"): (
        "which bodiless answers drop Content-Length",
        _no_length,
    ),
    ("aiohttp.helpers", "rfc822_formatted_time"): (
        "the Date header",
        lambda f: re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", f()) is not None,
    ),
    ("aiohttp.http", "SERVER_SOFTWARE"): (
        "the Server header",
        lambda value: isinstance(value, str) and "aiohttp/" in value,
    ),
    ("aiohttp.http_parser", "SINGLETON_HEADERS"): (
        "the header fields a request may not carry twice (lower-case names)",
        lambda names: {"host", "content-type", "content-length"} <= set(names),
    ),
    ("aiohttp.tcp_helpers", "tcp_nodelay"): (
        "TCP_NODELAY on each connection, as aiohttp sets it",
        lambda f: list(inspect.signature(f).parameters) == ["transport", "value"],
    ),
    ("aiohttp.web_protocol", "RequestHandler"): (
        "aiohttp's connection handler, to which the lane hands or relays a connection",
        lambda cls: (
            _has(
                "connection_made",
                "data_received",
                "eof_received",
                "connection_lost",
                "pause_writing",
                "resume_writing",
                "close",
                "shutdown",
            )(cls)
            and "keepalive_timeout" in inspect.signature(cls).parameters
        ),
    ),
    ("aiohttp.web_server", "Server"): (
        "the runner's server: lane connections registered with it (connection_made and"
        " connection_lost, reading the handler's _task_handler), stopped by its pre_shutdown"
        " (close()) and shutdown (shutdown(timeout)), handlers made by calling it",
        lambda cls: (
            _has("connection_made", "connection_lost", "pre_shutdown", "__call__")(cls)
            and "_task_handler" in _source(cls.connection_lost)
            and ".close()" in _source(cls.pre_shutdown)
            and ".shutdown(timeout)" in _source(cls.shutdown)
        ),
    ),
    ("aiohttp.web_runner", "BaseSite"): (
        "the site the lane's listener is: _runner, _backlog, and _server (the listener,"
        " which the runner's addresses and the site's stop read)",
        lambda cls: (
            {"_runner", "_backlog", "_server"} <= set(cls.__slots__)
            and "._server.close()" in _source(cls.stop)
        ),
    ),
    ("aiohttp.web_runner", "BaseRunner"): (
        "the runner: its server, and the addresses of its sites (site._server.sockets)",
        lambda cls: "site._server" in _source(cls.addresses.fget) and hasattr(cls, "server"),
    ),
}


def _lane_imports() -> set[tuple[str, str]]:
    """Every ``from aiohttp.<module> import <name>`` in the lane (aiohttp and aiohttp.web,
    aiohttp's public face, aside)."""
    found = set()
    for path in [*LANE.glob("*.py"), LANE.with_suffix(".py")]:
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            if node.module.startswith("aiohttp.") and node.module not in PUBLIC:
                found.update((node.module, alias.name) for alias in node.names)
    return found


def test_every_aiohttp_internal_the_lane_uses_is_where_it_was() -> None:
    """Each aiohttp internal the lane uses is named here with what it is used for, and is
    where it was, doing what it did; a failure names the internal that moved, and a lane
    import of aiohttp not named here is one too."""
    problems = []
    for (module, name), (use, works) in INTERNALS.items():
        where = f"{module}.{name} ({use})"
        try:
            thing = getattr(import_module(module), name)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{where}: gone: {exc}")
            continue
        try:
            if not works(thing):
                problems.append(f"{where}: no longer does what the lane needs")
        except Exception as exc:
            problems.append(f"{where}: its check failed: {exc!r}")
    for module, name in sorted(_lane_imports() - set(INTERNALS)):
        problems.append(f"{module}.{name}: the lane imports it, but INTERNALS does not name it")
    assert not problems, "aiohttp internals the lane uses:\n" + "\n".join(problems)
