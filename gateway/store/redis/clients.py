"""The Redis store's clients, and the one boundary where a driver failure becomes a
StoreError (``call``). Clients are redis-py's, with commands packed by hiredis
(``PackedConnection``) and no CLIENT SETINFO handshake: for one Redis, a blocking pool for
the store's calls and a pool of one for the hot path's pipelines; or a cluster client.

Builds clients and translates errors; it connects to nothing (redis-py connects on first
use) and holds no state.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.utils import HIREDIS_AVAILABLE

from gateway import StatusgateError, StoreError

HIREDIS = HIREDIS_AVAILABLE  # redis-py's own check: hiredis >= 3.2 importable


class PackedConnection(aioredis.Connection):
    """redis-py's asyncio connection packs a command argument by argument in Python; its
    sync connection packs with hiredis (a dependency: ``redis[hiredis]``) through this same
    serializer. A poll's scripts carry dozens of arguments: packing them in Python measured
    the largest part of the Redis store's own cost a forwarded poll. Without hiredis (or one
    older than redis-py accepts) it packs as redis-py does. ``rediss://`` and ``unix://``
    URLs keep redis-py's own connection classes."""

    # redis-py 8.2 packs with hiredis itself and left the class untyped; 8.1 typed it
    _packer: Any = cast(Any, HiredisRespSerializer)()

    def pack_command(self, *args: Any) -> list[bytes]:
        encoder = self.encoder
        if not HIREDIS or encoder.encoding != "utf-8" or encoder.encoding_errors != "strict":
            return super().pack_command(*args)  # hiredis writes UTF-8, strictly, only
        packed: list[bytes] = self._packer.pack(*args)
        return packed


# No CLIENT SETINFO on each new connection: one round trip less, and under a connect
# timeout redis-py 8.1's cluster client could fail in that handshake with an AttributeError
# (seen once in CI, 10,000 creates on a loaded machine) instead of a connection error.
QUIET_CONNECT: dict[str, Any] = {"driver_info": None}


def cluster_client(
    cluster: list[tuple[str, int]], max_connections: int, timeout: float
) -> RedisCluster:
    """A cluster client that discovers the nodes from ``cluster``'s (host, port)."""
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in cluster],
        max_connections=max_connections,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1),
        **QUIET_CONNECT,
    )


def single_clients(
    url: str, max_connections: int, timeout: float
) -> tuple[aioredis.Redis, aioredis.Redis]:
    """(the store's client, the hot path's client on a pool of one connection) for ``url``."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        connection_class=PackedConnection,
        max_connections=max_connections,
        timeout=timeout,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1),
        **QUIET_CONNECT,
    )
    own = aioredis.ConnectionPool.from_url(
        url,
        connection_class=PackedConnection,
        max_connections=1,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        # opening the connection (connect and handshake) again once on a connection
        # error; Turns never sends a pipeline twice: once written it may have run,
        # and its scripts must not run twice (see turns.py)
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        **QUIET_CONNECT,
    )
    return aioredis.Redis(connection_pool=pool), aioredis.Redis(connection_pool=own)


async def call(operation: str, work: Any) -> Any:
    """Await one driver call; every failure of the driver becomes StoreError here.

    Not only redis-py's own errors: while a cluster fails over, the client tears down
    connections other tasks are reading (``aclose`` on CLUSTERDOWN) and they fail with
    RuntimeError, AttributeError, IndexError or KeyError from asyncio and the client's
    bookkeeping. Whatever the type, the store did not answer: fail closed (503)."""
    try:
        return await work
    except StatusgateError:
        raise
    except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
        raise StoreError(f"redis {operation}: {type(exc).__name__}", operation=operation) from exc
    except Exception as exc:  # the driver broken under us: see the docstring
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # a cancellation the client turned into an error of its own stays one
            raise asyncio.CancelledError from exc
        raise StoreError(
            f"redis {operation}: {type(exc).__name__} in the client", operation=operation
        ) from exc
