"""The questions inbox: what agents wait on, each with the controls its kind needs, and the
answers given here (through `questions.give`, as `fleet answer` and Telegram answer)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleet.errors import FleetError, InputError
from fleet.model import QuestionKind, Reply
from fleet.web import sse
from fleet.web.app import Form, Web, action, field, page

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from fleet.cli.app import App


def inbox(web: Web) -> dict[str, Any]:
    """The pending questions, oldest first, with their tasks' titles, and the fragment."""
    with web.acting() as app:
        pending = app.store.questions()
        titles = {}
        for q in pending:
            if q.task not in titles:
                titles[q.task] = app.store.get(q.task).title
        answered = app.store.questions(pending=False)[-10:]
    answered = [q for q in answered if q.status != "pending"][::-1]
    context = {"pending": pending, "titles": titles, "answered": answered}
    html = web.templates.get_template("_questions.html").render(**context)
    return {**context, "html": html}


async def questions_page(request: Request) -> Response:
    import anyio.to_thread

    web: Web = request.app.state.web
    version = web.hub.version  # before: a change while this is made is streamed after it
    try:
        found = await anyio.to_thread.run_sync(inbox, web)
    except FleetError as e:
        return page(request, "error.html", 503, error=e)
    return page(
        request, "questions.html", view="questions", version=version, fragment=found["html"]
    )


async def events(request: Request) -> Response:
    web: Web = request.app.state.web
    return sse.versions(
        request,
        "questions",
        lambda: inbox(web),
        lambda now, v: (sse.message(now["html"], "questions", v),),
        failed=False,
    )


def reply_of(kind: QuestionKind, form: Form, by: str) -> Reply:
    """What the question's controls sent, as the answer `fleet answer` would make of its
    options: the text; the options ticked (and a comment); approve or deny (and a comment)."""
    comment = (form.get("text") or [""])[0].strip() or None
    if kind == QuestionKind.INPUT:
        return Reply(by, comment)
    if kind == QuestionKind.APPROVAL:
        verdict = field(form, "verdict")
        if verdict not in ("approve", "deny"):
            raise InputError("approve or deny it")
        return Reply(by, comment, (), verdict == "approve")
    return Reply(by, comment, tuple(c for c in form.get("choice", []) if c))


async def answer(request: Request) -> Response:
    from fleet import questions
    from fleet.cli.questions import refuse_agents

    client = (request.client.host, request.client.port) if request.client else None
    server = request.scope.get("server")

    def do(app: App, form: Form) -> str:
        from fleet.web import peer

        refuse_agents()
        agent = peer.agent_at(client, server)
        if agent is not None:
            raise FleetError(
                f"an agent cannot answer questions (this request comes from the agent of {agent})",
                hint="a question waits for a person, who has been notified",
            )
        q = app.store.question(app.store.resolve_question(request.path_params["qid"]))
        done = questions.give(app.paths, app.store, q, reply_of(q.kind, form, app.store.actor.by))
        return f"{done.id} answered ({done.answer}); {done.task} goes on."

    return await action(request, do)
