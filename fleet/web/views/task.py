"""One task: its live panel and transcript, attempts, artifacts, diff, checkpoints, lineage and
history, and the actions a person takes on it (each the command line's own function)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.errors import FleetError, InputError, NotFound
from fleet.web import sse
from fleet.web.app import Form, Web, action, field, page

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from fleet.cli.app import App
    from fleet.model import Task

ARTIFACTS = ("PLAN_AND_STATUS.md", "KNOWLEDGE.md")
MAX_ARTIFACT = 1 << 20  # bytes of one artifact shown; the rest is said to be left out
MAX_DIFF = 2 << 20


def panel(web: Web, task_id: str) -> dict[str, Any]:
    """The live part: the task, its current attempt's figures, its unit, its questions."""
    from fleet import live, systemd

    with web.acting() as app:
        task = app.store.get(task_id)
        questions = app.store.questions(task_id)
        checkpoints = app.store.checkpoints(task_id)
    figures = live.read(web.paths, task_id, task.attempts) if task.claimed_by else None
    unit = ("", "")
    if task.claimed_by:
        with contextlib.suppress(FleetError):
            unit = systemd.states(systemd.scope_for(web.paths), [task_id]).get(task_id, unit)
    context = {
        "task": task,
        "figures": figures or {},
        "unit": unit,
        "questions": questions,
        "checkpoints": checkpoints,
    }
    context["html"] = web.templates.get_template("_task_panel.html").render(**context)
    return context


def _artifacts(web: Web, task: Task) -> list[tuple[str, str, bool]]:
    """(name, text, cut) of the task's PLAN_AND_STATUS.md and KNOWLEDGE.md that exist."""
    from fleet import taskdir

    found = []
    directory = taskdir.task_dir(web.paths, task.id) / "artifacts"
    for name in ARTIFACTS:
        try:
            fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_ARTIFACT + 1)
        found.append(
            (name, data[:MAX_ARTIFACT].decode("utf-8", "replace"), len(data) > MAX_ARTIFACT)
        )
    return found


async def task_page(request: Request) -> Response:
    import anyio.to_thread

    from fleet.web import transcript

    web: Web = request.app.state.web
    ref = request.path_params["task_id"]

    def gather() -> dict[str, Any]:
        with web.acting() as app:
            task_id = app.store.resolve(ref)
            attempts = app.store.attempts(task_id)
            usage = app.store.attempt_usage(task_id)
        entries, position, cut = transcript.backlog(web.paths, task_id)
        live_part = panel(web, task_id)
        return {
            **live_part,
            "attempts": attempts,
            "usage": usage,
            "artifacts": _artifacts(web, live_part["task"]),
            "entries": entries,
            "position": position.text(),
            "cut": cut,
        }

    version = web.hub.version  # before: a change while this is made is streamed after it
    try:
        found = await anyio.to_thread.run_sync(gather)
    except FleetError as e:
        return page(request, "error.html", 404 if isinstance(e, NotFound) else 400, error=e)
    return page(request, "task.html", view="tasks", version=version, **found)


async def panel_events(request: Request) -> Response:
    """The panel anew whenever the hub sees a change."""
    web: Web = request.app.state.web
    task_id = request.path_params["task_id"]
    return sse.versions(
        request,
        f"task:{task_id}",
        lambda: panel(web, task_id),
        lambda now, v: (sse.message(now["html"], "panel", v),),
    )


async def transcript_events(request: Request) -> Response:
    """The transcript's new entries, after the browser's Last-Event-ID or the page's position."""
    import asyncio

    from fleet.web import transcript

    web: Web = request.app.state.web
    task_id = request.path_params["task_id"]
    start = transcript.Position.parse(
        sse.last_id(request.headers, request.query_params.get("after"))
    )
    line = web.templates.get_template("_line.html")

    async def stream() -> AsyncIterator[bytes]:
        stopping = asyncio.ensure_future(web.hub.closing())
        try:
            async for batch, position in transcript.follow(web.paths, task_id, start, stopping):
                html = "".join(line.render(e=e) for e in batch)
                yield sse.message(html, "lines", position.text())
        finally:
            stopping.cancel()

    return sse.response(stream())


def lineage(request: Request) -> Response:
    """The tree that holds the task (loaded when its section is opened: it reads every task)."""
    from fleet import tree
    from fleet.store import TaskFilter

    web: Web = request.app.state.web
    with web.acting() as app:
        task_id = app.store.resolve(request.path_params["task_id"])
        tasks = list(app.store.tasks(TaskFilter(include_final=True)))
    root = tree.root_of(tasks, task_id)
    nodes = [n for n in tree.forest(tasks) if n.task.id == root]
    return page(request, "_lineage.html", nodes=nodes, current=task_id)


def history(request: Request) -> Response:
    web: Web = request.app.state.web
    with web.acting() as app:
        task_id = app.store.resolve(request.path_params["task_id"])
        entries = app.store.history(task_id)
    return page(request, "_history.html", entries=entries)


def diff(request: Request) -> Response:
    """The worktree's changes against its base: committed and not yet committed."""
    web: Web = request.app.state.web
    with web.acting() as app:
        task = app.store.get(app.store.resolve(request.path_params["task_id"]))
    text, note = _diff(task)
    return page(request, "_diff.html", text=text, note=note, task=task)


