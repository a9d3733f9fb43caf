"""The dashboard's routes through Starlette's test client: every page, fragment and action,
the door (login, cookie, CSRF, Host), and hostile text shown as text.

The store, the configuration and the task directories are real (each test's FLEET_HOME);
actions run the command line's own functions, so their refusals are the command line's. The
browser, the streams over a real socket and systemd are in test_web_live.py and
test_web_browser.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fleet.audit import Actor
from fleet.eventlog import EventLog
from fleet.model import QuestionKind
from fleet.paths import resolve
from fleet.store import open_store
from fleet.store.base import OutgoingSpec
from fleet.web import access, text
from fleet.web.app import create
from tests import test_listen
from tests.conftest import Fleet, run_fleet

BASE = "http://127.0.0.1:8768"


class Web:
    def __init__(self, client: TestClient, keys: access.Keys) -> None:
        self.client = client
        self.keys = keys

    def get(self, path: str, **kw: Any) -> Any:
        return self.client.get(path, **kw)

    def post(self, path: str, data: dict[str, Any] | None = None, **kw: Any) -> Any:
        headers = {"x-csrf-token": self.keys.csrf, "hx-request": "true", **kw.pop("headers", {})}
        return self.client.post(path, data=data or {}, headers=headers, **kw)


@pytest.fixture
def web(fleet: Fleet) -> Iterator[Web]:
    fleet.ok("config", "set", "default_coder=command")
    paths = resolve()
    token = access.load_token(paths)
    keys = access.Keys(token)
    app = create(paths, keys, access.allowed_hosts("127.0.0.1", 8768, ["fleet.example.com"]))
    with TestClient(app, base_url=BASE) as client:
        assert client.get(f"/login?token={token}", follow_redirects=False).status_code == 303
        yield Web(client, keys)


def claimed(task_id: str) -> None:
    store = open_store(resolve())
    try:
        assert store.claim_task(task_id, "test-host", 60, "command", None) is not None
    finally:
        store.close()


def flash(response: Any) -> str:
    found = re.search(r"<span>(.*?)</span>", response.text, re.S)
    return found.group(1) if found else response.text


# ---------------------------------------------------------------------------- the door


def test_without_the_login_link_every_page_is_refused(fleet: Fleet) -> None:
    paths = resolve()
    keys = access.Keys(access.load_token(paths))
    app = create(paths, keys, access.allowed_hosts("127.0.0.1", 8768, []))
    with TestClient(app, base_url=BASE) as client:
        for path in ("/", "/tasks", "/questions", "/analytics", "/config", "/events/overview"):
            response = client.get(path)
            assert response.status_code == 401, path
        assert "fleet web url" in client.get("/").text
        assert client.get("/login?token=wrong").status_code == 401
        client.cookies.set(access.COOKIE, "forged")
        assert client.get("/").status_code == 401
        assert client.get("/static/fleet.css").status_code == 200  # public, holds nothing


def test_the_login_link_sets_a_strict_cookie_and_leaves_the_token_behind(fleet: Fleet) -> None:
    paths = resolve()
    token = access.load_token(paths)
    assert (paths.home / access.TOKEN_FILE).stat().st_mode & 0o777 == 0o600
    app = create(paths, access.Keys(token), access.allowed_hosts("127.0.0.1", 8768, []))
    with TestClient(app, base_url=BASE) as client:
        response = client.get(f"/login?token={token}", follow_redirects=False)
        assert response.headers["location"] == "/"
        cookie = response.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and token not in cookie
        assert response.headers["referrer-policy"] == "no-referrer"
        page = client.get("/")
        assert page.status_code == 200
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"


def test_a_new_token_logs_every_browser_out(web: Web, fleet: Fleet) -> None:
    assert web.get("/").status_code == 200
    old = fleet.ok("web", "url").strip()
    new = fleet.ok("web", "url", "--new-token").strip()
    assert old != new and new.startswith("http://127.0.0.1:8768/login?token=")
    assert access.load_token(resolve()) == new.split("token=")[1]


def test_another_host_name_is_refused_before_anything(web: Web) -> None:
    assert web.get("/", headers={"host": "evil.example:8768"}).status_code == 421
    assert web.get("/", headers={"host": "localhost:8768"}).status_code == 200
    assert web.get("/", headers={"host": "fleet.example.com"}).status_code == 200
    response = web.post("/pause", headers={"host": "rebound.example:8768"})
    assert response.status_code == 421


def test_a_change_without_the_csrf_token_is_refused_and_changes_nothing(
    web: Web, fleet: Fleet
) -> None:
    response = web.client.post("/pause", data={"reason": "x"})
    assert response.status_code == 403 and "CSRF" in response.text
    response = web.client.post("/pause", headers={"x-csrf-token": "guess"})
    assert response.status_code == 403
    response = web.post("/pause", headers={"origin": "http://evil.example"})
    assert response.status_code == 403 and "another site" in response.text
    assert json.loads(fleet.ok("status", "--json"))["pause"] is None


# ---------------------------------------------------------------------------- pages


def test_every_page_renders(web: Web, fleet: Fleet, project: Path) -> None:
    task_id = fleet.add("first task", "--cwd", str(project), "-d", "true")
    for path in ("/", "/tasks", f"/tasks/{task_id}", "/questions", "/analytics", "/config"):
        response = web.get(path)
        assert response.status_code == 200, (path, response.text[:500])
        assert "<html" in response.text and "/static/htmx.min.js" in response.text
    for path in ("/analytics?since=24h", "/analytics?since=all", "/tasks?status=all"):
        assert web.get(path).status_code == 200
    for part in ("lineage", "history", "diff"):
        assert web.get(f"/tasks/{task_id}/{part}").status_code == 200
    assert web.get("/tasks/fl-zzzzzz").status_code == 404


def test_the_overview_shows_status_and_undelivered_notifications(web: Web, fleet: Fleet) -> None:
    store = open_store(resolve(), Actor("test", "test"))
    try:
        store.spool([OutgoingSpec("telegram", "1", "question", {"text": "hi"})])
    finally:
        store.close()
    snap = json.loads(fleet.ok("status", "--json"))
    assert snap["undelivered"] == 1
    assert "1 undelivered" in fleet.ok("status")
    page = web.get("/").text
    assert "1 notification</strong> not delivered yet" in page
    fleet.ok("pause", "--reason", "lunch")
    page = web.get("/").text
    assert "Paused" in page and "lunch" in page


def test_the_task_list_filters_searches_and_pages(web: Web, fleet: Fleet, project: Path) -> None:
    ids = [fleet.add(f"job {n:03d}", "--cwd", str(project), "-d", "true") for n in range(60)]
    fleet.add("odd one", "--cwd", str(project), "--label", "rare", "--coder", "claude")
    page = web.get("/tasks").text
    assert "61 tasks" in page and "page 1 of 2" in page and "odd one" in page
    assert ids[0] not in page  # newest first: the oldest is on page 2
    assert ids[0] in web.get("/tasks?page=2").text
    found = web.get("/tasks?q=job+059").text
    assert "1 task" in found and ids[59] in found
    assert "odd one" in web.get("/tasks?label=rare").text
    assert "1 task<" in web.get("/tasks?label=rare").text
    assert "1 task<" in web.get("/tasks?coder=claude").text
    assert "60 tasks" in web.get("/tasks?coder=command").text  # default_coder counts
    rows = web.get("/tasks?q=odd", headers={"hx-request": "true", "hx-target": "rows"}).text
    assert "<html" not in rows and "odd one" in rows
    assert web.get("/tasks?status=bogus").status_code == 400


# ---------------------------------------------------------------------------- actions


def test_adding_a_task_from_the_form_checks_it_as_fleet_add_does(
    web: Web, fleet: Fleet, project: Path
) -> None:
    response = web.post(
        "/tasks",
        {
            "title": "from the browser",
            "description": "@/etc/passwd is text here",
            "cwd": str(project),
            "priority": "1",
            "labels": "web, ui",
            "max_cost": "2.5",
        },
    )
    assert response.status_code == 200, response.text
    assert response.headers["hx-trigger"] == "fleet-changed"
    task_id = re.search(r"fl-[a-z0-9]{6}", flash(response))
    assert task_id is not None
    task = fleet.show(task_id.group(0))
    assert task["description"] == "@/etc/passwd is text here"  # never read as a file
    assert task["labels"] == ["web", "ui"] and task["priority"] == 1
    assert task["max_cost_usd"] == 2.5
    history = json.loads(fleet.ok("history", task["id"], "--json"))
    assert history[0]["action"] == "added" and history[0]["by"].startswith("web:")
    refused = web.post("/tasks", {"title": "x", "cwd": "/nonexistent/dir"})
    assert refused.status_code == 400 and "nonexistent" in flash(refused)
    assert web.post("/tasks", {"title": "", "cwd": str(project)}).status_code == 400
    bad = web.post("/tasks", {"title": "y", "cwd": str(project), "coder": "nope"})
    assert bad.status_code == 422 and "unknown coder" in bad.text


def test_a_batch_upload_is_all_or_nothing(web: Web, fleet: Fleet, project: Path) -> None:
    good = "\n".join(
        json.dumps(line)
        for line in (
            {"title": "build", "ref": "b"},
            {"title": "test", "after": ["b"], "labels": ["ci"]},
        )
    )
    files = {"file": ("tasks.jsonl", good.encode(), "application/json")}
    headers = {"x-csrf-token": web.keys.csrf}
    response = web.client.post(
        "/tasks/batch", data={"cwd": str(project)}, files=files, headers=headers
    )
    assert response.status_code == 200 and "Added 2 tasks" in response.text
    bad = good + '\n{"title": "x", "priority": 9}'
    files = {"file": ("more.jsonl", bad.encode(), "application/json")}
    response = web.client.post(
        "/tasks/batch", data={"cwd": str(project), "name": "more.jsonl"}, files=files,
        headers=headers,
    )  # fmt: skip
    assert response.status_code == 400 and "more.jsonl line 3" in response.text
    assert len(json.loads(fleet.ok("ls", "--json"))) == 2


def test_bulk_retry_and_cancel_go_task_by_task(web: Web, fleet: Fleet, project: Path) -> None:
    a = fleet.add("a", "--cwd", str(project))
    b = fleet.add("b", "--cwd", str(project))
    response = web.post("/tasks/bulk", {"verb": "cancel", "ids": [a, b]})
    assert "cancel: 2 of 2" in response.text
    assert fleet.show(a)["status"] == fleet.show(b)["status"] == "cancelled"
    fleet.ok("retry", b)
    claimed(b)  # running: fleet retry refuses it
    response = web.post("/tasks/bulk", {"verb": "retry", "ids": [a, b]})
    assert "retry: 1 of 2" in response.text and f"refused: {b}" in response.text
    assert fleet.show(a)["status"] == "ready"
    assert web.post("/tasks/bulk", {"verb": "retry"}).status_code == 400


# On a store that several hosts share: the `url` (FLEET_STORE) and `ear` of test_listen.
url = test_listen.url
ear = test_listen.ear


def test_stops_and_answers_of_another_hosts_task_go_to_that_host(
    url: str, ear: Callable[[], list[str]], web: Web, fleet: Fleet, project: Path
) -> None:
    """Each stop asks the host that runs the task, through the store (fleet.stopping: a kill
    request, which notifies that host's fleet-listen), and an answer notifies the host
    whose agent waits: nothing here could reach another host's units or files."""
    store = open_store(resolve())
    try:
        for verb, form in (
            ("kill", {}),
            ("cancel", {"reason": "not needed"}),
            ("suspend", {"summary": "later"}),
            ("handoff", {"to": "command"}),
        ):
            task_id = fleet.add(verb, "--cwd", str(project))
            claimed(task_id)  # by test-host, not this one
            ear()
            response = web.post(f"/tasks/{task_id}/{verb}", form)
            assert response.status_code == 200, (verb, response.text)
            assert f"kill test-host {task_id}" in ear(), verb
            assert store.kill_requested(task_id, 1), verb
        task_id = fleet.add("asks", "--cwd", str(project))
        claimed(task_id)
        q = store.ask(task_id, QuestionKind.INPUT, "Why?", [], False, "2099-01-01T00:00:00Z")
        ear()
        assert web.post(f"/questions/{q.id}/answer", {"text": "because"}).status_code == 200
        assert ear() == [f"answer test-host {task_id}"]
    finally:
        store.close()


def test_task_actions_are_the_command_lines(web: Web, fleet: Fleet, project: Path) -> None:
    task_id = fleet.add("steer me", "--cwd", str(project), "-d", "true")
    refused = web.post(f"/tasks/{task_id}/kill")
    assert refused.status_code == 409 and "not running" in refused.text  # as fleet kill says
    response = web.post(f"/tasks/{task_id}/suspend", {"summary": "halfway there"})
    assert response.status_code == 200 and "checkpoint 1" in response.text
    task = fleet.show(task_id)
    assert task["status"] == "suspended" and task["reason"].startswith("suspended by web:")
    cps = json.loads(fleet.ok("checkpoints", task_id, "--json"))
    assert cps[0]["summary"] == "halfway there" and cps[0]["by"].startswith("web:")
    retried = web.post(f"/tasks/{task_id}/retry")
    assert retried.status_code == 409 and "fleet resume" in retried.text  # the CLI's hint
    assert web.post(f"/tasks/{task_id}/resume").status_code == 200
    assert fleet.show(task_id)["status"] == "ready"
    response = web.post(
        f"/tasks/{task_id}/edit",
        {
            "title": "steered",
            "description": "new words",
            "cwd": str(project),
            "coder": "",
            "model": "",
            "priority": "0",
            "labels": "x y",
            "after": "",
            "max_cost": "",
            "max_tokens": "1000",
        },
    )
    assert response.status_code == 200, response.text
    task = fleet.show(task_id)
    assert (task["title"], task["description"], task["priority"]) == ("steered", "new words", 0)
    assert task["labels"] == ["x", "y"] and task["max_tokens"] == 1000
    same = web.post(f"/tasks/{task_id}/edit", {"title": "steered"})
    assert same.status_code == 400 and "nothing to change" in same.text
    merge = web.post(f"/tasks/{task_id}/merge")
    assert merge.status_code in (400, 409) and "worktree" in merge.text
    response = web.post(f"/tasks/{task_id}/handoff", {"to": "command", "context": "go on"})
    assert response.status_code == 200, response.text
    assert fleet.show(task_id)["status"] == "handed-off"
    assert web.post(f"/tasks/{task_id}/handoff", {"to": "nope"}).status_code >= 400
    other = fleet.add("withdraw me", "--cwd", str(project))
    assert web.post(f"/tasks/{other}/cancel", {"reason": "not needed"}).status_code == 200
    assert fleet.show(other)["reason"] == "not needed"
    assert web.post(f"/tasks/{other}/retry").status_code == 200
    by = {e["action"]: e["by"] for e in json.loads(fleet.ok("history", task_id, "--json"))}
    assert all(by[a].startswith("web:") for a in ("suspended", "resumed", "edited"))


def test_pause_and_resume(web: Web, fleet: Fleet) -> None:
    assert web.post("/pause", {"reason": "deploy"}).status_code == 200
    pause = json.loads(fleet.ok("status", "--json"))["pause"]
    assert pause["reason"] == "deploy" and pause["by"].startswith("web:")
    assert web.post("/resume").status_code == 200
    assert json.loads(fleet.ok("status", "--json"))["pause"] is None


def test_a_question_is_answered_from_its_controls_and_the_first_answer_wins(
    web: Web, fleet: Fleet, project: Path
) -> None:
    task_id = fleet.add("asks", "--cwd", str(project))
    claimed(task_id)
    store = open_store(resolve())
    try:
        pick = store.ask(
            task_id, QuestionKind.CHOICE, "Which <b>colour</b>?", ["red", "blue"], False,
            "2099-01-01T00:00:00Z",
        )  # fmt: skip
        vote = store.ask(
            task_id, QuestionKind.APPROVAL, "Ship it?", [], False, "2099-01-01T00:00:00Z"
        )
        words = store.ask(task_id, QuestionKind.INPUT, "Why?", [], False, "2099-01-01T00:00:00Z")
    finally:
        store.close()
    page = web.get("/questions").text
    assert 'type="radio" name="choice" value="2"' in page
    assert "Which &lt;b&gt;colour&lt;/b&gt;?" in page and "<b>colour" not in page
    assert 'value="approve"' in page and 'value="deny"' in page
    bad = web.post(f"/questions/{pick.id}/answer", {"choice": "9"})
    assert bad.status_code == 400 and "not an option" in bad.text
    ok = web.post(f"/questions/{pick.id}/answer", {"choice": "2", "text": "the calm one"})
    assert ok.status_code == 200 and "blue" in ok.text
    late = web.post(f"/questions/{pick.id}/answer", {"choice": "1"})
    assert late.status_code == 409 and "already answered by web:" in late.text
    assert fleet("answer", pick.id, "--choice", "1").code == 4  # the command line agrees
    assert web.post(f"/questions/{vote.id}/answer", {"verdict": "deny"}).status_code == 200
    assert web.post(f"/questions/{words.id}/answer", {"text": ""}).status_code == 400
    assert web.post(f"/questions/{words.id}/answer", {"text": "because"}).status_code == 200
    answered = {q["id"]: q for q in json.loads(fleet.ok("questions", "--all", "--json"))}
    assert answered[pick.id]["comment"] == "the calm one"
    assert answered[vote.id]["approved"] is False
    assert answered[words.id]["answer"] == "because"
    assert answered[words.id]["answered_by"].startswith("web:")


def test_configuration_edits_are_checked_by_the_declarations(web: Web, fleet: Fleet) -> None:
    page = web.get("/config").text
    assert "max_concurrent" in page and "How many tasks may run at once" in page
    bad = web.post("/config/max_concurrent", {"value": "0"})
    assert bad.status_code == 422
    assert 'class="field-error"' in bad.text and "at least 1" in bad.text
    assert 'value="0"' in bad.text  # what was typed stays, next to its error
    assert fleet.ok("config", "get", "max_concurrent").strip() == "4"
    ok = web.post("/config/max_concurrent", {"value": "7"})
    assert ok.status_code == 200 and "Saved." in ok.text and "file" in ok.text
    assert fleet.ok("config", "get", "max_concurrent").strip() == "7"
    assert web.post("/config/secret_variables", {"value": '["A_B"]'}).status_code == 200
    assert json.loads(fleet.ok("config", "get", "secret_variables")) == ["A_B"]
    assert web.post("/config/web_listen", {"value": "nowhere"}).status_code == 422
    assert web.post("/config/no_such_key", {"value": "1"}).status_code == 422


def test_the_configuration_page_masks_the_store_password(
    web: Web, fleet: Fleet, pg_cluster: Any
) -> None:
    # The cluster trusts its socket, so the password is only there to be masked.
    url = pg_cluster.new_database().replace("fleet@", "fleet:pw-9@")
    (resolve().config_file).write_text(f'store = "{url}"\n')
    masked = url.replace("pw-9", "***")
    page = web.get("/config").text
    assert masked in page and "pw-9" not in page
    # The masked field sent back unchanged keeps the password; a new value replaces it.
    assert web.post("/config/store", {"value": masked}).status_code == 200
    assert f'store = "{url}"' in resolve().config_file.read_text()
    assert web.post("/config/store", {"value": ""}).status_code == 200
    assert "pw-9" not in resolve().config_file.read_text()


# ---------------------------------------------------------------------------- hostile text


def test_hostile_titles_and_output_render_as_text(web: Web, fleet: Fleet, project: Path) -> None:
    task_id = fleet.add("<script>alert(1)</script>", "--cwd", str(project))
    log = EventLog(resolve().tasks / task_id)
    (resolve().tasks / task_id).mkdir(parents=True, exist_ok=True)
    for message in (
        '<img src=x onerror="alert(2)">',
        "\x1b[31mred\x1b[0m \x1b]8;;http://evil.example\x07click\x1b]8;;\x07 \x1b[2J\x07bell",
        "see https://evil.example/x and \u202eevil",
    ):
        log.append(
            {"time": "2026-12-01T10:00:00Z", "message": message, "attempt": 1, "event": "output"}
        )
    artifacts = resolve().tasks / task_id / "artifacts"
    artifacts.mkdir()
    (artifacts / "PLAN_AND_STATUS.md").write_text(
        "# Plan\n\n<script>alert(3)</script>\n\n[site](javascript:alert(4)) ![x](http://evil/p.png)\n"
    )
    for path in ("/tasks", f"/tasks/{task_id}"):
        html = web.get(path).text
        assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    page = web.get(f"/tasks/{task_id}").text
    assert "<img" not in page and "&lt;img src=x onerror=" in page
    assert '<span class="a-f1">red</span>' in page
    assert "evil.example\x07" not in page and "click" in page  # OSC 8 link dropped, text kept
    assert '<span class="ctl">\\x07</span>bell' in page
    assert '<span class="ctl">\\u202e</span>' in page
    assert "<a href" not in page.split('id="transcript"')[1].split("</section>")[0]
    markdown = page.split('class="markdown"')[1].split("</section>")[0]
    assert "<h1>Plan</h1>" in markdown and "&lt;script&gt;alert(3)" in markdown
    assert '"javascript:' not in markdown and "[site](javascript:alert(4))" in markdown  # text
    assert "[image x: http://evil/p.png]" in page and 'src="http://evil' not in page


def test_text_rendering_units() -> None:
    assert (
        str(text.ansi("\x1b[1;38;5;2mgo\x1b[22m!"))
        == '<span class="a-f2 a-bold">go</span><span class="a-f2">!</span>'
    )
    assert str(text.ansi("a\x1b[10;20Hb\x1b[?25lc")) == "abc"
    assert str(text.ansi("<&>")) == "&lt;&amp;&gt;"
    assert str(text.ansi("https://x.example/a?b=1.", links=True)) == (
        '<a href="https://x.example/a?b=1" rel="noopener noreferrer nofollow"'
        ' target="_blank">https://x.example/a?b=1</a>.'
    )
    assert "<a " not in str(text.ansi("https://x.example/a"))
    md = str(text.markdown("**b** <i>raw</i> [l](https://a.example)"))
    assert "<strong>b</strong>" in md and "&lt;i&gt;raw&lt;/i&gt;" in md and "<a " not in md
    assert '<a href="https://a.example"' in str(text.markdown("[l](https://a.example)", True))
    assert 'class="d-add"' in str(text.diff("+new\n-old\n@@ x @@"))


def test_listening_beyond_loopback_needs_the_setting(fleet: Fleet) -> None:
    refused = fleet("web", "--listen", "0.0.0.0:8768")
    assert refused.code == 5 and "other hosts can reach" in refused.err
    assert "web_allow_remote=true" in refused.err
    bad = fleet("web", "--listen", "nowhere")
    assert bad.code == 2 and "is not ADDRESS:PORT" in bad.err
    assert fleet("config", "set", "web_listen=0.0.0.0:8768").code == 0
    assert fleet("setup", "--web", "--dry-run").code == 5  # refused before anything is written


def test_setup_renders_the_socket_and_its_service(fleet: Fleet) -> None:
    done = run_fleet("setup", "--web", "--dry-run")  # the installed programs: their paths
    assert done.code == 0, done.err
    out = done.out
    assert "ListenStream=127.0.0.1:8768" in out and "WantedBy=sockets.target" in out
    assert "fleet web\n" in out and "Requires=fleet-web.socket" in out and "Type=notify" in out
    fleet.ok("config", "set", "web_listen=/run/fleet/web.sock")
    out = run_fleet("setup", "--web", "--dry-run").out
    assert "ListenStream=/run/fleet/web.sock" in out and "SocketMode=0600" in out


def test_the_overview_shows_each_running_agents_focus_and_leases(
    web: Web, fleet: Fleet, project: Path
) -> None:
    task_id = fleet.add("busy", "--cwd", str(project), "--coder", "command", "-d", "true")
    store = open_store(resolve(), Actor("agent", "test"))
    try:
        assert store.claim_task(task_id, "runner", 60, "command", None) is not None
        store.set_focus(task_id, "tuning the <parser>")
        store.claim_resource(task_id, "src/parser.py", 60, "")
    finally:
        store.close()
    page = web.get("/").text
    assert "focus: tuning the &lt;parser&gt;" in page
    assert "holds: src/parser.py" in page


def test_the_dashboard_names_each_tasks_host_and_lists_the_hosts(
    web: Web, fleet: Fleet, project: Path
) -> None:
    from fleet.store.hosts import HostInfo
    from tests.conftest import store_sql

    task_id = fleet.add("on h1", "--cwd", str(project), "-d", "true")
    store = open_store(resolve())
    try:
        store.heartbeat(HostInfo("h1", None, None, ("gpu",), 2), 300)
        store.heartbeat(HostInfo("h2", None, None, (), 4), 300)
        assert store.claim_task(task_id, "h1", 60, "command", None) is not None
    finally:
        store.close()
    store_sql(resolve().home, "UPDATE hosts SET last_seen = '2000-01-01T00:00:00.000Z'"
              " WHERE name = 'h2'")  # fmt: skip
    rows = web.get("/tasks", headers={"hx-request": "true", "hx-target": "rows"}).text
    (row,) = [r for r in rows.split("<tr>") if task_id in r]
    assert '<td class="hide-s">h1</td>' in row
    page = web.get("/").text
    hosts = page[page.index("<h2>Hosts</h2>") :].split("</table>")[0]
    assert re.search(r"h1</td><td><span[^>]*>alive</span></td><td>1/2</td>", hosts)
    assert re.search(r"h2</td><td><span[^>]*>silent</span></td><td>0/4</td>", hosts)
    assert '<span class="label">gpu</span>' in hosts
    task = web.get(f"/tasks/{task_id}").text
    assert '<dt>host</dt><dd class="mono">h1</dd>' in task
    assert re.search(r'<td>1</td>\s*<td class="mono">h1</td>', task)
