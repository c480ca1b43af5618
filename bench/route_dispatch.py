"""What a generation route's dispatch costs the API, FastAPI's and a DirectRoute's.

``python -m bench.route_dispatch [CALLS]``: two apps, each with the API's error
handlers, its body-limit middleware and one route at ``/v1/chat/completions`` with
the chat route's parameters (the body, the request, the caller, the session header)
and an endpoint that answers at once: one resolved by FastAPI, one a
:class:`~api.direct_route.DirectRoute`. Each app is called in this process, as
uvicorn calls it, with a chat body of a 32-word prompt, ``CALLS`` times per
round, the two in turn for :data:`ROUNDS` rounds; it prints the median CPU time per
call of each and their difference: the API's CPU between a request's arrival and its
handler, without sockets, Redis or admission.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from types import SimpleNamespace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.types import Message

from api import errors
from api.auth import Caller
from api.bodies import ChatCompletionRequest
from api.direct_route import DirectRoute, SessionHeader
from api.limits import BodyLimit

ROUNDS = 5
PATH = "/v1/chat/completions"
BODY = json.dumps(
    {
        "model": "tiny",
        "messages": [{"role": "user", "content": " ".join(["word"] * 32)}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
    }
).encode()


async def _chat(
    body: ChatCompletionRequest, request: Request, owner: Caller, session: SessionHeader = None
) -> Response:
    return Response(status_code=204)


def app_with(route_class: type[APIRoute]) -> FastAPI:
    app = FastAPI()
    errors.install(app)
    router = APIRouter(route_class=route_class)
    router.post(PATH, response_model=None)(_chat)
    app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=1 << 20)
    app.state.llmq = SimpleNamespace(api_keys=frozenset())  # auth off, as by default
    return app


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def _receive() -> Message:
    return {"type": "http.request", "body": BODY, "more_body": False}


async def cpu_per_call(app: FastAPI, calls: int) -> float:
    """Microseconds of this process's CPU per call of ``app`` (each answers 204)."""
    statuses: list[int] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    started = time.process_time()
    for _ in range(calls):
        await app(_scope(), _receive, send)
    spent = time.process_time() - started
    if set(statuses) != {204}:
        raise RuntimeError(f"the route answered {sorted(set(statuses))}, not 204")
    return spent / calls * 1e6


async def compare(calls: int) -> dict[str, list[float]]:
    apps = {"FastAPI": app_with(APIRoute), "DirectRoute": app_with(DirectRoute)}
    for app in apps.values():
        await cpu_per_call(app, max(1, calls // 10))  # warm up
    out: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(ROUNDS):
        for name, app in apps.items():
            out[name].append(await cpu_per_call(app, calls))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calls", nargs="?", type=int, default=5000)
    args = parser.parse_args()
    results = asyncio.run(compare(args.calls))
    medians = {name: statistics.median(values) for name, values in results.items()}
    print(f"{args.calls} calls per round, {ROUNDS} rounds; median CPU per call (us)")
    for name, median in medians.items():
        rounds = ", ".join(f"{v:.1f}" for v in results[name])
        print(f"  {name:12} {median:7.1f}   ({rounds})")
    print(f"  {'difference':12} {medians['FastAPI'] - medians['DirectRoute']:7.1f}")


if __name__ == "__main__":
    main()
