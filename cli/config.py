"""``llmq config``: show and change the pool policy (docs/policy.md).

``llmq config show [--model M]`` (each value and where it comes from: default,
derived, pool, model), ``config set KEY=VALUE... [--model M]``, ``config unset KEY...
[--model M]``, ``config diff FILE`` (what loading a TOML policy file would change),
``config load FILE`` (the policy becomes the file's, whole), ``config history``.
A refusal changes nothing; it goes to stderr, exit 2.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
import time

from redis.asyncio import Redis

from llmq.connection import connect
from llmq.policy import store
from llmq.policy.fields import POLICY_NAMES
from llmq.policy.model import PolicyError, parse_value
from llmq.protocol import policy as stored_policy
from llmq.settings import CommonSettings


def add_arguments(config: argparse.ArgumentParser) -> None:
    verbs = config.add_subparsers(dest="verb", required=True, metavar="VERB")
    show = verbs.add_parser("show", help="the effective policy and where each value comes from")
    show.add_argument("--model", default=None, help="a model's (default: the pool's)")
    change = verbs.add_parser("set", help="set KEY=VALUE in the pool's policy or a model's")
    change.add_argument("pairs", nargs="+", metavar="KEY=VALUE")
    change.add_argument("--model", default=None, help="a model's override (default: the pool)")
    unset = verbs.add_parser("unset", help="remove keys from the pool's policy or a model's")
    unset.add_argument("names", nargs="+", metavar="KEY")
    unset.add_argument("--model", default=None)
    verbs.add_parser("diff", help="what loading a policy file would change").add_argument("file")
    verbs.add_parser("load", help="make the policy a TOML file's, whole").add_argument("file")
    history = verbs.add_parser("history", help="the last changes: version, when, who, what")
    history.add_argument("--count", type=int, default=20)


def _who() -> str:
    """Who makes a change, for the history: user@host (a container's user may have no
    name: its uid)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _pairs(pairs: list[str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise PolicyError(f"{pair}: expected KEY=VALUE")
        values[name.strip()] = parse_value(name.strip(), text.strip())
    return values


async def _run(redis: Redis, args: argparse.Namespace) -> None:
    if args.verb == "show":
        found = await store.show(redis, args.model)
        scope = f"model {args.model}" if args.model else "pool"
        print(f"# {scope}, policy version {found.version}")
        values = found.policy.model_dump(mode="json")
        width = max(len(n) for n in POLICY_NAMES)
        for name in POLICY_NAMES:
            print(f"{name:<{width}}  {json.dumps(values[name]):<14}  {found.source(name)}")
        if not args.model:
            overridden = sorted((await stored_policy.read(redis)).models)
            print(f"# models with overrides: {', '.join(overridden) or 'none'}")
    elif args.verb == "set":
        version = await store.set_values(redis, _pairs(args.pairs), args.model, _who())
        print(f"policy version {version}")
    elif args.verb == "unset":
        version = await store.unset(redis, args.names, args.model, _who())
        print(f"policy version {version}")
    elif args.verb == "diff":
        lines = await store.diff(redis, args.file)
        print("\n".join(lines) if lines else "no change")
    elif args.verb == "load":
        version = await store.load(redis, args.file, _who())
        print(f"policy version {version} from {args.file}")
    elif args.verb == "history":
        for change in await store.history(redis, args.count):
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(change.at_ms / 1000))
            print(f"{change.version}  {at}  {change.who}  {change.what}")


async def run(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Run ``llmq config``; 2 with the reason on stderr when refused."""
    redis = connect(settings)
    try:
        await _run(redis, args)
    except PolicyError as exc:
        print(f"llmq config {args.verb}: {exc}", file=sys.stderr)
        return 2
    finally:
        await redis.aclose(close_connection_pool=True)
    return 0
