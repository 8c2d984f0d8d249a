"""The demo shows' plumbing: an aiohttp app on a free loopback port, and a gateway serving
one policy to one account on a simulated clock (never runtime code)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Protocol

from aiohttp import web

from gateway.run.app import create_app
from gateway.settings.config import GatewayFile, Settings
from gateway.settings.policy import ProviderPolicy


async def start(app: web.Application) -> tuple[web.AppRunner, int]:
    """Serves ``app`` on 127.0.0.1 at a port the kernel picks; (runner, port)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, int(runner.addresses[0][1])


class ShowClock(Protocol):
    """The shows' simulated clock: read it, sleep on it, move it on."""

    now: float

    def __call__(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


def gateway_app(
    policy: ProviderPolicy, clock: ShowClock, token: str, folder: Path
) -> web.Application:
    """A gateway on the memory store serving ``policy`` alone to one account (``token``),
    on ``clock``, its audit file in ``folder``."""
    digest = hashlib.sha256(token.encode()).hexdigest()
    gateway_file = GatewayFile.model_validate(
        {
            "store": "memory://",
            "accounts": [{"id": "demo-team", "token_sha256": [digest]}],
            "audit": {"path": "audit.jsonl"},
        }
    )
    settings = Settings(file=gateway_file, base_dir=folder, policies={policy.provider: policy})
    return create_app(settings, clock=clock, sleep=clock.sleep, rng=random.Random(1))