def _diff(task: Task) -> tuple[str, str]:
    from fleet import worktree

    if not task.isolated:
        return "", "This task works in its directory, not in a worktree of its own: no diff."
    if not task.branch or not task.base:
        return "", "The first attempt has not made the worktree yet."
    try:
        if task.worktree and Path(task.worktree).is_dir():
            start = worktree.git(task.worktree, "merge-base", task.base, "HEAD").strip()
            text = worktree.git(task.worktree, "diff", "--no-color", "--no-ext-diff", start)
            where = f"{task.worktree} (uncommitted changes included) against {task.base}"
        else:
            text = worktree.git(
                task.cwd, "diff", "--no-color", "--no-ext-diff", f"{task.base}...{task.branch}"
            )
            where = f"{task.branch} against {task.base}"
    except FleetError as e:
        return "", f"git cannot tell: {e.message}"
    if len(text) > MAX_DIFF:
        return text[:MAX_DIFF], f"{where}; cut at {MAX_DIFF >> 20} MiB"
    return text, where if text else f"no changes: {where}"


# ---------------------------------------------------------------------------- actions


def _task(app: App, request: Request) -> str:
    return app.store.resolve(request.path_params["task_id"])


async def kill(request: Request) -> Response:
    from fleet.cli.control import kill_tasks

    def do(app: App, form: Form) -> str:
        task_id = _task(app, request)
        kill_tasks(app, [task_id], block=False)
        return f"Stopping {task_id}: its whole process tree ends."

    return await action(request, do)


async def retry(request: Request) -> Response:
    from fleet.cli.change import retry_task

    def do(app: App, form: Form) -> str:
        task = retry_task(app, _task(app, request))
        return f"{task.id} is {task.status} again."

    return await action(request, do)


async def cancel(request: Request) -> Response:
    from fleet.cli.change import cancel_task

    def do(app: App, form: Form) -> str:
        task = cancel_task(app, _task(app, request), field(form, "reason") or None, block=False)
        return f"{task.id} is cancelled."

    return await action(request, do)


async def suspend(request: Request) -> Response:
    from fleet.cli.suspend import suspend_task

    def do(app: App, form: Form) -> str:
        task_id = _task(app, request)
        summary = field(form, "summary") or f"suspended by {app.store.actor.by}"
        cp = suspend_task(app, task_id, summary, block=False)
        return f"{task_id} is suspended at checkpoint {cp.n}."

    return await action(request, do)


async def resume(request: Request) -> Response:
    from fleet.cli.control import resume_task

    def do(app: App, form: Form) -> str:
        given = field(form, "checkpoint")
        if given and not given.isdigit():
            raise InputError("the checkpoint is a number")
        task = resume_task(app, _task(app, request), int(given) if given else None)
        return f"{task.id} is ready again."

    return await action(request, do)


async def handoff(request: Request) -> Response:
    from fleet import inputs
    from fleet.cli.lineage import handoff_task

    def do(app: App, form: Form) -> str:
        to = field(form, "to")
        if not to:
            raise InputError("hand it to which coder?", hint="CODER or CODER:MODEL")
        context = (form.get("context") or [""])[0]
        text = inputs.free_text("context", context) if context.strip() else None
        successor = handoff_task(app, _task(app, request), to, text, block=False)
        return f"Handed off to {successor.id} ({to})."

    return await action(request, do)


async def merge(request: Request) -> Response:
    from fleet.cli.control import merge_task

    def do(app: App, form: Form) -> str:
        strategy = field(form, "strategy") or None
        if strategy not in (None, "merge", "rebase", "ff-only", "branch"):
            raise InputError("the strategy is merge, rebase, ff-only or branch")
        return merge_task(app, _task(app, request), strategy)

    return await action(request, do)


async def edit(request: Request) -> Response:
    """`fleet edit` from the edit form: the fields given change, labels and dependencies
    become the lists typed."""
    from fleet import inputs
    from fleet.cli.change import edit_of, edit_task

    def do(app: App, form: Form) -> str:
        task = app.store.get(_task(app, request))

        def changed(name: str, current: str | None) -> str | None:
            if name not in form:
                return None
            value = field(form, name)
            return None if value == (current or "") else value

        description = None
        if "description" in form:
            given = form["description"][0]
            if given != task.description:
                description = inputs.free_text("description", given)
        labels = _words(field(form, "labels")) if "labels" in form else list(task.labels)
        after = (
            [app.store.resolve(r) for r in _words(field(form, "after"))]
            if "after" in form
            else list(task.after)
        )
        priority = changed("priority", str(task.priority))
        if priority is not None and not priority.isdigit():
            raise InputError("priority must be 0 to 4")
        change = edit_of(
            app,
            changed("title", task.title),
            description,
            changed("cwd", task.cwd),
            changed("coder", task.coder),
            changed("model", task.model),
            int(priority) if priority else None,
            labels=[x for x in labels if x not in task.labels],
            unlabel=[x for x in task.labels if x not in labels],
            after=[x for x in after if x not in task.after],
            not_after=[x for x in task.after if x not in after],
            max_cost=changed("max_cost", _number(task.max_cost_usd)),
            max_tokens=changed("max_tokens", _number(task.max_tokens)),
        )
        done = edit_task(app, task.id, change)
        return f"{done.id} changed."

    return await action(request, do)


def _words(text: str) -> list[str]:
    return [w for w in text.replace(",", " ").split() if w]


def _number(value: float | int | None) -> str:
    return "" if value is None else f"{value:g}"
