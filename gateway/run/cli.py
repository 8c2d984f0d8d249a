"""The ``statusgate`` command: argument parsing and printing only.

Errors a user can cause (a bad config, a missing file) print one clear line per problem and
exit 1; they never print a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway import ConfigError, StoreError, __version__


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
    parser.add_argument("--version", action="version", version=f"statusgate {__version__}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    _run_parsers(commands)
    _tool_parsers(commands)
    _policy_parsers(commands)
    _show_parsers(commands)
    return parser


def _run_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``statusgate serve``, ``check``, ``init`` and ``migrate``."""
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, required=True)
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes sharing the port (shared stores only: Redis, PostgreSQL)",
    )
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check", help="validate the config and every policy")
    check.add_argument("--config", type=Path, required=True)
    check.set_defaults(run=_check)

    init = commands.add_parser(
        "init",
        help="write a starter config and the shipped policies into a folder",
        description="Write DIR/gateway.yaml (a starter config: SQLite in DIR, every provider's "
        "calls sent to the demo provider, a new agent token and operator token) and the "
        "shipped policies into DIR/policies. Existing files are left alone unless --force.",
    )
    init.add_argument("dir", type=Path, metavar="DIR")
    init.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="a shipped policy to write (repeatable; default: every shipped policy)",
    )
    init.add_argument("--force", action="store_true", help="replace files that exist")
    init.set_defaults(run=_init)

    migrate = commands.add_parser("migrate", help="create or upgrade the store's layout")
    migrate.add_argument("--config", type=Path, required=True)
    migrate.set_defaults(run=_migrate)


def _tool_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``statusgate token hash``, ``demo-provider`` and ``audit verify|story``."""
    token = commands.add_parser("token", help="token helpers")
    token_commands = token.add_subparsers(required=True, metavar="ACTION")
    token_hash = token_commands.add_parser("hash", help="sha256 of a token read on stdin")
    token_hash.set_defaults(run=_token_hash)

    demo_provider = commands.add_parser("demo-provider", help="run the scriptable demo provider")
    demo_provider.add_argument("--host", default="127.0.0.1")
    demo_provider.add_argument("--port", type=int, default=8081)
    demo_provider.add_argument(
        "--a2a-port", type=int, default=None, help="the demo A2A agent's port (default: PORT + 1)"
    )
    demo_provider.set_defaults(run=_demo_provider)

    audit = commands.add_parser("audit", help="verify audit logs, tell an operation's story")
    audit_commands = audit.add_subparsers(required=True, metavar="ACTION")
    verify = audit_commands.add_parser(
        "verify", help="recompute the hash chain of audit files (and of the store's copies)"
    )
    verify.add_argument("paths", nargs="*", type=Path, metavar="PATH")
    verify.add_argument(
        "--config", type=Path, help="also its audit file and, on PostgreSQL, every chain kept"
    )
    verify.add_argument("--key-env", help="environment variable holding the HMAC key")
    verify.set_defaults(run=_audit_verify)
    story = audit_commands.add_parser("story", help="one operation's events, one line each")
    story.add_argument("--config", type=Path, help="its log (every replica's on PostgreSQL)")
    story.add_argument(
        "--from",
        dest="paths",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="merge these replicas' audit files (each chain verified)",
    )
    story.add_argument("--key-env", help="environment variable holding the HMAC key")
    story.add_argument("operation_id")
    story.set_defaults(run=_audit_story)


def _show_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``statusgate schema`` and ``statusgate demo``."""
    schema = commands.add_parser("schema", help="JSON Schema of the config or policy files")
    schema.add_argument("kind", choices=("policy", "config"))
    schema.set_defaults(run=_schema)

    demo = commands.add_parser("demo", help="a self-contained show with looping agents")
    demo.add_argument("--agents", type=int, default=25, help="agents in the fleet scene")
    demo.add_argument(
        "--provider", help="show one shipped policy against the demo provider's double of it"
    )
    demo.add_argument(
        "--policies",
        type=Path,
        help="the folder of policies for --provider (default: the shipped policies)",
    )
    demo.set_defaults(run=_demo)


