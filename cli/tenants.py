"""``llmq tenant`` and ``llmq key``: manage tenants and their API keys in Redis.

``llmq tenant create NAME [--weight W] [--tokens-per-minute N] [--requests-per-minute N]
[--max-concurrent N] [--min-priority P]``, ``tenant set NAME ...``, ``tenant list``,
``tenant delete NAME`` (revokes its keys), ``tenant stats``, ``tenant load FILE`` (a
TOML tenants file); ``llmq key create --tenant NAME`` (prints the key, once), ``key
list``, ``key revoke ID``, ``key digest KEY`` (what a tenants file lists). Errors go to
stderr, exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from llmq import admin
from llmq.connection import connect
from llmq.policy import store as policy_store
from llmq.settings import CommonSettings
from llmq.tenant_usage import tenant_usage
from llmq.tenants import (
    Tenant,
    TenantError,
    TenantStore,
    digest,
    key_id,
    load_file,
    parse_tenant,
    unused_weights,
)

#: The tenant flags: (flag, field, type).
FIELDS = (
    ("--weight", "weight", float),
    ("--tokens-per-minute", "tokens_per_minute", int),
    ("--requests-per-minute", "requests_per_minute", int),
    ("--max-concurrent", "max_concurrent", int),
    ("--min-priority", "min_priority", int),
)


def add_arguments(tenant: argparse.ArgumentParser, key: argparse.ArgumentParser) -> None:
    verbs = tenant.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in ("create", "set"):
        p = verbs.add_parser(verb, help=f"{verb} a tenant")
        p.add_argument("name")
        for flag, field, kind in FIELDS:
            p.add_argument(flag, dest=field, type=kind, default=None)
    verbs.add_parser("list", help="list tenants")
    verbs.add_parser(
        "stats", help="each tenant's requests at once (queued, running), tokens, throttled"
    )
    verbs.add_parser("delete", help="delete a tenant and revoke its keys").add_argument("name")
    verbs.add_parser("load", help="write the tenants of a TOML file").add_argument("file")
    kverbs = key.add_subparsers(dest="verb", required=True, metavar="VERB")
    create = kverbs.add_parser("create", help="make a key (shown once)")
    whose = create.add_mutually_exclusive_group(required=True)
    whose.add_argument("--tenant")
    whose.add_argument(
        "--admin", action="store_true", help="an operator's key: the admin API and the console"
    )
    create.add_argument("--name", default="admin", help="an admin key's name (in the audit)")
    kverbs.add_parser("list", help="list keys (ids and tenants, never the keys)")
    kverbs.add_parser("revoke", help="revoke a key by its id").add_argument("id")
    kverbs.add_parser("digest", help="the digest a tenants file lists").add_argument("key")


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    return {f: getattr(args, f) for _, f, _ in FIELDS if getattr(args, f, None) is not None}


def _row(values: list[Any]) -> str:
    return "  ".join(str(v) for v in values)


async def _tenant(store: TenantStore, args: argparse.Namespace, fairness: str) -> None:
    if args.verb == "create":
        tenant = parse_tenant({"name": args.name, **_changes(args)})
        await store.put(tenant, create=True)
        print(f"tenant {tenant.name} created")
        _warn_unused(fairness, [tenant])
    elif args.verb == "set":
        tenant = await store.update(args.name, _changes(args))
        print(f"tenant {tenant.name}: {tenant.model_dump_json(exclude={'name'})}")
        _warn_unused(fairness, [tenant])
    elif args.verb == "list":
        print(_row(["NAME", "WEIGHT", "TOKENS/MIN", "REQUESTS/MIN", "AT ONCE", "MIN PRIORITY"]))
        for t in await store.all():
            limits = [t.tokens_per_minute, t.requests_per_minute, t.max_concurrent]
            shown = [x or "-" for x in limits]
            floor = "-" if t.min_priority is None else t.min_priority
            print(_row([t.name, f"{t.weight:g}", *shown, floor]))
    elif args.verb == "stats":
        await _stats(store)
    elif args.verb == "delete":
        revoked = await store.delete(args.name)
        print(f"tenant {args.name} deleted ({revoked} key(s) revoked)")
    elif args.verb == "load":
        print(f"{await load_file(store, args.file)} tenant(s) written from {args.file}")


def _warn_unused(fairness: str, tenants: list[Tenant]) -> None:
    warning = unused_weights(fairness, tenants)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


async def _stats(store: TenantStore) -> None:
    """Per tenant: its requests at once by status (tracked for tenants with limits), and
    the totals of ``llmq_tenant_tokens_total`` and ``llmq_tenant_requests_total``."""
    print(_row(["TENANT", "QUEUED", "RUNNING", "TOKENS", "ACCEPTED", "RATE_LIMITED", "SHED"]))
    for name in sorted({"default", *await store.names()}):
        u = await tenant_usage(store.redis, name)
        print(_row([name, u.queued, u.running, u.tokens, u.accepted, u.rate_limited, u.shed]))


async def _key(store: TenantStore, args: argparse.Namespace) -> None:
    if args.verb == "create" and args.admin:
        key = await admin.create_admin_key(store.redis, args.name)
        print(key)
        print(f"admin key {key_id(digest(key))} ({args.name}): shown once", file=sys.stderr)
    elif args.verb == "create":
        key = await store.create_key(args.tenant)
        print(key)
        print(f"key {key_id(digest(key))} of tenant {args.tenant}: shown once", file=sys.stderr)
    elif args.verb == "list":
        print(_row(["ID", "TENANT", "CREATED", "BEGINS"]))
        listed = [(d, e.tenant, e.created_at, e.hint) for d, e in await store.keys()]
        listed += [
            (d, f"(admin {e.name})", e.created_at, e.hint)
            for d, e in await admin.admin_keys(store.redis)
        ]
        for d, whose, at, hint in listed:
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
            print(_row([key_id(d), whose, created, hint]))
    elif args.verb == "revoke":
        print(f"key {key_id(await admin.revoke_key(store.redis, args.id))} revoked")


async def run(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Run ``llmq tenant``/``llmq key``; 2 with the reason on stderr when refused."""
    if args.command == "key" and args.verb == "digest":
        print(digest(args.key))
        return 0
    redis = connect(settings)
    try:
        store = TenantStore(redis)
        if args.command == "tenant":
            await _tenant(store, args, (await policy_store.show(redis)).policy.fairness)
        else:
            await _key(store, args)
    except TenantError as exc:
        print(f"llmq {args.command} {args.verb}: {exc}", file=sys.stderr)
        return 2
    finally:
        await redis.aclose()
    return 0
