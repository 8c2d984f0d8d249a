"""Shared fixtures: a fake clock, the real demo provider on loopback, a real gateway.

The gateway and the demo provider share one FakeClock, so scheduling is exact and no test
sleeps to wait for a poll window; HTTP still goes over real sockets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from gateway.core.models import DelaySource, OperationRecord
from gateway.demo.env import demo_env
from gateway.demo.pack import doubles
from gateway.demo.provider import DemoProvider
from gateway.flow.runtime import RUNTIME
from gateway.run.app import create_app
from gateway.run.server import agent_site
from gateway.settings.config import load_settings
from gateway.store import Store, store_from_url

# No property test has a deadline: a per-example time limit is a timing assert, and fails
# on a loaded machine (a CI runner, the suite beside a benchmark) for no fault of the code.
hypothesis.settings.register_profile("statusgate", deadline=None)
hypothesis.settings.load_profile("statusgate")

ROOT = Path(__file__).resolve().parent.parent
AGENT_TOKEN = "agent-token-team-a"
OTHER_TOKEN = "agent-token-team-b"
OPERATOR_TOKEN = "operator-token-alice"
PROVIDER_KEY = "sk-provider-secret-4f9a"
START = 1_800_000_000.0
# every credential the shipped policies read, set to the demo provider's key
PROVIDER_ENV = {**demo_env(ROOT / "policies", PROVIDER_KEY), "DEMO_API_KEY": PROVIDER_KEY}
# The pack's shipped policies read credentials of their own (GEMINI_API_KEY,
# AWS_ACCESS_KEY_ID...). Every test process has them, set to the provider key, so a test that
# loads every shipped policy (a gateway process, a reload, check) still needs to set only
# DEMO_API_KEY, as before the pack; a developer's own values never reach a test.
os.environ.update({k: v for k, v in PROVIDER_ENV.items() if k != "DEMO_API_KEY"})
# Shipped policies with a double whose own tests drive the real server at the upstream's
# root (moto, a Celery worker with Flower): write_config leaves their upstream as given.
REAL_SERVERS = ("aws-transcribe", "celery-flower")


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """The gateway's sleeper in tests: time passes at once."""
        self.advance(seconds)
        await asyncio.sleep(0)


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def write_config(
    folder: Path,
    upstream: str,
    *,
    store: str = "memory://",
    policy_changes: dict[str, dict[str, Any]] | None = None,
    config_changes: dict[str, Any] | None = None,
) -> Path:
    """A config folder using the repository's policies, pointed at ``upstream`` (the demo
    provider): the pack's policies at their doubles, mounted under ``/<provider>``."""
    policies = folder / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    for source in (ROOT / "policies").glob("*.yaml"):
        data = yaml.safe_load(source.read_text())
        pack = data["provider"] in doubles() and data["provider"] not in REAL_SERVERS
        data["upstream"] = f"{upstream}/{data['provider']}" if pack else upstream
        data = merge(data, (policy_changes or {}).get(data["provider"], {}))
        (policies / source.name).write_text(yaml.safe_dump(data))
    config = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "public_base_url": "http://gateway.test",
        "store": store,
        "policies_dir": "policies",
        "accounts": [
            {"id": "team-a", "token_sha256": [sha(AGENT_TOKEN)], "providers": ["*"]},
            {"id": "team-b", "token_sha256": sha(OTHER_TOKEN), "providers": ["demo-jobs"]},
        ],
        "operators": [{"id": "alice", "token_sha256": sha(OPERATOR_TOKEN)}],
        "limits": {"max_request_body": "64KiB", "max_response_body": "64KiB"},
        "audit": {"path": "audit.jsonl"},
    }
    config = merge(config, config_changes or {})
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Harness:
    """A real gateway in front of the real demo provider, both on loopback."""

    def __init__(
        self, client: TestClient[Any, Any], provider: DemoProvider, clock: FakeClock | None
    ) -> None:
        self.client = client
        self.provider = provider
        self._clock = clock

    @property
    def clock(self) -> FakeClock:
        assert self._clock is not None, "this harness runs on real time"
        return self._clock

    def auth(self, token: str = AGENT_TOKEN, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", **extra}

    async def submit(
        self,
        script: list[dict[str, Any]] | None = None,
        *,
        provider: str = "demo-jobs",
        path: str = "/v1/jobs",
        key: str | None = "key-1",
        token: str = AGENT_TOKEN,
        submit: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        payload: dict[str, Any] = dict(body or {"input": "report.pdf"})
        if script is not None:
            payload["demo_script"] = script
        if submit is not None:
            payload["demo_submit"] = submit
        headers = self.auth(token)
        if key is not None:
            headers["Idempotency-Key"] = key
        return await self.client.post(f"/p/{provider}{path}", json=payload, headers=headers)

    async def poll(
        self,
        job_id: str,
        *,
        provider: str = "demo-jobs",
        path: str = "/v1/jobs/{job_id}",
        **kw: Any,
    ) -> Any:
        headers = {**self.auth(kw.pop("token", AGENT_TOKEN)), **kw.pop("headers", {})}
        return await self.client.get(
            f"/p/{provider}{path.format(job_id=job_id)}", headers=headers, **kw
        )

    async def poll_when_due(self, job_id: str, **kw: Any) -> Any:
        """Wait (on the fake clock) until the gateway permits the next poll, then poll."""
        record = await self.record(job_id, kw.get("provider", "demo-jobs"))
        if self._clock is None:  # real time: wait for it
            now = self.client.app[RUNTIME].clock()
            await asyncio.sleep(max(0.0, record.next_poll_at - now) + 0.01)
        elif record.next_poll_at > self._clock.now:
            self._clock.now = record.next_poll_at
        return await self.poll(job_id, **kw)

    async def record(
        self, job_id: str, provider: str = "demo-jobs", account: str = "team-a"
    ) -> OperationRecord:
        runtime = self.client.app[RUNTIME]
        record = await runtime.store.find(account, provider, job_id)
        assert record is not None
        return record

    @property
    def audit_path(self) -> Path:
        path = self.client.app[RUNTIME].settings.audit_path
        assert path is not None
        return path

    def audit_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]

    def provider_calls(self, job_id: str, method: str = "GET") -> list[dict[str, Any]]:
        return [e for e in self.provider.log if e["job_id"] == job_id and e["method"] == method]


async def start_harness(
    folder: Path,
    clock: FakeClock | None,
    demo: DemoProvider,
    *,
    upstream: str,
    policy_changes: dict[str, dict[str, Any]] | None = None,
    config_changes: dict[str, Any] | None = None,
    store: Store | None = None,
    store_url: str = "memory://",
) -> Harness:
    """A started gateway (real aiohttp server) in front of ``upstream``; close its client.

    With ``clock=None`` the gateway keeps the store's own time (real time; Redis time for
    a Redis store)."""
    path = write_config(
        folder,
        upstream,
        store=store_url,
        policy_changes=policy_changes,
        config_changes=config_changes,
    )
    settings = load_settings(path, env={**os.environ, **PROVIDER_ENV})
    if store is None and settings.store_url.startswith("postgresql"):
        await migrated(settings.store_url)
    the_store = store if store is not None else store_from_url(settings.store_url)
    app: web.Application = create_app(
        settings,
        store=the_store,
        clock=clock,
        rng=random.Random(7),
        sleep=clock.sleep if clock is not None else None,
    )
    client: TestClient[Any, Any] = TestClient(AgentServer(app, host="127.0.0.1"))
    await client.start_server()
    return Harness(client, demo, clock)


class AgentServer(TestServer):
    """aiohttp's TestServer listening as ``statusgate serve``'s agent listener does: agents'
    calls on the lane (gateway/http/lane/), every other path on aiohttp's server."""

    async def start_server(self, loop: asyncio.AbstractEventLoop | None = None, **kw: Any) -> None:
        if self.runner:
            return
        self._loop = loop
        self.runner = runner = await self._make_runner(handler_cancellation=True, **kw)
        await runner.setup()
        site = agent_site(runner, self.host, 0)  # type: ignore[arg-type]
        await site.start()
        self.port = site.port
        self.scheme = "http"
        self._root = URL(f"http://{self.host}:{self.port}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_up(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def start_statusgate(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m gateway.run ARGS`` as a real process; stderr is kept for the test to read."""
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.run", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def run_statusgate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m gateway.run ARGS`` run to its end with every shipped policy's credential
    set; its output as text, its exit status unchecked (the test reads both)."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.run", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **PROVIDER_ENV},
        timeout=timeout,
        check=False,
    )


