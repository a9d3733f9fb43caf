"""The dashboard's figures: how soon a line an agent prints shows in the browser, how long the
pages take with 10,000 tasks, what fifty open live pages cost while nothing happens, how big
the server is, and (web-units, under systemd) the first answer after socket activation.

Targets from the issue: event -> visible median <= 300 ms; page render with 10,000 tasks
<= 200 ms server time; 50 idle live pages ~0 % CPU; first response after socket activation
<= 1 s; fleet-web RSS <= 80 MB.

- latency: a real `fleet web`, Debian's Chromium (Playwright) on the task's page, and an agent
  run by hand (the command coder printing each line written into its FIFO); the browser
  stamps each line with the wall clock when it enters the page (a MutationObserver), the
  benchmark when it wrote it: the difference is fleet-run, the event log, inotify, the
  server and the browser together;
- render: the application in-process (Starlette's test client), each page 20 times, with
  10,000 tasks in the store, 4 of them running: what the server spends, no network;
- idle: 50 live streams (overview, questions and task pages, as EventSource opens them) held
  open on a real `fleet web` for 10 s while nothing changes: its CPU time from /proc over that
  time, and its resident set size after.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from time import perf_counter

from tests.bench.common import Options, fleet_env, fleet_exe, note, report, scratch_dir

NAME = "web"
UNITS_NAME = "web-units"
LINES = 20
TASKS = 10_000
PAGES = ("/", "/tasks", "/tasks?q=job+42", "/questions", "/analytics", "/config")
STREAMS = 50
IDLE_S = 10.0
OBSERVER = """() => {
  window.seen = {};
  new MutationObserver((records) => {
    for (const r of records) for (const n of r.addedNodes) {
      if (n.querySelector) { const m = n.querySelector('.msg');
        if (m) window.seen[m.textContent] = performance.timeOrigin + performance.now(); }
    }
  }).observe(document.getElementById('transcript'), {childList: true});
}"""


def _env(home: Path) -> dict[str, str]:
    env = fleet_env(home)
    env["PATH"] = os.path.dirname(fleet_exe()) + os.pathsep + env.get("PATH", "")
    return env


def _fleet(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [fleet_exe(), *args], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], int, str]:
    port = _free_port()
    _fleet(env, "config", "set", f"web_listen=127.0.0.1:{port}", "default_coder=command")
    with log.open("wb") as sink:
        proc = subprocess.Popen([fleet_exe(), "web"], env=env, stdout=sink, stderr=sink)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port, _fleet(env, "web", "url").strip()
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError(f"fleet web did not start: {log.read_text()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def latency(opts: Options) -> None:
    from tests.webrig import Talker, browser, logged_in

    with scratch_dir("web-latency") as tmp:
        env = _env(tmp / "home")
        project = tmp / "project"
        project.mkdir()
        talker = Talker(project)
        task_id = _fleet(env, "add", "talk", "--coder", "command", "--cwd", str(project),
                         "-d", talker.command).strip()  # fmt: skip
        server, port, login = _serve(env, tmp / "web.log")
        run = subprocess.Popen(
            [os.path.join(os.path.dirname(fleet_exe()), "fleet-run"), task_id],
            env=env, cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            with browser() as chromium:
                page = logged_in(chromium, login)
                talker.say("warm-up")
                page.goto(f"http://127.0.0.1:{port}/tasks/{task_id}")
                page.locator("#transcript .msg", has_text="warm-up").wait_for(timeout=30_000)
                page.evaluate(OBSERVER)
                written = {}
                for n in range(opts.runs(LINES)):
                    text = f"line {n} of the agent"
                    written[text] = time.time() * 1000
                    talker.say(text)
                    page.wait_for_function(f"() => window.seen[{json.dumps(text)}]", timeout=30_000)
                    time.sleep(0.05)  # one line at a time: each is measured on its own
                seen = page.evaluate("() => window.seen")
        finally:
            talker.close()
            run.wait(timeout=30)
            _stop(server)
        samples = [seen[t] - at for t, at in written.items()]
        report("agent prints a line -> visible in the browser", samples, "ms", 300.0)


def render(opts: Options) -> None:
    from starlette.testclient import TestClient

    from fleet.model import TaskSpec
    from fleet.paths import resolve
    from fleet.store import open_store
    from fleet.web import access
    from fleet.web.app import create

    n = opts.size(TASKS)
    with scratch_dir("web-render") as tmp:
        paths = resolve(env={"FLEET_HOME": str(tmp / "home")})
        store = open_store(paths)
        started = perf_counter()
        specs = [TaskSpec(f"job {i}", str(tmp), coder="command") for i in range(n)]
        for i in range(0, n, 1000):
            store.add(specs[i : i + 1000])
        running = [t for t in store.claim(4, "bench", 3600, "command", None)]
        store.close()
        note(f"{n} tasks, {len(running)} running, added in {perf_counter() - started:.1f} s")
        token = access.load_token(paths)
        keys = access.Keys(token)
        app = create(paths, keys, access.allowed_hosts("127.0.0.1", 8768, []))
        with TestClient(app, base_url="http://127.0.0.1:8768") as client:
            client.get(f"/login?token={token}")
            for path in (*PAGES, f"/tasks/{running[0].id}"):
                client.get(path)  # warm: templates compiled
                samples = []
                for _ in range(opts.runs(20)):
                    start = perf_counter()
                    response = client.get(path)
                    samples.append((perf_counter() - start) * 1000)
                    assert response.status_code == 200, (path, response.status_code)
                label = path if not path.startswith("/tasks/fl-") else "/tasks/ID"
                report(f"page {label}, {n} tasks, server time", samples, "ms", 200.0)


def _stream(port: int, cookie: str, path: str) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers={"Cookie": cookie, "Accept": "text/event-stream"})
    response = conn.getresponse()
    assert response.status == 200, (path, response.status)
    response.read1(64)  # the retry: line: the stream is open
    return conn


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    return _rss_of(Path(f"/proc/{pid}/status").read_text())


def _rss_of(status: str) -> float:
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def idle(opts: Options) -> None:
    from fleet.web.access import COOKIE, Keys

    with scratch_dir("web-idle") as tmp:
        env = _env(tmp / "home")
        ids = [_fleet(env, "add", f"task {i}", "--cwd", str(tmp), "-d", "true").strip()
               for i in range(3)]  # fmt: skip
        server, port, login = _serve(env, tmp / "web.log")
        try:
            token = login.split("token=")[1]
            cookie = f"{COOKIE}={Keys(token).session}"
            paths = ["/events/overview", "/events/questions", "/events/nav"]
            paths += [f"/tasks/{t}/panel/events" for t in ids]
            conns = [_stream(port, cookie, paths[i % len(paths)]) for i in range(STREAMS)]
            time.sleep(1.0)  # let the opening settle
            seconds = opts.runs(3) if opts.quick else IDLE_S
            before, start = _cpu_s(server.pid), perf_counter()
            time.sleep(seconds)
            used, wall = _cpu_s(server.pid) - before, perf_counter() - start
            pct = 100 * used / wall
            report(
                f"{STREAMS} live pages open, idle for {seconds:g} s: fleet web CPU", [pct], "%", 1.0
            )
            report(
                f"fleet web RSS with {STREAMS} live pages open", [_rss_mb(server.pid)], "MB", 80.0
            )
            for conn in conns:
                conn.close()
        finally:
            _stop(server)


def main(opts: Options) -> None:
    render(opts)
    idle(opts)
    latency(opts)


def main_units(opts: Options) -> None:
    """First response after socket activation, under a sandboxed systemd."""
    from tests.sandbox import Sandbox

    with scratch_dir("web-units") as tmp:
        with Sandbox.boot(tmp / "box") as box:
            home = tmp / "home"
            port = _free_port()
            bindir = os.path.dirname(fleet_exe())

            def fleet(*args: str) -> str:
                return box.run(f"{bindir}/fleet", *args, env={"FLEET_HOME": str(home)}).stdout

            fleet("config", "set", f"web_listen=127.0.0.1:{port}", "notify_desktop=false")
            fleet("setup", "--system", "--web")
            login = fleet("web", "url").strip()
            samples, rss = [], []
            for _ in range(opts.runs(10)):
                box.systemctl("stop", "fleet-web.service")
                # systemd allows 5 starts in 10 s (StartLimitBurst=): one start each 2 s.
                time.sleep(2.1)
                start = perf_counter()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("GET", login.split(str(port), 1)[1])
                response = conn.getresponse()
                samples.append((perf_counter() - start) * 1000)
                assert response.status == 303, response.status
                conn.close()
                pid = box.systemctl("show", "-p", "MainPID", "--value", "fleet-web.service")
                status = box.run(
                    "cat", f"/proc/{pid.stdout.strip()}/status"
                ).stdout  # its PID there
                rss.append(_rss_of(status))
            box.systemctl("stop", "fleet-web.service", "fleet-web.socket", "fleet-claim.path",
                          "fleet-claim.timer")  # fmt: skip
        report("first response after socket activation (the service starts)", samples, "ms", 1000.0)
        report("fleet-web.service RSS after its first response", rss, "MB", 80.0)
