"""Request limits of ``autotune serve`` that aiohttp enforces before any route runs
(docs/bad-input.md).

aiohttp refuses a request line or header over 8,190 bytes inside its protocol, with a
plain-text 400 and a traceback in the log, before the application's middlewares could turn it
into the service's JSON error. So the protocol is given room (:data:`MAX_LINE_BYTES`) and
:func:`url_limit` refuses a URL over :data:`MAX_URL_BYTES` itself, as JSON; a line too long
even for the protocol still gets aiohttp's 400, logged as one line without the traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["MAX_LINE_BYTES", "MAX_URL_BYTES", "handler_args", "url_limit"]

# What aiohttp (and nginx's default large_client_header_buffers) allows for a request line.
MAX_URL_BYTES = 8190
# What the protocol reads before giving up: room for a refused URL to reach url_limit.
MAX_LINE_BYTES = 64 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorResponse = Callable[[int, str], web.Response]


class _ProtocolLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server log, with a malformed request logged as one line: a client's bad
    bytes are not a bug in the service. Anything else keeps its traceback."""

    def exception(self, msg: object, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            kwargs.pop("exc_info")
            self.warning(f"{msg}: %s", *args, " ".join(str(exc).split()), **kwargs)
            return
        super().exception(msg, *args, **kwargs)


def handler_args() -> dict[str, Any]:
    """``web.Application(handler_args=...)``: the protocol's line limits and its log."""
    return {
        # headers keep aiohttp's 8,190 bytes each: raising it would multiply by their count
        "max_line_size": MAX_LINE_BYTES,
        "logger": _ProtocolLog(logging.getLogger("aiohttp.server"), {}),
    }


def url_limit(error: ErrorResponse) -> Callable[..., Awaitable[web.StreamResponse]]:
    """A middleware refusing a URL over :data:`MAX_URL_BYTES` with ``error(414, ...)``."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        size = len(request.raw_path.encode("utf-8", "surrogateescape"))
        if size > MAX_URL_BYTES:
            return error(414, f"the URL is {size:,} bytes, more than the {MAX_URL_BYTES:,} allowed")
        return await handler(request)

    return middleware
