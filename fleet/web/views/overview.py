"""The overview: `fleet status` as a page, redrawn whenever the hub sees a change; and the
queue-wide actions (pause, resume)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleet.errors import FleetError
from fleet.web import sse
from fleet.web.app import Form, Web, action, field, page

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from fleet.cli.app import App


def picture(web: Web) -> dict[str, Any]:
    """The status snapshot and the fragment that shows it (computed once per version)."""
    from fleet import status

    with web.acting() as app:
        snap = status.snapshot(web.paths, app.store, app.config)
    html = web.templates.get_template("_overview.html").render(snap=snap)
    nav = web.templates.get_template("_nav_counts.html").render(snap=snap)
    return {"snap": snap, "html": html, "nav": nav}


async def overview(request: Request) -> Response:
    import anyio.to_thread

    web: Web = request.app.state.web
    version = web.hub.version  # before: a change while this is made is streamed after it
    try:
        seen = await anyio.to_thread.run_sync(picture, web)
    except FleetError as e:
        return page(request, "error.html", 503, error=e)
    return page(
        request,
        "overview.html",
        snap=seen["snap"],
        fragment=seen["html"],
        version=version,
        view="overview",
    )


async def events(request: Request) -> Response:
    """The overview's stream: a new fragment (and the navigation's counts) each version."""
    web: Web = request.app.state.web
    return sse.versions(
        request,
        "overview",
        lambda: picture(web),
        lambda now, v: (sse.message(now["html"], "overview", v), sse.message(now["nav"], "nav")),
    )


async def nav_events(request: Request) -> Response:
    """The navigation's counts (questions waiting, running) for every other page."""
    web: Web = request.app.state.web
    return sse.versions(
        request,
        "overview",
        lambda: picture(web),
        lambda now, v: (sse.message(now["nav"], "nav", v),),
        failed=False,
    )


async def pause(request: Request) -> Response:
    from fleet.cli.control import pause_queue

    def do(app: App, form: Form) -> str:
        pause_queue(app, field(form, "reason") or None)
        return "Paused: no new task starts; running ones go on."

    return await action(request, do)


async def resume(request: Request) -> Response:
    from fleet.cli.control import resume_queue

    def do(app: App, form: Form) -> str:
        resume_queue(app)
        return "Resumed: tasks start again."

    return await action(request, do)