def _policy_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``statusgate policy test`` and ``statusgate policy show``."""
    policy = commands.add_parser("policy", help="policy tools")
    policy_commands = policy.add_subparsers(required=True, metavar="ACTION")
    tryout = policy_commands.add_parser(
        "test",
        help="classify a sample status answer",
        description="Classify a sample status answer as a fresh operation's first poll would "
        "be. Exit status: 0 pending or an outcome, 3 an escalation, 1 an error.",
    )
    tryout.add_argument("--config", type=Path, required=True)
    tryout.add_argument("--status", type=int, default=200, help="HTTP status (default 200)")
    tryout.add_argument("provider")
    tryout.add_argument("file", help="a JSON file with the status answer's body, or -")
    tryout.set_defaults(run=_policy_test)
    shown = policy_commands.add_parser(
        "show",
        help="print a policy as it takes effect",
        description="Print the effective policy: its shape's defaults merged under the file, "
        "validated, every default written out. Secrets appear as their ${...} source, or "
        "<redacted>.",
    )
    shown.add_argument("--config", type=Path, required=True)
    shown.add_argument("provider")
    shown.set_defaults(run=_policy_show)


def _policy_test(args: argparse.Namespace) -> int:
    from gateway.operator.policytool import exit_status, verdict
    from gateway.settings.config import load_settings

    settings = load_settings(args.config)
    policy = settings.policies.get(args.provider)
    if policy is None:
        known = ", ".join(sorted(settings.policies)) or "none"
        print(f"statusgate policy test: no policy for {args.provider!r} ({known})", file=sys.stderr)
        return 1
    try:
        body = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        print(f"{args.file}: cannot read ({exc.strerror})", file=sys.stderr)
        return 1
    line = verdict(policy, body, args.status)
    print(line)
    return exit_status(line)


def _policy_show(args: argparse.Namespace) -> int:
    from gateway.operator.policyshow import show
    from gateway.settings.config import load_settings
    from gateway.settings.loading import read_yaml
    from gateway.settings.shapes import with_shape

    settings = load_settings(args.config)
    policy = settings.policies.get(args.provider)
    if policy is None:
        known = ", ".join(sorted(settings.policies)) or "none"
        print(f"statusgate policy show: no policy for {args.provider!r} ({known})", file=sys.stderr)
        return 1
    folder = (settings.base_dir / settings.file.policies_dir).resolve()
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        raw = read_yaml(path, str(path))
        if raw.get("provider") == args.provider:
            print(f"# {path.name}, as it takes effect\n" + show(policy, with_shape(raw)), end="")
            return 0
    print(f"statusgate policy show: no file in {folder} names {args.provider!r}", file=sys.stderr)
    return 1


def _schema(args: argparse.Namespace) -> int:
    from gateway.operator.policyshow import relaxed
    from gateway.operator.policytool import dumps, schema
    from gateway.settings.config import GatewayFile
    from gateway.settings.policy import ProviderPolicy

    if args.kind == "policy":
        title = "Statusgate provider policy (policies/NAME.yaml)"
        print(dumps(relaxed(schema(ProviderPolicy, title))))
    else:
        print(dumps(schema(GatewayFile, "Statusgate gateway config (config/gateway.yaml)")))
    return 0


def _check(args: argparse.Namespace) -> int:
    from gateway.settings.config import load_settings, tls_warnings, written_store_url
    from gateway.settings.lints import check_warnings
    from gateway.store import store_from_url

    problems: list[str] = []
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        problems, settings = exc.problems, None
    store_url = settings.store_url if settings is not None else written_store_url(args.config)
    store = None
    try:
        if store_url is not None:
            store = store_from_url(store_url)  # the scheme and options are valid
    except ConfigError as exc:
        problems += [f"{args.config}: {line}" for line in exc.problems]
    if problems or settings is None or store is None:
        raise ConfigError(problems)
    for where, message in tls_warnings(settings.file):
        print(f"{args.config}: {where}: warning: {message}", file=sys.stderr)
    for name, policy in sorted(settings.policies.items()):  # valid, but unsafe: stderr
        for where, message in check_warnings(policy):
            print(f"{args.config}: policy {name}: {where}: warning: {message}", file=sys.stderr)
    try:
        found = asyncio.run(store.inspect())
    except StoreError as exc:
        print(f"{args.config}: store: {exc}", file=sys.stderr)
        return 1
    names = ", ".join(sorted(settings.policies)) or "none"
    print(
        f"{args.config}: ok: {_many(len(settings.policies), 'policy', 'policies')} ({names}), "
        f"{_many(len(settings.file.accounts), 'account')}, "
        f"{_many(len(settings.file.operators), 'operator')}, "
        f"store {settings.file.store.split(':', 1)[0]}{found}"
    )
    return 0


def _init(args: argparse.Namespace) -> int:
    import secrets
    import shlex

    from gateway.run.shipped import CONFIG_NAME, POLICIES, starter_files, write

    agent, operator = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    written = write(args.dir, starter_files(args.policy, agent, operator), args.force)
    for path in written:
        print(f"wrote {path}")
    config = shlex.quote(str(args.dir / CONFIG_NAME))
    policies = shlex.quote(str(args.dir / POLICIES))
    python = shlex.quote(sys.executable)
    print(
        f"\nAgent token (shown once; {CONFIG_NAME} keeps its sha256): {agent}\n"
        f"Operator token (shown once): {operator}\n"
        "\nNext (the demo provider stands in for every provider):\n"
        "  statusgate demo-provider &\n"
        f'  eval "$({python} -m gateway.demo.env --export {policies})"'
        "  # the keys the policies read, set to the demo provider's\n"
        f"  statusgate check --config {config}\n"
        f"  statusgate serve --config {config}"
    )
    if args.dir / POLICIES / "demo-jobs.yaml" in written:
        print(
            "\nThen a job through it (poll the status_url it answers with the same header):\n"
            "  curl -s -X POST http://127.0.0.1:8080/p/demo-jobs/v1/jobs "
            f"-H 'Authorization: Bearer {agent}' -H 'Idempotency-Key: try-1' "
            """-H 'Content-Type: application/json' -d '{"input": "report.pdf"}'"""
        )
    return 0


def _migrate(args: argparse.Namespace) -> int:
    """The store's layout created or upgraded to the one this release writes (SPEC 18)."""
    from gateway.settings.config import Settings, load_gateway_file
    from gateway.store import store_from_url

    gateway = load_gateway_file(args.config)  # the store alone: policies need not load
    settings = Settings(gateway, args.config.parent.resolve(), {})
    store = store_from_url(settings.store_url)
    kind = gateway.store.split(":", 1)[0]

    async def run() -> tuple[int | None, int]:
        try:
            return await store.migrate()
        finally:
            await store.close()

    try:
        found, now = asyncio.run(run())
    except StoreError as exc:
        print(f"statusgate migrate: {exc}", file=sys.stderr)
        return 1
    if found is None:
        print(f"{kind} store: created at schema version {now}")
    elif found == now:
        print(f"{kind} store: schema version {now}, up to date")
    else:
        print(f"{kind} store: schema version {found} upgraded to {now}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gateway.run.workers import prepare_metrics_dir, refusal, run
    from gateway.settings.config import load_settings

    settings = load_settings(args.config)
    why = refusal(settings, args.workers)
    if why is not None:  # a valid config: said in its log format
        import logging

        from gateway.observe.logs import say

        say(settings.file.logging, logging.ERROR, f"statusgate serve: {why}")
        return 1
    if args.workers == 1:
        from gateway.run.server import serve

        return serve(settings)
    return run(settings, args.workers, prepare_metrics_dir())


def _token_hash(args: argparse.Namespace) -> int:
    token = sys.stdin.readline().strip()
    if not token:
        print("statusgate token hash: no token on stdin", file=sys.stderr)
        return 1
    print(hashlib.sha256(token.encode()).hexdigest())
    return 0


def _demo_provider(args: argparse.Namespace) -> int:
    from gateway.demo.provider import run

    run(args.host, args.port, args.a2a_port)
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.provider is not None:
        from gateway.demo.showcase import run as run_one
        from gateway.run.shipped import policies_folder

        return run_one(args.provider, args.policies or policies_folder())
    from gateway.demo.walkthrough import run

    return run(max(1, min(args.agents, 500)))


def _audit_verify(args: argparse.Namespace) -> int:
    from gateway.operator.audittool import Request, verify_command

    return verify_command(Request(args.paths, args.config, args.key_env))


def _audit_story(args: argparse.Namespace) -> int:
    from gateway.operator.audittool import Request, story_command

    return story_command(Request(args.paths, args.config, args.key_env, args.operation_id))


def _many(count: int, noun: str, plural: str | None = None) -> str:
    """``1 account``, ``2 accounts``."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
