"""Pooled HTTP connections that the server closed without saying so.

llama.cpp's server closes a kept-alive connection after each streamed response, and
any server closes one that idled past its keep-alive timeout; a client whose pool
hands out such a connection before it has seen the close cannot write its request,
or is hung up on before any status line. That request never reached the server, so
it is sent again on another connection (a server that really hangs up on every try
still fails it): the load generator does so, and a worker's upstream adapter, which
would otherwise take the upstream for down.
"""

from __future__ import annotations

import aiohttp

#: Sends of one request on connections found closed, before the error stands.
STALE_RETRIES = 3


def unsent(exc: BaseException) -> bool:
    """Whether ``exc`` says the request met a connection the server had closed:
    aiohttp could not write it, or the server hung up before any status line."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return isinstance(exc, aiohttp.ClientOSError) and "Can not write request body" in str(exc)
