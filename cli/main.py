"""The ``llmq`` command: ``api``, ``worker``, ``run``, ``autoscale``, ``loadgen``,
``tenant``, ``key``.

Every settings field of a subcommand's settings class is also a flag
(``redis_url`` -> ``--redis-url``), and every flag is also an ``LLMQ_*``
environment variable; a flag wins over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import version
from typing import Any, TypeVar

from pydantic import ValidationError

from llmq import tracing
from llmq.collector import tune_garbage_collector
from llmq.logs import setup_logging
from llmq.policy.fields import POLICY_NAMES
from llmq.settings import (
    ApiSettings,
    AutoscaleSettings,
    CommonSettings,
    RunSettings,
    WorkerSettings,
)

S = TypeVar("S", bound=CommonSettings)

#: The hidden flag of ``llmq api`` that makes it one of several processes sharing
#: the port (:mod:`cli.api_processes`).
REUSE_PORT = "--reuse-port"

#: The settings class of each process subcommand.
SETTINGS: dict[str, type[CommonSettings]] = {
    "api": ApiSettings,
    "worker": WorkerSettings,
    "run": RunSettings,
    "tail": CommonSettings,
    "autoscale": AutoscaleSettings,
}


def _add_settings_flags(
    parser: argparse.ArgumentParser, cls: type[CommonSettings], skip: Sequence[str] = ()
) -> None:
    for name, info in cls.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        env = "LLMQ_" + name.upper()
        help_text = f"{info.description or ''} [env {env}; default {info.default!r}]".strip()
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
        if info.annotation in (bool, bool | None):
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=help_text)


def settings_flags(cls: type[CommonSettings], args: argparse.Namespace) -> list[str]:
    """The flags that set what ``args`` sets: a child given them builds the same settings."""
    flags: list[str] = []
    for name in cls.model_fields:
        value = getattr(args, name, None)
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        elif value is not None:
            flags += [f"--{flag}", value]
    return flags


def build_settings(cls: type[S], args: argparse.Namespace) -> S:
    overrides: dict[str, Any] = {
        name: value for name in cls.model_fields if (value := getattr(args, name, None)) is not None
    }
    return cls(**overrides)


def build_parser(*, loadgen: bool = True) -> argparse.ArgumentParser:
    """``loadgen=False`` leaves out the load generator's flags, whose imports (numpy)
    would add their import time to every worker's start-up."""
    parser = argparse.ArgumentParser(prog="llmq", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('llmq')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {
        "api": "run one API process (uvicorn)",
        "worker": "run one worker process",
        "run": "run the whole stack locally: Redis, one API process, N workers",
        "tail": "follow the lifecycle stream (queued, started, first token, finished...)",
        "autoscale": "decide and publish how many workers each model needs (for KEDA/HPA)",
        "tenant": "create, list, change or delete tenants (weights and limits)",
        "key": "create, list or revoke tenants' API keys",
        "config": "show or change the pool policy (routing, fairness, limits), live",
    }
    parsers = {}
    for name, cls in SETTINGS.items():
        parsers[name] = sub.add_parser(name, help=helps[name])
        _add_settings_flags(parsers[name], cls)
    parsers["api"].add_argument(REUSE_PORT, action="store_true", help=argparse.SUPPRESS)
    parsers["run"].add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="an inference server (llama-server, vLLM, ...) to serve through a worker of "
        "its own; repeat for more [adds to --upstreams]",
    )
    parsers["tail"].add_argument(
        "--from-start", action="store_true", help="print the entries Redis still keeps first"
    )
    from cli.batch import add_arguments as batch_arguments

    batch_arguments(sub.add_parser("batch", help="run a JSONL file through the Batch API"))
    from cli.config import add_arguments as add_config_arguments
    from cli.tenants import add_arguments as add_tenant_arguments

    for name in ("tenant", "key", "config"):  # the pool policy is in Redis, not flags
        parsers[name] = sub.add_parser(name, help=helps[name])
        _add_settings_flags(parsers[name], CommonSettings, skip=POLICY_NAMES)
    add_tenant_arguments(parsers["tenant"], parsers["key"])
    add_config_arguments(parsers["config"])
    loadgen_parser = sub.add_parser("loadgen", help="drive an OpenAI-compatible server with load")
    if not loadgen:
        return parser
    try:
        from loadgen.cli import add_arguments
    except ImportError:  # a server-only install (the image) has no load generator
        return parser
    add_arguments(loadgen_parser)
    return parser