def stop_statusgates(processes: list[subprocess.Popen[bytes]], wait: float) -> None:
    """Terminate gateway processes (a paused one resumed first) and wait for each; none
    may have printed a traceback."""
    for process in processes:
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
    for process in processes:
        process.wait(wait)
        stderr = process.stderr.read().decode() if process.stderr else ""
        assert "Traceback" not in stderr, stderr


class RedisServer:
    """A private redis-server on a free loopback port, stoppable and restartable."""

    def __init__(self, data_dir: Path | None = None) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        persistence = ["--appendonly", "no"]
        if self.data_dir is not None:  # keep data across a stop and start
            self.data_dir.mkdir(parents=True, exist_ok=True)
            persistence = ["--appendonly", "yes", "--appendfsync", "always"]
            persistence += ["--dir", str(self.data_dir)]
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        self.process = subprocess.Popen(
            [*command, "--save", "", *persistence],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.1),
            ):
                return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        """SIGTERM, and again if it has not ended within a second: a redis-server sent
        SIGTERM in the milliseconds after a replica's first AOF rewrite was seen to let it
        pass unlogged, and to end on a second one."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(1)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                self.process.wait(5)
            self.process = None


Exported = list[tuple[dict[str, str], bytes]]


@contextlib.asynccontextmanager
async def otlp_receiver(*, busy_once: bool = False) -> AsyncIterator[tuple[Exported, str]]:
    """A real OTLP/HTTP receiver on loopback: every export request as (headers with
    lower-case names, body as sent), and its base URL. ``busy_once``: the first export is
    answered 503 with ``Retry-After: 0``."""
    got: Exported = []

    async def export(request: web.Request) -> web.Response:
        got.append(({k.lower(): v for k, v in request.headers.items()}, await request.read()))
        if busy_once and len(got) == 1:
            return web.Response(status=503, headers={"Retry-After": "0"})
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield got, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


class RedisCluster3:
    """A private Redis Cluster of three primaries on free loopback ports (no replicas), the
    16384 slots split evenly; what ``redis+cluster://`` is tested against."""

    def __init__(self, folder: Path, node_timeout_ms: int | None = None) -> None:
        self.folder = folder
        self.node_timeout_ms = node_timeout_ms
        self.servers: list[tuple[int, subprocess.Popen[bytes]]] = []

    @property
    def nodes(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port, _ in self.servers)

    def start(self) -> None:
        import redis

        for _ in range(3):
            port = _cluster_port()
            command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
            command += ["--cluster-enabled", "yes", "--save", "", "--appendonly", "no"]
            command += ["--cluster-config-file", str(self.folder / f"nodes-{port}.conf")]
            command += ["--dir", str(self.folder)]
            if self.node_timeout_ms is not None:
                command += ["--cluster-node-timeout", str(self.node_timeout_ms)]
            process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            self.servers.append((port, process))
        clients = [redis.Redis(port=port) for port, _ in self.servers]
        for client in clients:
            _wait_for(lambda c=client: c.ping())
        step = 16384 // 3
        for n, client in enumerate(clients):
            last = 16383 if n == 2 else (n + 1) * step - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", n * step, last)
        for port, _ in self.servers[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        for client in clients:
            _wait_for(lambda c=client: b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO"))
            _wait_for(lambda c=client: len(c.execute_command("CLUSTER", "NODES").splitlines()) == 3)
            client.close()

    def stop(self) -> None:
        for _, process in self.servers:
            process.terminate()
        for _, process in self.servers:
            process.wait(5)
        self.servers = []


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too, both below 65536."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 30000)
        with contextlib.ExitStack() as stack:
            try:
                for candidate in (port, port + 10000):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def _wait_for(ready: Callable[[], Any], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if ready():
                return
        time.sleep(0.05)
    raise RuntimeError("the Redis Cluster did not come up")


@pytest.fixture(scope="session")
def redis_cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private three-primary Redis Cluster from redis-server on PATH, or a skip."""
    if shutil.which("redis-server") is None:
        pytest.skip("Redis Cluster tests skipped: redis-server is not on PATH")
    cluster = RedisCluster3(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster.nodes
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster_nodes: str) -> str:
    """A ``redis+cluster://`` store URL with a prefix of its own (the cluster is private to
    the test run and stopped after it)."""
    return f"redis+cluster://{redis_cluster_nodes}/?prefix=sgtest-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def redis_base_url() -> Iterator[str]:
    """REDIS_URL if set; else a private redis-server from PATH; else skip with a reason."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    if shutil.which("redis-server") is None:
        pytest.skip("Redis tests skipped: REDIS_URL is not set and redis-server is not on PATH")
    server = RedisServer()
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def redis_url(redis_base_url: str) -> Iterator[str]:
    """A Redis store URL with a prefix of its own; its keys are deleted afterwards."""
    import redis

    prefix = f"sgtest-{uuid.uuid4().hex[:12]}"
    yield f"{redis_base_url}?prefix={prefix}"
    client = redis.Redis.from_url(redis_base_url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
    if keys:
        client.delete(*keys)
    client.close()


class PostgresServer:
    """A private PostgreSQL in a temporary folder (initdb + pg_ctl), on a free loopback port,
    trust auth; run as an unprivileged user when the tests run as root (postgres refuses
    root). Stoppable and restartable: the data stays in the folder."""

    def __init__(self, folder: Path, bindir: Path) -> None:
        self.folder = folder
        self.bindir = bindir
        self.port = free_port()
        self.user = _unprivileged() if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.user,
            cwd=self.folder,
        )

    def init(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            shutil.chown(self.folder, self.user)
        self._run("initdb", "-D", str(self.folder / "data"), "-U", "postgres", "-A", "trust")

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        self._run(
            "pg_ctl",
            "-D",
            str(self.folder / "data"),
            "-o",
            options,
            "-w",
            "-l",
            str(self.folder / "log"),
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", mode, "-w", "stop")


def _unprivileged() -> str:
    """A user postgres agrees to run as: ``postgres`` when it exists, else ``nobody``."""
    import pwd

    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("no unprivileged user to run PostgreSQL as")


def postgres_bindir() -> Path | None:
    """Where initdb and pg_ctl are: PATH, else Debian's /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    if found is not None and shutil.which("pg_ctl") is not None:
        return Path(found).resolve().parent
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    return None


POSTGRES_HINT = (
    "PostgreSQL tests skipped: STATUSGATE_TEST_POSTGRES is not set and initdb/pg_ctl are not"
    " installed (apt-get install postgresql)"
)


@pytest.fixture(scope="session")
def postgres_base_url() -> Iterator[str]:
    """STATUSGATE_TEST_POSTGRES if set; else a private server (initdb + pg_ctl); else skip,
    naming the package to install. psycopg must be installed (the postgres extra)."""
    pytest.importorskip("psycopg", reason="PostgreSQL tests skipped: pip install -e '.[postgres]'")
    url = os.environ.get("STATUSGATE_TEST_POSTGRES")
    if url:
        yield url
        return
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip(POSTGRES_HINT)
    # not under pytest's folder: it is private to root, and postgres runs as another user
    folder = Path(tempfile.mkdtemp(prefix="statusgate-pg-"))
    server = PostgresServer(folder, bindir)
    try:
        server.init()
        server.start()
        yield server.url
        server.stop("immediate")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def drop_schema(base_url: str, schema: str) -> None:
    """Drop a schema this test run created (never one it did not)."""
    import psycopg

    with psycopg.connect(base_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def postgres_url(postgres_base_url: str) -> Iterator[str]:
    """A PostgreSQL store URL with a schema of its own, dropped afterwards."""
    schema = f"sgtest_{uuid.uuid4().hex[:12]}"
    joiner = "&" if "?" in postgres_base_url else "?"
    url = f"{postgres_base_url}{joiner}schema={schema}"
    # as `statusgate migrate` does before serve; on a thread of its own, since an async
    # fixture may ask for this one while its loop runs
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, migrated(url)).result()
    yield url
    drop_schema(postgres_base_url.split("?", 1)[0], schema)


async def migrated(url: str) -> None:
    """The store at ``url`` with its layout created or upgraded (``statusgate migrate``):
    PostgreSQL's ``serve`` only checks it."""
    store = store_from_url(url)
    try:
        await store.migrate()
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def real_time_harness(folder: Path, **kw: Any) -> AsyncIterator[Harness]:
    """A gateway on real time (the store's clock) in front of its own demo provider."""
    demo = DemoProvider(api_key=PROVIDER_KEY)
    provider = TestServer(demo.app(), host="127.0.0.1")
    await provider.start_server()
    upstream = str(provider.make_url("")).rstrip("/")
    harness = await start_harness(folder, None, demo, upstream=upstream, **kw)
    try:
        yield harness
    finally:
        await harness.client.close()
        await provider.close()


def pending_record(**changes: Any) -> OperationRecord:
    """An operation record of team-a's demo-jobs job, pending and due now."""
    now = time.time()
    record = OperationRecord(
        operation_id="op_1",
        provider="demo-jobs",
        account="team-a",
        provider_job_id="job_1",
        request_fingerprint="fp",
        idempotency_key=None,
        started_at=now,
        deadline_at=now + 600,
        max_status_requests=12,
        max_transport_failures=3,
        max_rate_limited=3,
        next_poll_at=now - 1,
        delay_source=DelaySource.LOCAL_BACKOFF,
        credential_fingerprint="c",
        policy_fingerprint="p",
    )
    return record.evolve(**changes)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def demo(clock: FakeClock) -> DemoProvider:
    return DemoProvider(api_key=PROVIDER_KEY, clock=clock)


@pytest.fixture
async def provider_server(demo: DemoProvider) -> AsyncIterator[TestServer]:
    server = TestServer(demo.app(), host="127.0.0.1")
    await server.start_server()
    yield server
    await server.close()


@pytest.fixture
async def make_harness(
    tmp_path: Path,
    clock: FakeClock,
    demo: DemoProvider,
    provider_server: TestServer,
) -> AsyncIterator[Callable[..., Any]]:
    """Build a harness; keyword arguments change policies, config or the store."""
    clients: list[TestClient[Any, Any]] = []

    async def build(**kw: Any) -> Harness:
        kw.setdefault("upstream", str(provider_server.make_url("")).rstrip("/"))
        h = await start_harness(tmp_path / f"cfg{len(clients)}", clock, demo, **kw)
        clients.append(h.client)
        return h

    yield build
    for client in clients:
        await client.close()


@pytest.fixture
async def harness(make_harness: Callable[..., Any]) -> Harness:
    h: Harness = await make_harness()
    return h


class Served:
    """One `statusgate serve` process on a SQLite file, on a port of its own."""

    def __init__(
        self,
        folder: Path,
        upstream: str,
        db: Path,
        env: dict[str, str] | None = None,
        store_url: str | None = None,
        args: list[str] | None = None,
        **changes: Any,
    ) -> None:
        self.env = env or {}
        self.args = args or []  # more `statusgate serve` arguments, e.g. --workers 2
        self.port = free_port()
        self.folder = folder
        self.db = db
        config_changes = {"listen": {"port": self.port}, **changes.pop("config", {})}
        store = store_url or f"sqlite:///{db}"
        self.config = write_config(
            folder, upstream, store=store, config_changes=config_changes, **changes
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, **PROVIDER_ENV, **self.env}
        command = ["serve", "--config", str(self.config), *self.args]
        self.process = start_statusgate(command, env)
        return self.process

    async def up(self) -> Served:
        await asyncio.to_thread(wait_until_up, self.port, self.start())
        return self

    def stop(self, number: int = signal.SIGTERM) -> str:
        """Stop the process; its stderr."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(number)
        _, stderr = self.process.communicate(timeout=15)
        return stderr.decode()

    def audit(self) -> list[dict[str, Any]]:
        path = self.folder / "audit.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[DemoProvider, str]]:
    demo = DemoProvider(api_key=PROVIDER_KEY)
    server = TestServer(demo.app(), host="127.0.0.1")
    await server.start_server()
    yield demo, str(server.make_url("")).rstrip("/")
    await server.close()


@pytest.fixture
async def gateways() -> AsyncIterator[list[Served]]:
    started: list[Served] = []
    yield started
    for served in started:
        if served.process is not None and served.process.poll() is None:
            served.stop(signal.SIGKILL)


# -- real SDKs and real providers as agents and upstreams (tests/sdk/test_provider_*.py) ----------


@pytest.fixture
async def live_demo() -> AsyncIterator[tuple[DemoProvider, str]]:
    """The demo provider on real time, on loopback: the provider and its base URL."""
    demo = DemoProvider(api_key=PROVIDER_KEY)
    server = TestServer(demo.app(), host="127.0.0.1")
    await server.start_server()
    yield demo, str(server.make_url("")).rstrip("/")
    await server.close()


@contextlib.asynccontextmanager
async def live_gateway(
    folder: Path,
    upstream: str,
    demo: DemoProvider | None = None,
    *,
    policy_changes: dict[str, dict[str, Any]] | None = None,
    config_changes: dict[str, Any] | None = None,
) -> AsyncIterator[Harness]:
    """A gateway on real time whose public_base_url is its own loopback address, so an SDK
    can follow the URLs it hands out (Operation-Location, results_url), in front of
    ``upstream``. ``harness.client.make_url("")`` is the base URL agents use."""
    port = free_port()
    changes = merge({"public_base_url": f"http://127.0.0.1:{port}"}, config_changes or {})
    path = write_config(folder, upstream, policy_changes=policy_changes, config_changes=changes)
    settings = load_settings(path, env={**os.environ, **PROVIDER_ENV})
    app = create_app(settings, store=store_from_url(settings.store_url), rng=random.Random(7))
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1", port=port))
    await client.start_server()
    try:
        yield Harness(client, demo or DemoProvider(api_key=PROVIDER_KEY), None)
    finally:
        await client.close()


def fast_polling(**changes: Any) -> dict[str, Any]:
    """A policy's polling section scaled down so a real-time test takes seconds: 200 ms
    base delay doubling to 800 ms, jitter 0.5 to 1, a budget of 40 and a 60 s deadline."""
    polling: dict[str, Any] = {
        "base_delay": "200ms",
        "max_delay": "800ms",
        "jitter": {"min": 0.5, "max": 1.0},
        "max_status_requests": 40,
        "deadline": "60s",
        "final_poll_margin": "100ms",
        "not_found_grace": "5s",
    }
    polling.update(changes)
    return polling


def permitted_polls(polling: dict[str, Any], elapsed: float) -> int:
    """The most provider polls a schedule of local backoff (no provider guidance) can allow
    within ``elapsed`` seconds of the submit: the k-th poll comes at least
    sum(jitter.min * min(max_delay, base_delay * 2^i) for i < k) after it; one poll of
    slack for the first being due at once."""
    from gateway.settings.units import parse_duration

    base, top = parse_duration(polling["base_delay"]), parse_duration(polling["max_delay"])
    floor = float(polling["jitter"]["min"])
    polls, at = 1, 0.0
    while polls < int(polling["max_status_requests"]):
        at += floor * min(top, base * 2.0 ** (polls - 1))
        if at > elapsed:
            break
        polls += 1
    return polls


class Wire:
    """The HTTP status of every answer an SDK's client received, from a response hook."""

    def __init__(self) -> None:
        self.statuses: list[int] = []

    def note(self, response: Any) -> None:
        self.statuses.append(int(response.status_code))

    def count(self, status: int) -> int:
        return self.statuses.count(status)


class RecordingProxy:
    """A loopback HTTP proxy in front of ``target`` that records every request it forwards
    (method, path with query, headers, body, time): what really reached the provider."""

    HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.requests: list[dict[str, Any]] = []
        self._server: TestServer | None = None
        self._http: Any = None

    async def start(self) -> str:
        """Start listening; the proxy's base URL."""
        import aiohttp

        self._http = aiohttp.ClientSession(auto_decompress=True)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._server = TestServer(app, host="127.0.0.1")
        await self._server.start_server()
        return str(self._server.make_url("")).rstrip("/")

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._server is not None:
            await self._server.close()

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append(
            {
                "at": time.time(),
                "method": request.method,
                "url": str(request.url),
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": body,
            }
        )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in self.HOP}
        async with self._http.request(
            request.method, self.target + request.path_qs, headers=headers, data=body
        ) as answer:
            content = await answer.read()
            drop = self.HOP | {"content-encoding"}
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in drop}
            return web.Response(status=answer.status, body=content, headers=kept)


@pytest.fixture(params=["memory", "sqlite", "redis", "redis-cluster", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Every store backend in turn (the contract suites): memory, a SQLite file, Redis, a
    three-primary Redis Cluster, PostgreSQL (a schema of its own)."""
    if request.param == "postgres":
        # what a store does, not how fast on a loaded machine: a call may take 5 s, not 1 s
        # (a 10,000-record setup once met a 1 s stall in a full run); the outage tests in
        # test_store_postgres.py hold the default's fail-closed timing
        url = request.getfixturevalue("postgres_url") + "&timeout=5s"
    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")
    elif request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster_url")
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/contract.db"
    else:
        url = "memory://"
    the_store = store_from_url(url)
    await the_store.open()
    yield the_store
    await the_store.close()


async def raw(harness: Harness, request: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (no client library normalising them); the status and body."""
    server = harness.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, to stop, pause and start again."""
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip("initdb/pg_ctl are not installed: cannot stop a private PostgreSQL")
    folder = Path(tempfile.mkdtemp(prefix="statusgate-pg-"))
    server = PostgresServer(folder, bindir)
    try:
        server.init()
        server.start()
        yield server
        server.stop("immediate")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
