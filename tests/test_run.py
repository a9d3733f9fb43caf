"""fleet-run by hand (foreground) and fleet-reap's policy, with real child processes.

Outside systemd the runner prints events as JSON lines and settles the outcome itself, so the
whole attempt cycle runs here without a service manager; the systemd tests cover the units.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Fleet, fleet_exe
from tests.conftest import events_of as events
from tests.conftest import fleet_run as run
from tests.conftest import show_task as task
from tests.sandbox import wait_for

DEADLINE = 60.0


def stream(path: Path, *items: object) -> str:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path.name


def test_replayed_agent_closes_its_task(fleet: Fleet, project: Path) -> None:
    name = stream(
        project / "s.jsonl",
        {"event": "session", "session": "sess-1"},
        {"event": "text", "text": "looking"},
        {"event": "tool_call", "tool": "Bash", "text": "ls"},
        {"event": "usage", "tokens_in": 1200, "tokens_out": 30},
        {"run": ["fleet", "close", "$FLEET_TASK_ID", "--reason", "fixed"]},
        {"event": "result", "text": "done", "cost": 0.25},
    )
    tid = fleet.add("t", "--coder", "replay", "-d", name)
    result = run(tid, project)
    assert result.returncode == 0, result.stderr
    seen = [(e["event"], e["text"]) for e in events(result.stdout)]
    # `fleet close` prints the id on the agent's stdout: not an event, so kept as a raw line.
    assert [k for k, _ in seen] == ["session", "text", "tool_call", "usage", "raw", "result"]
    assert seen[4] == ("raw", tid)
    shown = task(fleet, tid)
    assert shown["status"] == "done" and shown["reason"] == "fixed"
    (attempt,) = shown["attempt_log"]
    assert attempt["outcome"] == "success" and attempt["session_id"] == "sess-1"
    assert (attempt["tokens_in"], attempt["tokens_out"], attempt["cost"]) == (1200, 30, 0.25)
    (listed,) = json.loads(fleet.ok("ls", "--all", "--json"))
    assert (listed["tokens_in"], listed["tokens_out"], listed["cost"]) == (1200, 30, 0.25)
    assert "1.2k/0.0k" in fleet.ok("ls", "--all") and "$0.2500" in fleet.ok("show", tid)
    assert (Path(os.environ["FLEET_HOME"]) / "tasks" / tid / "prompt.md").exists()


def test_command_coder_sees_the_task_environment(fleet: Fleet, project: Path) -> None:
    script = (
        'echo "id=$FLEET_TASK_ID notify=${NOTIFY_SOCKET:-none}"; '
        'echo "dir=$FLEET_TASK_DIR art=$FLEET_ARTIFACT_DIR"; echo "pwd=$(pwd)"; '
        'echo "pgid=$(ps -o pgid= $$ | tr -d " ") pid=$$"'
    )
    tid = fleet.add("env", "--coder", "command", "-d", script)
    result = run(tid, project, NOTIFY_SOCKET="/run/nowhere")
    assert result.returncode == 0, result.stderr
    lines = [str(e["text"]) for e in events(result.stdout)]
    home = Path(os.environ["FLEET_HOME"])
    assert lines[0] == f"id={tid} notify=none"
    assert lines[1] == f"dir={home / 'tasks' / tid} art={home / 'tasks' / tid / 'artifacts'}"
    assert lines[2] == f"pwd={project}"
    pgid, pid = (int(x.split("=")[1]) for x in lines[3].split())
    assert pgid == pid  # the agent leads its own process group
    assert task(fleet, tid)["status"] == "done"


def test_failures_retry_then_block(fleet: Fleet, project: Path) -> None:
    fleet.ok("config", "set", "retry_limit=2")
    tid = fleet.add("fails", "--coder", "command", "-d", "echo boom >&2; exit 3")
    first = run(tid, project)
    assert first.returncode == 1
    shown = task(fleet, tid)
    assert (shown["status"], shown["failures"]) == ("ready", 1)
    assert shown["reason"] == "failure: exit status 3"
    run(tid, project)
    shown = task(fleet, tid)
    assert shown["status"] == "blocked" and "after 2 failed attempts" in str(shown["reason"])
    assert [a["exit_status"] for a in shown["attempt_log"]] == [3, 3]
    fleet.ok("retry", tid)
    assert task(fleet, tid)["failures"] == 0


def test_success_without_close_requeues_then_blocks(fleet: Fleet, project: Path) -> None:
    fleet.ok("config", "set", "noclose_limit=2")
    name = stream(project / "s.jsonl", {"event": "result", "text": "all good"})
    tid = fleet.add("forgets", "--coder", "replay", "-d", name)
    run(tid, project)
    assert (task(fleet, tid)["status"], task(fleet, tid)["noclose"]) == ("ready", 1)
    run(tid, project)
    shown = task(fleet, tid)
    assert shown["status"] == "blocked" and "without closing" in str(shown["reason"])


def test_a_result_error_is_a_failure_even_with_exit_0(fleet: Fleet, project: Path) -> None:
    name = stream(project / "s.jsonl", {"event": "result", "text": "api 500", "is_error": True})
    tid = fleet.add("t", "--coder", "replay", "-d", name)
    assert run(tid, project).returncode == 1
    assert task(fleet, tid)["failures"] == 1


def start(tid: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [fleet_exe("fleet-run"), tid],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_event(proc: subprocess.Popen[str]) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the agent has really started
    assert line, proc.stderr.read() if proc.stderr else ""
    obj = json.loads(line)
    assert isinstance(obj, dict)
    return obj


def test_kill_file_stops_the_agent(fleet: Fleet, project: Path, home: Path) -> None:
    name = stream(project / "s.jsonl", {"event": "text", "text": "working"}, {"sleep": 600})
    tid = fleet.add("long", "--coder", "replay", "-d", name)
    proc = start(tid, project)
    assert first_event(proc)["text"] == "working"
    (home / "tasks" / tid / ".kill").touch()
    assert proc.wait(timeout=DEADLINE) == 3
    shown = task(fleet, tid)
    assert shown["status"] == "blocked" and "stopped by a person" in str(shown["reason"])
    assert shown["attempt_log"][0]["outcome"] == "killed"


@pytest.mark.parametrize("ignores_term", [False, True])
def test_sigterm_is_forwarded_and_a_stubborn_agent_is_killed(
    fleet: Fleet, project: Path, ignores_term: bool
) -> None:
    fleet.ok("config", "set", "stop_grace_seconds=1")
    items: list[object] = [{"event": "text", "text": "up"}, {"sleep": 600}]
    if ignores_term:
        items.insert(0, {"ignore": "TERM"})
    tid = fleet.add("stubborn", "--coder", "replay", "-d", stream(project / "s.jsonl", *items))
    proc = start(tid, project)
    first_event(proc)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=DEADLINE) == 3
    elapsed = time.monotonic() - started
    shown = task(fleet, tid)
    assert shown["attempt_log"][0]["outcome"] == "killed"
    if ignores_term:
        assert elapsed >= 1.0  # it had its grace period, then SIGKILL
    assert "signal SIGTERM" in str(shown["reason"])


def test_garbage_and_gigantic_lines_are_survived(fleet: Fleet, project: Path) -> None:
    script = project / "noisy.py"
    script.write_text(
        "import sys\n"
        "out = sys.stdout.buffer\n"
        "out.write(b'\\xff\\xfe\\x00 not utf8\\n')\n"
        "out.write(b'x' * (20 << 20) + b'\\n')\n"
        "out.write(b'after the big one\\n')\n"
        "out.write(b'no newline at the end')\n"
    )
    tid = fleet.add("noisy", "--coder", "command", "-d", f"python3 {script}")
    result = run(tid, project)
    assert result.returncode == 0, result.stderr[-2000:]
    texts = [str(e["text"]) for e in events(result.stdout)]
    assert texts[0].endswith("not utf8") and "\ufffd" in texts[0]
    assert len(texts[1]) < (9 << 20) and texts[1].endswith("[cut at 8388608 bytes]")
    assert texts[2:] == ["after the big one", "no newline at the end"]


def test_secrets_are_redacted(fleet: Fleet, project: Path) -> None:
    tid = fleet.add(
        "leaky",
        "--coder",
        "command",
        "-d",
        'echo "key=$MY_API_TOKEN"; echo "Authorization: Bearer abcdefghijkl123"',
    )
    result = run(tid, project, MY_API_TOKEN="s3cr3t-value-42")
    texts = [str(e["text"]) for e in events(result.stdout)]
    assert texts == ["key=[REDACTED]", "Authorization: Bearer [REDACTED]"]


def test_unclaimable_task_changes_nothing(fleet: Fleet, project: Path) -> None:
    dep = fleet.add("dep")
    tid = fleet.add("waits", "--coder", "command", "-d", "true", "--after", dep)
    before = task(fleet, tid)
    result = run(tid, project)
    assert result.returncode == 4 and "not claimable: it waits on others" in result.stderr
    assert task(fleet, tid) == before
    bad = run("fl-../x", project)
    assert bad.returncode == 2 and "not a task id" in bad.stderr


def test_a_task_whose_directory_is_gone_is_not_claimed_here(fleet: Fleet, project: Path) -> None:
    """A host never claims a task whose directory it lacks (issue 14): no attempt, no failure
    counted, and `fleet show` names this host as lacking it."""
    tid = fleet.add("t", "--coder", "command", "-d", "true", "--cwd", str(project))
    gone = project / "gone"
    gone.mkdir()
    fleet.ok("edit", tid, "--cwd", str(gone))
    gone.rmdir()
    result = run(tid, project)
    assert result.returncode == 4 and "does not exist on this host" in result.stderr
    shown = task(fleet, tid)
    assert shown["status"] == "ready" and shown["failures"] == 0 and shown["attempts"] == 0
    (lacking,) = fleet.show(tid)["cwd_missing_on"]
    assert lacking["host"] == os.uname().nodename


@pytest.mark.parametrize("where", ["not-on-path", "not-executable"])
def test_a_coder_program_that_cannot_start_blocks_at_once(
    fleet: Fleet, project: Path, tmp_path: Path, where: str
) -> None:
    """Issue 11, item 10: a coder's program that cannot be started fails every retry alike;
    the task is blocked after the first, with what to do, instead of three failures."""
    if where == "not-on-path":
        binary, says = "fleet-test-no-such-claude", "No such file or directory"
        hint = "is not on the PATH the runner gives it"
    else:
        script = tmp_path / "claude"
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o644)
        binary, says, hint = str(script), "Permission denied", "install it there"
    fleet.ok("config", "set", f"coders.claude.binary={binary}")
    tid = fleet.add("t", "--coder", "claude")
    result = run(tid, project)
    assert result.returncode == 5, result.stderr
    shown = task(fleet, tid)
    assert shown["status"] == "blocked" and shown["failures"] == 0
    reason = str(shown["reason"])
    assert reason.startswith(f"unstartable: cannot start {binary}: {says};"), reason
    assert hint in reason and "coders.claude.binary" in reason
    assert [a["outcome"] for a in shown["attempt_log"]] == ["unstartable"]


def test_configured_secrets_and_coder_env_secrets_are_redacted(fleet: Fleet, project: Path) -> None:
    fleet.ok(
        "config",
        "set",
        'secret_variables=["PLAIN_NAME"]',
        'coders.command.env={SERVICE_TOKEN = "tok-from-config-123"}',
    )
    tid = fleet.add("leaky", "--coder", "command", "-d", 'echo "$PLAIN_NAME $SERVICE_TOKEN"')
    result = run(tid, project, PLAIN_NAME="plain-but-secret")
    assert [e["text"] for e in events(result.stdout)] == ["[REDACTED] [REDACTED]"]


def test_context_pressure_stops_and_requeues_with_a_note(
    fleet: Fleet, project: Path, home: Path
) -> None:
    fleet.ok("config", "set", "context_pressure_pct=80", 'context_limits={"tiny" = 1000}')
    name = stream(
        project / "s.jsonl",
        {"event": "usage", "tokens_in": 500, "context": 500},
        {"event": "usage", "tokens_in": 900, "context": 850},
        {"sleep": 600},
    )
    tid = fleet.add("big", "--coder", "replay", "--model", "tiny-model", "-d", name)
    result = run(tid, project)
    assert result.returncode == 7, result.stderr
    shown = task(fleet, tid)
    assert (shown["status"], shown["failures"], shown["noclose"]) == ("ready", 0, 0)
    assert shown["attempt_log"][0]["outcome"] == "context-pressure"
    stream(project / "s.jsonl", {"run": ["fleet", "close", "$FLEET_TASK_ID"]})
    assert run(tid, project).returncode == 0
    prompt = (home / "tasks" / tid / "prompt.md").read_text()
    assert "previous attempt filled its context window" in prompt
    assert "PLAN_AND_STATUS.md" in prompt


def test_rate_limit_holds_back_that_coder_only(fleet: Fleet, project: Path) -> None:
    from fleet.paths import resolve
    from fleet.store import open_store
    from fleet.timeutil import parse

    reset = time.time() + 3600
    name = stream(
        project / "s.jsonl",
        {
            "event": "rate_limit",
            "rate_status": "rejected",
            "resets_at": reset,
            "limit_type": "five_hour",
            "utilization": 1.0,
        },
        {"event": "result", "text": "You've hit your limit", "is_error": True},
        {"exit": 1},
    )
    tid = fleet.add("limited", "--coder", "replay", "-d", name)
    other = fleet.add("other coder", "--coder", "command", "-d", "true")
    waiting = fleet.add("same coder", "--coder", "replay", "-d", name)
    assert run(tid, project).returncode == 6
    shown = task(fleet, tid)
    assert (shown["status"], shown["failures"]) == ("ready", 0)
    assert shown["attempt_log"][0]["outcome"] == "rate-limited"
    store = open_store(resolve())
    try:
        until, why = store.gates()["coder:replay"]
        assert until is not None and abs(parse(until) - reset) < 0.01
        assert "five_hour" in str(why)
        (gauge,) = store.gauges()
        assert (gauge["coder"], gauge["window"], gauge["status"]) == (
            "replay",
            "five_hour",
            "rejected",
        )
        claimed = [t.id for t in store.claim(10, "test", 60, "claude", None)]
    finally:
        store.close()
    assert claimed == [other]  # the rate-limited coder's tasks wait; others run
    assert waiting not in claimed


def test_a_coder_declared_in_configuration(fleet: Fleet, project: Path, tmp_path: Path) -> None:
    tool = tmp_path / "mytool"
    tool.write_text(
        "#!/bin/sh\n"
        'printf \'{"event": "text", "text": "got %s chars"}\\n\' "${#1}"\n'
        'fleet close "$FLEET_TASK_ID" >/dev/null\n'
    )
    tool.chmod(0o755)
    fleet.ok("config", "set", f"coders.mytool.binary={tool}", "coders.mytool.format=fleet")
    tid = fleet.add("mine", "--coder", "mytool")
    result = run(tid, project)
    assert result.returncode == 0, result.stderr
    (event,) = events(result.stdout)
    assert str(event["text"]).startswith("got ") and task(fleet, tid)["status"] == "done"


def test_a_coder_class_from_an_entry_point(fleet: Fleet, project: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "echocoder-1.0.dist-info").mkdir(parents=True)
    (site / "echocoder-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: echocoder\nVersion: 1.0\n"
    )
    (site / "echocoder-1.0.dist-info" / "entry_points.txt").write_text(
        "[fleet.coders]\necho = echocoder:EchoCoder\n"
    )
    (site / "echocoder.py").write_text(
        "from fleet.coders.command import CommandCoder\n"
        "class EchoCoder(CommandCoder):\n"
        "    name = 'echo'\n"
        "    def argv(self, run):\n"
        "        return ['/bin/echo', 'plugin says', run.title]\n"
    )
    fleet.ok("config", "set", "coders.echo.args=[]")  # makes the name known to `fleet add`
    tid = fleet.add("hi", "--coder", "echo")
    result = run(tid, project, PYTHONPATH=str(site))
    assert result.returncode == 0, result.stderr
    assert [e["text"] for e in events(result.stdout)] == ["plugin says hi"]


def test_prompt_template_from_the_configuration_directory(
    fleet: Fleet, project: Path, home: Path
) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "prompt.md").write_text("Do $title in $cwd as $task_id.\n")
    tid = fleet.add("the thing", "--coder", "command", "-d", "true")
    run(tid, project)
    assert (
        home / "tasks" / tid / "prompt.md"
    ).read_text() == f"Do the thing in {project} as {tid}.\n"


def test_twenty_concurrent_runners_of_one_task_start_it_once(
    fleet: Fleet, project: Path, tmp_path: Path
) -> None:
    """Issue 11: one of twenty `fleet-run ID` at once runs the task; the others say that it is
    running already (not "under systemd", where none is), in one line and a hint."""
    go = tmp_path / "go"
    wait = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    name = stream(
        project / "s.jsonl",
        {"event": "text", "text": "working"},
        {"run": [sys.executable, "-c", wait]},
        {"run": ["fleet", "close", "$FLEET_TASK_ID", "--reason", "once"]},
    )
    tid = fleet.add("contended", "--coder", "replay", "-d", name)
    runners = [
        subprocess.Popen(
            [fleet_exe("fleet-run"), tid],
            cwd=project,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(20)
    ]
    try:
        wait_for(
            lambda: sum(r.poll() is not None for r in runners) >= 19, 120, "19 runners to refuse"
        )
        go.touch()
        for r in runners:
            r.wait(timeout=DEADLINE)
    finally:
        go.touch()
        for r in runners:
            if r.poll() is None:
                r.kill()
                r.wait()
    ended = [(r.returncode, r.stderr.read() if r.stderr else "") for r in runners]
    assert sorted(code for code, _ in ended) == [0] + [4] * 19, ended
    refusal = [
        f"fleet-run: error: {tid} is already running on this host",
        f"fleet-run: hint: follow it with `fleet logs -f {tid}`",
    ]
    assert [err.splitlines() for code, err in ended if code == 4] == [refusal] * 19
    shown = task(fleet, tid)
    assert shown["status"] == "done" and shown["reason"] == "once"
    assert [a["outcome"] for a in shown["attempt_log"]] == ["success"]


def test_a_reader_that_goes_away_ends_only_the_echo(
    fleet: Fleet, project: Path, home: Path, tmp_path: Path
) -> None:
    """Issue 11, item 9: `fleet-run ID | head -1`. Once head has gone, the runner's next line
    meets a broken pipe: the echo ends there, the agent goes on and the attempt ends well."""
    go = tmp_path / "go"
    wait = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
    name = stream(
        project / "s.jsonl",
        {"event": "text", "text": "first"},
        {"run": [sys.executable, "-c", wait]},
        *({"event": "text", "text": f"after the reader left, {n}"} for n in range(50)),
        {"run": ["fleet", "close", "$FLEET_TASK_ID", "--reason", "finished"]},
        {"event": "result", "text": "done"},
    )
    tid = fleet.add("piped", "--coder", "replay", "-d", name)
    with (tmp_path / "err").open("w") as err:
        runner = subprocess.Popen(
            [fleet_exe("fleet-run"), tid], cwd=project, stdout=subprocess.PIPE, stderr=err
        )
    assert runner.stdout is not None
    head = subprocess.run(
        ["head", "-1"], stdin=runner.stdout, capture_output=True, text=True, timeout=DEADLINE
    )
    runner.stdout.close()  # the pipe's only reader is gone with head
    go.touch()
    try:
        code = runner.wait(timeout=DEADLINE)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert json.loads(head.stdout)["text"] == "first"
    errors = (tmp_path / "err").read_text()
    assert code == 0 and "Traceback" not in errors, errors
    assert f"fleet-run: {tid}: success → done (finished)" in errors
    shown = task(fleet, tid)
    assert shown["status"] == "done" and shown["reason"] == "finished"
    assert [a["outcome"] for a in shown["attempt_log"]] == ["success"]
    logged = fleet.ok("logs", tid)
    assert "after the reader left, 49" in logged and "result (ok): done" in logged


@pytest.mark.parametrize("ends", [False, True], ids=["while-it-works", "at-the-outcome"])
def test_a_runner_that_fails_stops_its_agents_whole_tree(
    project: Path, tmp_path: Path, ends: bool
) -> None:
    """Issue 11, item 9: the disk under FLEET_HOME (a small tmpfs) fills up, the agent's own
    doing here: it writes a filler file there. Then either the agent works on, and the
    runner's next write to the store fails, or the agent ends, and writing the outcome fails.
    Before the error ends the runner, nothing of the agent is left: neither the agent nor a
    tool in its process group (its output closed) nor one in a session of its own."""
    from tests.test_hostile_input import full_disk

    tools = [f"sleep {610_000 + os.getpid() % 10_000 + n}" for n in range(3)]
    fill = (
        "import os\n"
        "with open(os.path.join(os.environ['FLEET_HOME'], '..', 'filler'), 'wb') as f:\n"
        "    try:\n"
        "        while True: f.write(b'\\0' * 65536); f.flush()\n"
        "    except OSError: pass\n"
    )
    script = (
        f"setsid {tools[0]} </dev/null >/dev/null 2>&1 & {tools[1]} >/dev/null & "
        f'{sys.executable} -c "$0"; '
        'echo \'{"event": "session", "session": "s-after-the-disk-filled"}\'; '
        + ("exit 0" if ends else f"exec {tools[2]}")
    )
    name = stream(project / "s.jsonl", {"run": ["sh", "-c", script, fill]})

    def left() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            try:
                line = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if entry.isdigit() and any(t.encode() + b" " == line for t in tools):
                found.append(int(entry))
        return found

    with full_disk(tmp_path / "disk") as holder:
        enter = ["nsenter", "-t", str(holder), "-m", f"--wd={project}", "--"]
        env = {**os.environ, "FLEET_HOME": str(tmp_path / "disk" / "home")}

        def fleet_in(*argv: str, timeout: float = DEADLINE) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*enter, *argv],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )

        added = fleet_in(fleet_exe(), "add", "fills the disk", "--coder", "replay", "-d", name)
        assert added.returncode == 0, added.stderr
        try:
            ran = fleet_in(fleet_exe("fleet-run"), added.stdout.strip(), timeout=120)
            survivors = left()
        finally:
            for pid in left():
                os.kill(pid, signal.SIGKILL)
    lines = ran.stderr.splitlines()
    assert ran.returncode not in (0, 3) and "Traceback" not in ran.stderr, ran.stderr
    assert any(line.startswith("fleet-run: error: the disk holding") for line in lines), lines
    assert survivors == []


@pytest.mark.postgresql_only
def test_a_runner_holds_no_connection_between_renewals_and_renews_through_a_new_one(
    backend: str, fleet: Fleet, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    from fleet.paths import resolve
    from fleet.store import open_store
    from tests.conftest import run_in_background
    from tests.sandbox import wait_for

    monkeypatch.setenv("FLEET_LEASE_SECONDS", "10")  # renewed every 3.3 s
    started, go = tmp_path / "started", tmp_path / "go"
    script = (
        f'touch {started}; while [ ! -e {go} ]; do sleep 0.1; done; fleet close "$FLEET_TASK_ID"'
    )
    tid = fleet.add("waits", "--coder", "command", "-d", script)
    store = open_store(resolve())

    def lease() -> str:
        return store.get(tid).lease_until or ""

    def runners() -> int:
        with psycopg.connect(os.environ["FLEET_STORE"], autocommit=True) as admin:
            row = admin.execute(
                b"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fleet-run'"
            ).fetchone()
        return int(row[0]) if row else -1

    out = tmp_path / "run.out"
    with run_in_background(tid, project, out) as runner:
        try:
            wait_for(started.exists, DEADLINE, "the agent")  # the runner is in its loop
            errors = out.with_suffix(".err")
            wait_for(lambda: runners() == 0, DEADLINE, "the runner to let its connection go")
            before = lease()
            try:
                wait_for(lambda: lease() > before, DEADLINE, "a renewal")
            except TimeoutError as e:
                raise AssertionError(
                    f"{e}; fleet-run: {runner.poll()} {errors.read_text()}"
                ) from None
            wait_for(lambda: runners() == 0, DEADLINE, "the connection let go after it")
            assert runner.poll() is None
            go.touch()
            assert runner.wait(timeout=DEADLINE) == 0, errors.read_text()
        finally:
            go.touch()  # the agent ends even if the runner did not survive
    store.close()
    shown = task(fleet, tid)
    assert shown["status"] == "done"
    assert [a["outcome"] for a in shown["attempt_log"]] == ["success"]
