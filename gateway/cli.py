"""The ``statusgate`` command: argument parsing and printing only.

Errors a user can cause (a bad config, a missing file) print one clear line per problem and
exit 1; they never print a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except ConfigError as exc:
        for line in exc.problems:
            print(line, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="statusgate", description="Policy gateway for agents waiting on provider jobs."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, required=True)
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check", help="validate the config and every policy")
    check.add_argument("--config", type=Path, required=True)
    check.set_defaults(run=_check)

    token = commands.add_parser("token", help="token helpers")
    token_commands = token.add_subparsers(required=True, metavar="ACTION")
    token_hash = token_commands.add_parser("hash", help="sha256 of a token read on stdin")
    token_hash.set_defaults(run=_token_hash)

    demo_provider = commands.add_parser("demo-provider", help="run the scriptable demo provider")
    demo_provider.add_argument("--host", default="127.0.0.1")
    demo_provider.add_argument("--port", type=int, default=8081)
    demo_provider.set_defaults(run=_demo_provider)

    demo = commands.add_parser("demo", help="a self-contained show with looping agents")
    demo.set_defaults(run=_demo)
    return parser


def _check(args: argparse.Namespace) -> int:
    from .config import load_settings
    from .store import store_from_url

    settings = load_settings(args.config)
    store_from_url(settings.store_url)  # the scheme and options are valid
    names = ", ".join(sorted(settings.policies)) or "none"
    print(
        f"{args.config}: ok: {len(settings.policies)} policies ({names}), "
        f"{len(settings.file.accounts)} accounts, {len(settings.file.operators)} operators, "
        f"store {settings.file.store.split(':', 1)[0]}"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from .app import create_app
    from .config import load_settings

    settings = load_settings(args.config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    app = create_app(settings)
    listen = settings.file.listen
    print(f"statusgate listening on http://{listen.host}:{listen.port}", flush=True)
    web.run_app(app, host=listen.host, port=listen.port, print=None, access_log=None)
    return 0


def _token_hash(args: argparse.Namespace) -> int:
    token = sys.stdin.readline().strip()
    if not token:
        print("statusgate token hash: no token on stdin", file=sys.stderr)
        return 1
    print(hashlib.sha256(token.encode()).hexdigest())
    return 0


def _demo_provider(args: argparse.Namespace) -> int:
    from .demo_provider import run

    run(args.host, args.port)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run

    return run()
