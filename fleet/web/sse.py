"""Server-sent events: the framing, and the one response type every live view streams with.

Invariants: a message's data is split at line breaks into `data:` lines (the browser joins
them again), carriage returns never reach the wire (they would end a line there: fleet.web.text
spells them), and the id is one line; a stream ends when its generator does, which the hub's
close makes happen for every stream when the server stops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import StreamingResponse

RETRY_MS = 1000  # how soon a browser reconnects after the stream breaks


def message(data: str, event: str | None = None, id: str | None = None) -> bytes:
    lines = []
    if id is not None:
        lines.append("id: " + id.replace("\n", " ").replace("\r", " "))
    if event is not None:
        lines.append(f"event: {event}")
    for line in data.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        lines.append(f"data: {line}")
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def response(stream: AsyncIterator[bytes]) -> StreamingResponse:
    from starlette.responses import StreamingResponse

    async def framed() -> AsyncIterator[bytes]:
        yield f"retry: {RETRY_MS}\n\n".encode()
        async for chunk in stream:
            yield chunk

    return StreamingResponse(
        framed(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


def last_id(headers: dict[str, str] | object, given: str | None) -> str | None:
    """The id to resume after: the browser's Last-Event-ID wins over what the page said."""
    found = getattr(headers, "get", lambda _k: None)("last-event-id")
    return found if isinstance(found, str) and found else given


def versions(
    request: Request,
    key: str,
    compute: Callable[[], Any],
    messages: Callable[[Any, str], Iterable[bytes]],
    failed: bool = True,
) -> StreamingResponse:
    """The stream of a live view: for each version the hub sees after the browser's last
    (Last-Event-ID, else `?v=`), `messages(picture, version)`, the picture computed once per
    version for every listener of `key`. A FleetError while computing it is sent as a
    `failed` event when `failed`, else that version is left out."""
    from fleet.errors import FleetError

    hub = request.app.state.web.hub
    given = last_id(request.headers, request.query_params.get("v"))
    seen = int(given) if given and given.isdigit() else -1

    async def stream() -> AsyncIterator[bytes]:
        version = seen
        while True:
            version = await hub.wait(version)
            if version < 0:
                return
            try:
                now = await hub.shared(key, compute)
            except FleetError as e:
                if failed:
                    yield message(str(e.message), "failed", str(version))
                continue
            for chunk in messages(now, str(version)):
                yield chunk

    return response(stream())
