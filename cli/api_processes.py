"""``llmq api --api-processes N``: N API processes on one port, under the supervisor.

Each child is a complete ``llmq api`` process told (``--reuse-port``) to bind the
port with ``SO_REUSEPORT``, so the kernel spreads connections over them. They run
under :class:`cli.supervisor.Supervisor`, as ``llmq run``'s children do: one that
dies is restarted with backoff while the others go on serving, a crash loop stops
them all with exit code 1, and SIGTERM or SIGINT stops them all gracefully (each
ends its open streams with ``shutting_down`` and ``[DONE]``). ``llmq run
--api-processes N`` starts the same N children under its own supervisor.
"""

from __future__ import annotations

import logging
import os
import signal

from cli.main import REUSE_PORT
from cli.supervisor import Child, Supervisor, llmq_command, stop_signals
from llmq.settings import ApiSettings

log = logging.getLogger(__name__)


def api_commands(count: int, flags: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """Names and command lines of the ``count`` API processes that serve one port
    (one: a plain ``llmq api``), each given ``flags``."""
    flags = flags or []
    if count == 1:
        return [("api", llmq_command("api", *flags))]
    return [(f"api-{i}", llmq_command("api", REUSE_PORT, *flags)) for i in range(1, count + 1)]


async def serve_api_processes(settings: ApiSettings, flags: list[str]) -> int:
    """Run ``settings.api_processes`` API processes given ``flags`` (the command's
    own) until SIGTERM/SIGINT (exit 0 once every one stopped cleanly) or a crash
    loop (exit 1)."""
    stop = stop_signals()
    supervisor = Supervisor()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    children: list[Child] = []
    failure: str | None = None
    try:
        for name, argv in api_commands(settings.api_processes, flags):
            children.append(await supervisor.start(name, argv, env))
        log.info(
            "serving on %s:%d with %d API processes", settings.host, settings.port, len(children)
        )
        failure = await supervisor.until_stopped(stop)
    finally:
        await supervisor.close()
    if failure is not None:
        log.error("llmq api stops: %s", failure)
        return 1
    clean = (0, -signal.SIGTERM)
    return 0 if all(c.process and c.process.returncode in clean for c in children) else 1