def _run_api(args: argparse.Namespace) -> int:
    settings = build_settings(ApiSettings, args)
    setup_logging(settings, "api")
    if settings.api_processes > 1 and not args.reuse_port:
        from cli.api_processes import serve_api_processes

        return _run_async(serve_api_processes(settings, settings_flags(ApiSettings, args)))
    from api.main import serve

    with tracing.traced("llmq-api"):
        serve(settings, reuse_port=args.reuse_port)
    return 0


def _run_worker(args: argparse.Namespace) -> int:
    from worker.main import serve

    settings = build_settings(WorkerSettings, args)
    setup_logging(settings, "worker")
    tune_garbage_collector()
    with tracing.traced("llmq-worker"):
        _run_async(serve(settings))
    return 0


def _run_stack(args: argparse.Namespace) -> int:
    from cli.stack import run_stack

    if args.upstream:
        args.upstreams = ",".join(filter(None, [args.upstreams, *args.upstream]))
    settings = build_settings(RunSettings, args)
    setup_logging(settings, "run")
    return _run_async(run_stack(settings))


def _run_autoscale(args: argparse.Namespace) -> int:
    from llmq.autoscale.controller import serve

    settings = build_settings(AutoscaleSettings, args)
    setup_logging(settings, "autoscale")
    return _run_async(serve(settings))


def _run_tail(args: argparse.Namespace) -> int:
    from llmq.tail import tail_lifecycle

    settings = build_settings(CommonSettings, args)
    return _run_async(tail_lifecycle(settings, from_start=args.from_start))


def _run_batch(args: argparse.Namespace) -> int:
    from cli.batch import run_batch

    return _run_async(run_batch(args))


def _run_tenants(args: argparse.Namespace) -> int:
    from cli.tenants import run

    return _run_async(run(build_settings(CommonSettings, args), args))


def _run_config(args: argparse.Namespace) -> int:
    from cli.config import run

    return _run_async(run(build_settings(CommonSettings, args), args))


def _loadgen_missing() -> str | None:
    """What a server-only install (no ``loadgen`` extra) lacks to run the load
    generator, or None where it is installed."""
    try:
        import loadgen.cli  # noqa: F401 - the package imports its runner and its extra
    except ImportError as exc:
        return exc.name or str(exc)
    return None


def _run_loadgen(args: argparse.Namespace) -> int:
    from loadgen.cli import main as loadgen_main

    return loadgen_main(args)


def _run_async(coro: Any) -> int:
    try:
        import uvloop

        result = uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        result = asyncio.run(coro)
    return int(result or 0)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "api": _run_api,
    "worker": _run_worker,
    "run": _run_stack,
    "loadgen": _run_loadgen,
    "tail": _run_tail,
    "autoscale": _run_autoscale,
    "batch": _run_batch,
    "tenant": _run_tenants,
    "key": _run_tenants,
    "config": _run_config,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Before parsing: without the extra the subcommand has no flags, and argparse
    # would answer its arguments with "unrecognized arguments" instead of the hint.
    if argv[:1] == ["loadgen"] and (missing := _loadgen_missing()) is not None:
        print(
            f"llmq loadgen: {missing} is not installed here (a server-only install); "
            "the load generator needs the loadgen extra: pip install 'llmq[loadgen]'",
            file=sys.stderr,
        )
        return 2
    args = build_parser(loadgen=not argv or argv[0] not in SETTINGS).parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            field = ".".join(str(p) for p in err["loc"])
            print(f"llmq {args.command}: invalid setting {field}: {err['msg']}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
