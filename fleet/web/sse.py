"""Server-sent events: the framing, and the one response type every live view streams with.

Invariants: a message's data is split at line breaks into `data:` lines (the browser joins
them again), carriage returns never reach the wire (they would end a line there: fleet.web.text
spells them), and the id is one line; a stream ends when its generator does, which the hub's
close makes happen for every stream when the server stops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
