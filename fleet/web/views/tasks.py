"""The task list (filtered, searched, a page at a time) and what is done to many tasks: add
one, add a batch, retry or cancel the ones ticked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from fleet.errors import FleetError, InputError
from fleet.model import Status
from fleet.web.app import Form, Web, action, field, page

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from fleet.cli.app import App

PAGE = 50
FILTERS = ("status", "label", "cwd", "coder", "q")


def _filter(query: dict[str, str], default_coder: str) -> Any:
    from fleet.store import TaskFilter

    status = query.get("status", "")
    if status == "all":
        statuses: tuple[Status, ...] = ()
    elif status:
        try:
            statuses = (Status(status),)
        except ValueError:
            raise InputError(f"no status {status!r}") from None
    else:
        statuses = ()
    return TaskFilter(
        statuses=statuses,
        include_final=status == "all",
        label=query.get("label") or None,
        cwd=query.get("cwd") or None,
        coder=query.get("coder") or None,
        default_coder=default_coder,
        search=query.get("q") or None,
        newest_first=True,
    )


def listing(web: Web, query: dict[str, str]) -> dict[str, Any]:
    """One page of the tasks the query asks for, newest first, and how many there are."""
    from fleet.cli.listing import held

    try:
        number = max(1, int(query.get("page") or 1))
    except ValueError:
        number = 1
    with web.acting() as app:
        config = app.config
        flt = _filter(query, config.get_str("default_coder"))
        total = app.store.count(flt)
        tasks = list(app.store.tasks(flt._replace(limit=PAGE, offset=(number - 1) * PAGE)))
        holds = held(app, tasks)
        coders = config.coders
    kept = {k: query[k] for k in FILTERS if query.get(k)}
    pages = max(1, -(-total // PAGE))

    def link(n: int) -> str:
        return "/tasks?" + urlencode({**kept, "page": n})

    return {
        "tasks": tasks,
        "holds": holds,
        "total": total,
        "page": number,
        "pages": pages,
        "previous": link(number - 1) if number > 1 else None,
        "next": link(number + 1) if number < pages else None,
        "query": kept,
        "coders": coders,
        "statuses": [s.value for s in Status],
    }


def tasks(request: Request) -> Response:
    web: Web = request.app.state.web
    query = dict(request.query_params)
    try:
        found = listing(web, query)
    except FleetError as e:
        return page(request, "error.html", 400, error=e)
    if request.headers.get("hx-request") and request.headers.get("hx-target") == "rows":
        return page(request, "_task_rows.html", **found)
    return page(request, "tasks.html", view="tasks", **found)


async def add(request: Request) -> Response:
    """The form of `fleet add`: one task."""
    from fleet import inputs
    from fleet.cli.add import One, add_tasks, spec_of

    def do(app: App, form: Form) -> str:
        title = field(form, "title")
        if not title:
            raise InputError("the task needs a title")
        one = One(
            title=title,
            description=inputs.free_text("description", (form.get("description") or [""])[0]),
            cwd=field(form, "cwd") or None,
            coder=field(form, "coder") or None,
            model=field(form, "model") or None,
            priority=_priority(field(form, "priority")),
            after=tuple(app.store.resolve(ref) for ref in _words(field(form, "after"))),
            labels=tuple(_words(field(form, "labels"))),
            parent=app.store.resolve(field(form, "parent")) if field(form, "parent") else None,
            parent_waits=bool(field(form, "parent_waits")),
            isolation=field(form, "isolation") or None,
            base=field(form, "base") or None,
            merge=field(form, "merge") or None,
            max_cost=inputs.amount("max cost", field(form, "max_cost"))
            if field(form, "max_cost")
            else None,
            max_tokens=inputs.count("max tokens", field(form, "max_tokens"))
            if field(form, "max_tokens")
            else None,
        )
        if one.isolation not in (None, "none", "worktree"):
            raise InputError("isolation must be none or worktree")
        (task,) = add_tasks(app, [spec_of(app, one)])
        return f"Added {task.id}: {task.title}"

    return await action(request, do)


async def batch(request: Request) -> Response:
    """`fleet add --batch`: a file of JSON lines, all or nothing."""
    from fleet import inputs
    from fleet.cli.add import Defaults, add_tasks, parse_batch

    def do(app: App, form: Form) -> str:
        data = (form.get("file") or [""])[0].encode("latin-1")
        if not data.strip():
            raise InputError("choose a file of JSON lines first")
        cwd = field(form, "cwd")
        coder = field(form, "coder")
        defaults = Defaults(
            cwd=inputs.cwd(cwd) if cwd else None,
            coder=app.config.check_coder(inputs.name("coder", coder)) if coder else None,
            labels=tuple(inputs.label(x) for x in _words(field(form, "labels"))),
        )
        name = field(form, "name") or "the batch"
        specs, lines = parse_batch(app, name, data, defaults)
        added = add_tasks(app, specs, lines, name)
        return (
            f"Added {len(added)} task{'s' if len(added) != 1 else ''}: "
            + " ".join(t.id for t in added[:20])
            + (" …" if len(added) > 20 else "")
        )

    return await action(request, do)


async def bulk(request: Request) -> Response:
    """Retry or cancel every ticked task, each as `fleet retry` / `fleet cancel` would; the
    ones refused are listed with why."""
    from fleet.cli.change import cancel_task, retry_task

    def do(app: App, form: Form) -> str:
        verb = field(form, "verb")
        ids = [t for t in form.get("ids", []) if t]
        if verb not in ("retry", "cancel"):
            raise InputError("bulk actions are retry and cancel")
        if not ids:
            raise InputError("tick the tasks first")
        changed, refused = [], []
        for ref in ids:
            try:
                task_id = app.store.resolve(ref)
                if verb == "retry":
                    retry_task(app, task_id)
                else:
                    cancel_task(app, task_id, None, block=False)
                changed.append(task_id)
            except FleetError as e:
                refused.append(f"{ref}: {e.message}")
        said = f"{verb}: {len(changed)} of {len(ids)}"
        if refused:
            said += " — refused: " + "; ".join(refused[:10])
        return said

    return await action(request, do)


def _words(text: str) -> list[str]:
    return [w for w in text.replace(",", " ").split() if w]


def _priority(text: str) -> int:
    from fleet.model import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY

    if not text:
        return DEFAULT_PRIORITY
    if not text.isdigit() or not MIN_PRIORITY <= int(text) <= MAX_PRIORITY:
        raise InputError(f"priority must be {MIN_PRIORITY} to {MAX_PRIORITY}")
    return int(text)
