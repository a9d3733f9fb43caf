"""The dashboard in a real headless Chromium against a real `fleet web`, with agents run by
hand (`fleet-run ID`, the command coder printing what the test writes into a FIFO, so their
transcript is the task's events.jsonl): live overview, live transcript, reloads, hostile
text, the door. Screenshots of every page, desktop and phone width, go to ARTIFACTS.

The same under systemd, with a real coder CLI and socket activation: test_web_units.py.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Fleet, fleet_run, run_in_background
from tests.webrig import DESKTOP, PHONE, Server, Talker, browser, logged_in, server, shoot

DEADLINE_MS = 20_000
# The elements that stick out of the screen, for a failure's message.
WIDE = """() => Array.from(document.querySelectorAll('body *'))
  .filter((el) => el.getBoundingClientRect().right > window.innerWidth + 1)
  .slice(0, 8).map((el) => el.tagName + '.' + el.className + ' ' + el.textContent.slice(0, 40))"""


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as found:
        yield found


@pytest.fixture
def web(fleet: Fleet, tmp_path: Path) -> Iterator[Server]:
    fleet.ok("config", "set", "default_coder=command", "notify_desktop=false")
    with server(tmp_path) as running:
        yield running


def talking(fleet: Fleet, project: Path, title: str) -> tuple[str, Talker]:
    talker = Talker(project)
    return fleet.add(title, "--cwd", str(project), "-d", talker.command), talker


def lines(page: Any) -> list[str]:
    return [str(t) for t in page.locator("#transcript .ln .msg").all_inner_texts()]


def test_the_overview_shows_running_tasks_as_they_start(
    web: Server, fleet: Fleet, project: Path, chromium: Any, tmp_path: Path
) -> None:
    page = logged_in(chromium, web.login)
    assert page.locator("h1").inner_text() == "Overview"
    assert "Nothing is running" in page.inner_text("#overview")
    task_id, talker = talking(fleet, project, "index the repository")
    with run_in_background(task_id, project, tmp_path / "run.out"):
        card = page.locator(f"#run-{task_id}")
        card.wait_for(timeout=DEADLINE_MS)  # no reload: the hub pushed it
        assert "index the repository" in card.inner_text()
        assert "command" in card.inner_text()
        assert page.locator(".tile.st-running .n").inner_text().startswith("1")
        talker.say("working on it")
        talker.close()
        page.locator(f"#run-{task_id}").wait_for(state="detached", timeout=DEADLINE_MS)


def test_a_printed_line_appears_in_the_open_transcript_and_a_reload_repeats_none(
    web: Server, fleet: Fleet, project: Path, chromium: Any, tmp_path: Path
) -> None:
    task_id, talker = talking(fleet, project, "talk to me")
    with run_in_background(task_id, project, tmp_path / "run.out"):
        talker.say("first line")
        page = logged_in(chromium, web.login)
        page.goto(f"{web.base}/tasks/{task_id}")
        page.locator("#transcript .msg", has_text="first line").wait_for(timeout=DEADLINE_MS)
        talker.say("second line, live")
        page.locator("#transcript .msg", has_text="second line, live").wait_for(timeout=DEADLINE_MS)
        before = lines(page)
        assert before.count("first line") == 1 and before.count("second line, live") == 1
        page.reload()
        page.locator("#transcript .msg", has_text="second line, live").wait_for(timeout=DEADLINE_MS)
        talker.say("third, after the reload")
        page.locator("#transcript .msg", has_text="third, after the reload").wait_for(
            timeout=DEADLINE_MS
        )
        after = lines(page)
        assert after[: len(before)] == before  # resumed: nothing lost, nothing twice
        assert after.count("third, after the reload") == 1 and len(after) == len(before) + 1
        talker.close()


def test_hostile_titles_and_output_render_as_text(
    web: Server, fleet: Fleet, project: Path, chromium: Any, tmp_path: Path
) -> None:
    title = "<script>window.pwned = 'title'</script>"
    talker = Talker(project)
    task_id = fleet.add(title, "--cwd", str(project), "-d", talker.command)
    page = logged_in(chromium, web.login)
    with run_in_background(task_id, project, tmp_path / "run.out"):
        page.goto(f"{web.base}/tasks/{task_id}")
        talker.say("<img src=x onerror=\"window.pwned='output'\">")
        talker.say("\x1b[1;31malarm\x1b[0m https://evil.example/")
        page.locator("#transcript .msg", has_text="alarm").wait_for(timeout=DEADLINE_MS)
        assert page.locator("h1.task-title").inner_text() == title
        assert "<img src=x onerror=" in page.inner_text("#transcript")
        assert page.locator("#transcript img").count() == 0
        assert page.locator("#transcript a").count() == 0  # links are not clickable
        assert page.locator("#transcript .a-f1.a-bold", has_text="alarm").count() == 1
        assert page.evaluate("window.pwned") is None
        page.goto(f"{web.base}/tasks")
        assert page.locator("td.title a", has_text="<script>").count() == 1
        page.goto(f"{web.base}/")
        assert page.evaluate("window.pwned") is None
        talker.close()


def test_a_post_without_the_csrf_token_is_refused(web: Server, fleet: Fleet, chromium: Any) -> None:
    page = logged_in(chromium, web.login)
    status = page.evaluate(
        "async () => (await fetch('/pause', {method: 'POST', body: new FormData()})).status"
    )
    assert status == 403
    assert json.loads(fleet.ok("status", "--json"))["pause"] is None
    # With the page's token (as htmx sends it) the same request goes through.
    page.locator("form.inline button").click()
    page.locator(".flash.ok").wait_for(timeout=DEADLINE_MS)
    assert json.loads(fleet.ok("status", "--json"))["pause"]["by"].startswith("web:")


def test_without_the_token_the_dashboard_is_refused(web: Server, chromium: Any) -> None:
    context = chromium.new_context()
    page = context.new_page()
    for path in ("/", "/tasks", "/questions", "/config"):
        response = page.goto(web.base + path)
        assert response is not None and response.status == 401
        assert "fleet web url" in page.inner_text("body")
    response = page.goto(web.base + "/login?token=not-the-token")
    assert response is not None and response.status == 401
    context.close()


def test_every_page_looks_right_on_a_desktop_and_a_phone(
    web: Server, fleet: Fleet, project: Path, chromium: Any, tmp_path: Path
) -> None:
    """Screenshots for a person to look at (their paths are printed), and what a phone's
    width must not break: no page wider than the screen."""
    fleet.add("write the changelog", "--cwd", str(project), "--label", "release", "-d", "true")
    fleet.add("fix the flaky test", "--cwd", str(project), "-p", "1", "-d", "true")
    blocked = fleet.add("deploy to staging", "--cwd", str(project), "-d", "true")
    fleet.ok("block", blocked, "--reason", "needs the staging credentials")
    for title, script in (("bump the version", "true"), ("run the linter", "exit 3")):
        finished = fleet.add(title, "--cwd", str(project), "-d", script)
        assert fleet_run(finished, project).returncode in (0, 1)  # figures for the analytics
    task_id, talker = talking(fleet, project, "refactor the parser")
    with run_in_background(task_id, project, tmp_path / "run.out"):
        for line in ("reading src/parser.py", "\x1b[32m✓\x1b[0m 42 tests pass", "writing plan"):
            talker.say(line)
        for name, viewport, scheme in (("desktop", DESKTOP, "light"), ("phone", PHONE, "dark")):
            page = logged_in(chromium, web.login, viewport, scheme)
            page.locator(f"#run-{task_id}").wait_for(timeout=DEADLINE_MS)
            for path, label in (
                ("/", "overview"),
                ("/tasks", "tasks"),
                (f"/tasks/{task_id}", "task"),
                ("/questions", "questions"),
                ("/analytics", "analytics"),
                ("/config", "config"),
            ):
                page.goto(web.base + path)
                page.wait_for_load_state("networkidle") if path == "/analytics" else None
                if label == "task":
                    page.locator("#transcript .msg", has_text="writing plan").wait_for(
                        timeout=DEADLINE_MS
                    )
                    if name == "desktop":  # the attempts table is whole, not scrolled
                        box = page.locator(".scroll", has=page.locator("th", has_text="cost"))
                        assert box.evaluate("e => e.scrollWidth <= e.clientWidth")
                wide = page.evaluate("document.documentElement.scrollWidth")
                assert wide <= viewport["width"] + 1, (name, label, wide, page.evaluate(WIDE))
                shoot(page, f"{name}-{label}")
            page.context.close()
        talker.close()


def test_the_server_stops_at_once_with_live_pages_open(
    web: Server, fleet: Fleet, project: Path, chromium: Any
) -> None:
    task_id = fleet.add("watched", "--cwd", str(project), "-d", "true")
    pages = []
    for path in ("/", f"/tasks/{task_id}", "/questions"):
        page = logged_in(chromium, web.login)
        page.goto(web.base + path)
        pages.append(page)
    web.stop()
    log = web.log.read_text()
    # Ended by its SIGTERM, as systemd counts a clean stop (uvicorn re-raises the signal).
    assert web.proc.returncode == -signal.SIGTERM, log
    # uvicorn says so when it had to cut streams off after its grace period: they ended first.
    assert "timeout graceful shutdown exceeded" not in log and "Traceback" not in log, log
    for page in pages:
        page.context.close()


def _events(web: Server, path: str, cookie: str, last: str | None = None) -> Any:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=20)
    headers = {"Cookie": cookie, "Accept": "text/event-stream"}
    if last is not None:
        headers["Last-Event-ID"] = last
    conn.request("GET", path, headers=headers)
    return conn, conn.getresponse()


def _messages(response: Any, count: int) -> list[dict[str, str]]:
    """The next `count` SSE messages of a stream, as their fields."""
    found: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    while len(found) < count:
        line = response.fp.readline().decode().rstrip("\n")
        if not line:
            if "data" in fields:
                found.append(fields)
            fields = {}
            continue
        key, _, value = line.partition(": ")
        fields[key] = fields[key] + "\n" + value if key in fields else value
    return found


def test_a_reconnecting_stream_resumes_after_its_last_event_id(
    web: Server, fleet: Fleet, project: Path
) -> None:
    from fleet.eventlog import CURSOR, EventLog
    from fleet.paths import resolve
    from fleet.web.access import COOKIE, Keys

    task_id = fleet.add("by hand", "--cwd", str(project))
    directory = resolve().tasks / task_id
    directory.mkdir(parents=True)
    log = EventLog(directory)
    for n in range(3):
        log.append({"time": f"2026-12-01T10:00:0{n}Z", "message": f"old {n}", "event": "output"})
    cookie = f"{COOKIE}={Keys(web.login.split('token=')[1]).session}"
    conn, response = _events(web, f"/tasks/{task_id}/events", cookie)
    (first,) = _messages(response, 1)
    assert first["event"] == "lines" and first["data"].count('class="ln') == 3
    journal, file = first["id"].split()
    assert file.startswith(CURSOR) and journal == "-"  # no journal here: the event log's cursor
    conn.close()
    log.append({"time": "2026-12-01T10:00:05Z", "message": "new while away", "event": "output"})
    conn, response = _events(web, f"/tasks/{task_id}/events", cookie, last=first["id"])
    (again,) = _messages(response, 1)
    assert again["data"].count('class="ln') == 1 and "new while away" in again["data"]
    log.append({"time": "2026-12-01T10:00:06Z", "message": "and live", "event": "output"})
    (live,) = _messages(response, 1)
    assert "and live" in live["data"] and "new while away" not in live["data"]
    conn.close()


def test_no_other_command_imports_the_web_stack(fleet: Fleet) -> None:
    import subprocess
    import sys

    for args in (["--help"], ["ls"], ["status"]):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "fleet", *args],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        loaded = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
        heavy = [
            m
            for m in loaded
            if m.split(".")[0] in ("starlette", "uvicorn", "jinja2", "markdown_it")
        ]
        assert not heavy and not [m for m in loaded if m.startswith("fleet.web")], (args, heavy)


def test_an_agent_cannot_answer_through_the_dashboard(
    web: Server, fleet: Fleet, project: Path
) -> None:
    """Agents run as the user and can read the token: the request of a process that is an
    agent (FLEET_TASK_ID set, as fleet-run gives its coder) is refused as `fleet answer`
    refuses it, and a person's goes through."""
    import subprocess
    import sys

    from fleet.model import QuestionKind
    from fleet.paths import resolve
    from fleet.store import open_store
    from fleet.web.access import COOKIE, Keys

    task_id = fleet.add("asks", "--cwd", str(project))
    store = open_store(resolve())
    try:
        assert store.claim_task(task_id, "test-host", 60, "command", None) is not None
        q = store.ask(task_id, QuestionKind.INPUT, "go?", [], False, "2099-01-01T00:00:00Z")
    finally:
        store.close()
    keys = Keys(web.login.split("token=")[1])
    post = (
        "import http.client, sys\n"
        f"c = http.client.HTTPConnection('127.0.0.1', {web.port})\n"
        f"c.request('POST', '/questions/{q.id}/answer', body='text=yes',"
        " headers={'Content-Type': 'application/x-www-form-urlencoded',"
        f" 'Cookie': '{COOKIE}={keys.session}', 'X-CSRF-Token': '{keys.csrf}'}})\n"
        "r = c.getresponse(); print(r.status); print(r.read().decode())\n"
    )
    agent = subprocess.run(
        [sys.executable, "-c", post], capture_output=True, text=True, check=True,
        env={**os.environ, "FLEET_TASK_ID": task_id},
    )  # fmt: skip
    assert agent.stdout.startswith("400") and "an agent cannot answer" in agent.stdout
    assert json.loads(fleet.ok("questions", "--json"))[0]["id"] == q.id  # still pending
    person = subprocess.run(
        [sys.executable, "-c", post], capture_output=True, text=True, check=True
    )
    assert person.stdout.startswith("200"), person.stdout
