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
from typing import Any, cast

from llmq import metrics
from llmq.connection import connect
from llmq.metrics import field as metric_field
from llmq.policy import store as policy_store
from llmq.protocol import keys
from llmq.settings import CommonSettings
from llmq.tenants import (
    Tenant,
    TenantError,
    TenantStore,
    digest,
    key_id,
    load_file,
    parse_tenant,
    text,
    unused_weights,
)

#: The outcomes of ``llmq_tenant_requests_total``, in the order ``tenant stats`` shows them.
OUTCOMES = ("accepted", "rate_limited", "shed")

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
    kverbs.add_parser("create", help="make a key (shown once)").add_argument(
        "--tenant", required=True
    )
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
    redis = store.redis
    print(_row(["TENANT", "QUEUED", "RUNNING", "TOKENS", "ACCEPTED", "RATE_LIMITED", "SHED"]))
    names = sorted({"default", *await store.names()})
    for name in names:
        held = await cast("Any", redis.zrange(keys.quota_keys(name)[2], 0, -1))
        statuses = [
            await cast("Any", redis.hget(keys.request(text(rid)), "status")) for rid in held
        ]
        queued = sum(1 for s in statuses if s and text(s) == "queued")
        running = sum(1 for s in statuses if s and text(s) == "running")
        totals = [
            await cast("Any", redis.hget(keys.metric(family.name), metric_field("", labels)))
            for family, labels in (
                (metrics.TENANT_TOKENS, (name,)),
                *((metrics.TENANT_REQUESTS, (name, o)) for o in OUTCOMES),
            )
        ]
        shown = [int(float(text(t))) if t is not None else 0 for t in totals]
        print(_row([name, queued, running, *shown]))


async def _key(store: TenantStore, args: argparse.Namespace) -> None:
    if args.verb == "create":
        key = await store.create_key(args.tenant)
        print(key)
        print(f"key {key_id(digest(key))} of tenant {args.tenant}: shown once", file=sys.stderr)
    elif args.verb == "list":
        print(_row(["ID", "TENANT", "CREATED", "BEGINS"]))
        for d, entry in await store.keys():
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.created_at))
            print(_row([key_id(d), entry.tenant, created, entry.hint]))
    elif args.verb == "revoke":
        print(f"key {key_id(await store.revoke(args.id))} revoked")


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
