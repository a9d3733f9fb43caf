"""The dashboard as an ASGI application: its state, its routes, and how an action runs.

Invariants:
- every action runs `acting()`: a fresh store whose audit actor is `web:<user>` (program
  fleet-web), inside an `App` like the one the command line's commands get, and calls the very
  function the command runs (fleet.cli.*), so the rules, the checks and the audit rows are the
  same whoever acts; a FleetError becomes a response with its message and hint and the HTTP
  status its kind means;
- pages and fragments are Jinja templates with autoescaping on, and whatever an agent wrote
  reaches them only through fleet.web.text's filters;
- the hub (fleet.web.hub) is started with the application and closed when the server starts
  to stop, which ends every open stream.
"""

from __future__ import annotations

import contextlib
import getpass
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.errors import Conflict, FleetError, InputError, NotFound
from fleet.paths import Paths
from fleet.web.access import Keys
from fleet.web.hub import Hub

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.templating import Jinja2Templates

    from fleet.cli.app import App
    from fleet.config import Config

HERE = Path(__file__).parent
PROGRAM = "fleet-web"
MAX_UPLOAD = 64 << 20  # a batch file, as fleet add --batch takes it


class Web:
    """What every request of one server shares."""

    def __init__(self, paths: Paths, keys: Keys, user: str) -> None:
        self.paths = paths
        self.keys = keys
        self.user = user
        self.hub = Hub(paths)
        self._links = (-10.0, False)
        self.templates = _templates(self)

    @property
    def by(self) -> str:
        return f"web:{self.user}"

    def config(self) -> Config:
        from fleet.config import load

        return load(self.paths)

    @contextlib.contextmanager
    def acting(self) -> Iterator[App]:
        """An App for one request: its store's changes are `web:<user>`'s."""
        from fleet.audit import Actor
        from fleet.cli.app import App
        from fleet.store import open_store

        store = open_store(self.paths, Actor(self.by, PROGRAM))
        app = App(self.paths.scope, paths=self.paths, store=store)
        try:
            yield app
        finally:
            app.close()

    def links(self) -> bool:
        """web_links, read again at most once a second (filters ask for every line)."""
        import time

        now = time.monotonic()
        if now - self._links[0] > 1.0:
            try:
                value = self.config().get_bool("web_links")
            except FleetError:
                value = False
            self._links = (now, value)
        return self._links[1]


def _templates(web: Web) -> Jinja2Templates:
    from starlette.templating import Jinja2Templates

    from fleet.web import filters

    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.autoescape = True
    env.trim_blocks = True
    env.lstrip_blocks = True
    env.globals["csrf"] = web.keys.csrf
    filters.install(env, web)
    return templates


def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
    """A page (or fragment) rendered for `request`."""
    web: Web = request.app.state.web
    return web.templates.TemplateResponse(request, name, context, status_code=status)


STATUS = {NotFound: 404, Conflict: 409, InputError: 400}


def refused(request: Request, error: FleetError) -> Response:
    """A FleetError as the flash fragment, with the status its kind means."""
    from fleet.errors import ConfigError

    status = 422 if isinstance(error, ConfigError) else 400
    for kind, code in STATUS.items():
        if isinstance(error, kind):
            status = code
            break
    return page(request, "_flash.html", status, ok=False, text=error.message, hint=error.hint)


def done(request: Request, text: str, **context: Any) -> Response:
    """The flash fragment of a change that was made; lists on the page reload themselves."""
    response = page(request, "_flash.html", ok=True, text=text, hint=None, **context)
    response.headers["HX-Trigger"] = "fleet-changed"
    return response


Form = dict[str, list[str]]


async def action(request: Request, do: Callable[[App, Form], str | Response]) -> Response:
    """Run `do` with an acting App and the request's form (each field's values) in a worker
    thread: its text as the flash fragment, or its own response; a FleetError refused."""
    import anyio.to_thread
    from starlette.datastructures import UploadFile

    web: Web = request.app.state.web
    form: Form = {}
    async with request.form(max_part_size=MAX_UPLOAD) as data:
        for key, value in data.multi_items():
            if isinstance(value, UploadFile):
                form.setdefault(key, []).append((await value.read()).decode("latin-1"))
            else:
                form.setdefault(key, []).append(value)

    def run() -> str | Response:
        with web.acting() as app:
            return do(app, form)

    try:
        said = await anyio.to_thread.run_sync(run)
    except FleetError as e:
        return refused(request, e)
    return done(request, said) if isinstance(said, str) else said


def field(form: Form, name: str) -> str:
    """One field of a form, stripped ("" if absent)."""
    return (form.get(name) or [""])[0].strip()


def create(paths: Paths, keys: Keys, hosts: frozenset[str], user: str | None = None) -> Any:
    """The application, behind its guard (fleet.web.guard)."""
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.staticfiles import StaticFiles

    from fleet.web import routes
    from fleet.web.guard import Guard

    web = Web(paths, keys, user or _user())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        web.hub.start()
        try:
            yield
        finally:
            web.hub.close()

    app = Starlette(
        routes=[
            *routes.ROUTES,
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        lifespan=lifespan,
    )
    app.state.web = web
    return Guard(app, keys, hosts)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
