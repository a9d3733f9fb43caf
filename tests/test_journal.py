"""Transcripts in a real journald: fleet installed with `fleet setup --system` in a sandbox.

Every task here runs as fleet-task@ID under the sandbox's systemd, started by fleet-claim.path
when `fleet add` drops its wake file, exactly as on a server. The checks read the journal
the way a person would: `journalctl -u fleet-task@ID`, `fleet logs`, `fleet logs -f`. Two
checks read the datagrams themselves, from a socket of their own in journald's place: every
field of an entry exactly as sent, and a journal socket replaced under a running sender.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fleet.coders.base import CoderSettings
from fleet.coders.claude import ClaudeCoder
from fleet.events import MAX_MESSAGE, MSG_ENDED, MSG_REFUSED, MSG_STARTED, Context, Sink
from fleet.journal import Journal
from fleet.redact import MASK, Redactor
from tests import sandbox
from tests.conftest import fleet_exe
from tests.sandbox import PATH, Sandbox

systemd = sandbox.systemd

FLEET = fleet_exe()
DEADLINE = 60.0


def replay(path: Path, *items: object) -> str:
    """Writes a replay stream and returns its name, relative to the task's directory."""
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path.name


CLOSE = {"run": ["fleet", "close", "$FLEET_TASK_ID"]}


def text(value: Any) -> str:
    """A journal field as text (`-o json` gives fields that are not UTF-8 as byte lists)."""
    if isinstance(value, list):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


@dataclass
class Fleet:
    """fleet installed in system scope inside one sandbox, with its own FLEET_HOME."""

    box: Sandbox
    home: Path
    base: Path

    @property
    def env(self) -> dict[str, str]:
        return {"FLEET_HOME": str(self.home)}

    def __call__(
        self, *args: str, check: bool = True, timeout: float = DEADLINE
    ) -> subprocess.CompletedProcess[str]:
        return self.box.run(FLEET, *args, env=self.env, check=check, timeout=timeout)

    def project(self, name: str) -> Path:
        path = self.base / name
        path.mkdir()
        return path

    def add(self, cwd: Path, description: str, *options: str) -> str:
        return self("add", "t", "--cwd", str(cwd), "-d", description, *options).stdout.strip()

    def finish(self, task_id: str, attempts: int = 1, timeout: float = DEADLINE) -> None:
        """Waits until the task is done and the journal holds the end of every attempt.

        Not `fleet wait`, which is not what these tests are about and can sleep through the
        end of a task until its timeout: it wakes on writes to fleet.db-wal, and the last one
        comes just before the commit becomes visible to readers.
        """
        # fleet-run sends "attempt N ended" last; journald may still be reading its socket.
        self.box.wait_for(
            lambda: len(self.entries(task_id, f"MESSAGE_ID={MSG_ENDED}")) >= attempts,
            timeout,
            f"the end of {attempts} attempt(s) of {task_id} in the journal",
        )
        self.box.wait_for(lambda: self.settled(task_id), 30, f"fleet-reap to settle {task_id}")
        shown = self.show(task_id)
        assert (shown["status"], shown["attempts"]) == ("done", attempts), shown
        ended = self.entries(task_id, f"MESSAGE_ID={MSG_ENDED}")
        assert len(ended) == attempts

    def show(self, task_id: str) -> dict[str, Any]:
        shown = json.loads(self("show", task_id, "--json").stdout)
        assert isinstance(shown, dict)
        return shown

    def settled(self, task_id: str) -> bool:
        shown = self.show(task_id)
        return shown["claimed_by"] is None and shown["status"] != "ready"

    def entries(self, task_id: str, *matches: str) -> list[dict[str, Any]]:
        return self.box.journal(f"FLEET_TASK_ID={task_id}", *matches)

    def unit_lines(self, task_id: str) -> list[str]:
        """`journalctl -u fleet-task@ID -o cat`, as a person reads it."""
        out = self.box.run(
            "journalctl", "--no-pager", "-o", "cat", "-u", f"fleet-task@{task_id}.service"
        )
        return out.stdout.splitlines()


@pytest.fixture(scope="module")
def fleet(systemd: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    base = tmp_path_factory.mktemp("journal")
    installed = Fleet(systemd, base / "home", base)
    installed("config", "set", "default_coder=replay")
    installed("setup", "--system")
    return installed


def from_systemd(line: str, task_id: str) -> bool:
    """A line that PID 1 writes about the unit (its timing relative to events varies)."""
    unit = f"fleet-task@{task_id}.service"
    return line.startswith((f"Starting {unit}", f"Started {unit}", f"{unit}: "))


def test_unit_journal_reads_as_a_transcript(fleet: Fleet) -> None:
    project = fleet.project("transcript")
    name = replay(
        project / "session.jsonl",
        {"event": "session", "session": "sess-1"},
        {"event": "text", "text": "looking around"},
        {"event": "tool_call", "tool": "Bash", "text": "ls"},
        {"event": "tool_result", "text": "README.md"},
        {"event": "usage", "tokens_in": 1200, "tokens_out": 30},
        {"run": ["fleet", "close", "$FLEET_TASK_ID", "--reason", "fixed"]},
        {"event": "result", "text": "all done", "cost": 0.25},
    )
    task_id = fleet.add(project, name)
    fleet.finish(task_id)
    reaped = f"{task_id}: success → done (fixed)"
    fleet.box.wait_for(lambda: reaped in fleet.unit_lines(task_id), 30, "fleet-reap's line")
    lines = [line for line in fleet.unit_lines(task_id) if not from_systemd(line, task_id)]
    assert re.fullmatch(rf"attempt 1 started: replay in {project} \(pid \d+\)", lines[0]), lines
    assert lines[1:] == [
        "session sess-1",
        "looking around",
        "→ Bash: ls",
        "← README.md",
        "tokens in 1200 out 30",
        f"{task_id} closed by agent",  # the audit trail's entry of `fleet close` …
        task_id,  # … and what it printed: not an event, so a raw line
        "result (ok): all done",
        "attempt 1 ended: success",
        f"{task_id} ended by fleet-reap: attempt 1 success, now done",
        reaped,
    ]
    tool = fleet.entries(task_id, "FLEET_EVENT=tool_call")
    assert [(e["FLEET_TOOL"], e["FLEET_SEQ"], e["FLEET_ATTEMPT"]) for e in tool] == [
        ("Bash", "3", "1")
    ]
    [usage] = fleet.entries(task_id, "FLEET_EVENT=usage")
    assert (usage["FLEET_TOKENS_IN"], usage["FLEET_TOKENS_OUT"]) == ("1200", "30")
    assert usage["_SYSTEMD_UNIT"] == f"fleet-task@{task_id}.service"


def explained(box: Sandbox, *matches: str) -> dict[str, list[str]]:
    """`journalctl -x`: each entry's MESSAGE -> the catalog text shown below it (`░░ ` cut)."""
    out = box.run("journalctl", "-x", "--no-pager", "-o", "short", *matches).stdout
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if line.startswith("░░"):
            current.append(line.removeprefix("░░").strip())
        else:
            current = found.setdefault(line.split(": ", 1)[-1], [])
    return found


def test_journalctl_x_explains_the_lifecycle_entries(fleet: Fleet) -> None:
    project = fleet.project("catalog")
    task_id = fleet.add(project, "echo ok", "--coder", "command")
    fleet.finish(task_id)
    [started] = fleet.entries(task_id, f"MESSAGE_ID={MSG_STARTED}")
    pid = started["FLEET_PID"]
    notes = explained(fleet.box, f"FLEET_TASK_ID={task_id}")
    assert notes[f"attempt 1 started: command in {project} (pid {pid})"][:5] == [
        "Subject: A fleet task attempt started",
        "Defined-By: fleet",
        "Documentation: man:fleet-run(1)",
        "",
        f"Attempt 1 of fleet task {task_id} started its coder (command), process {pid}."
        " Every line the agent prints follows as an entry with FLEET_EVENT set;"
        f" `fleet logs {task_id}` shows them all.",
    ]
    assert notes["ok"] == []  # an event has no MESSAGE_ID, so no explanation
    ended = notes["attempt 1 ended: success"]
    assert ended[0] == "Subject: A fleet task attempt ended"
    assert ended[4].startswith(f"Attempt 1 of fleet task {task_id} ended with the verdict success.")

    # Started again by hand, the unit of a finished task refuses to run it, and says why.
    unit = f"fleet-task@{task_id}.service"
    try:
        assert fleet.box.systemctl("start", unit, check=False).returncode != 0
        fleet.box.wait_for(
            lambda: bool(fleet.entries(task_id, f"MESSAGE_ID={MSG_REFUSED}")), 30, "the refusal"
        )
    finally:
        fleet.box.systemctl("reset-failed", unit, check=False)
    [refusal] = explained(
        fleet.box, f"FLEET_TASK_ID={task_id}", f"MESSAGE_ID={MSG_REFUSED}"
    ).values()
    assert refusal[0] == "Subject: A fleet task unit did not start an attempt"
    assert refusal[4].startswith(
        f"The unit of fleet task {task_id} was started, but the task could not be claimed"
    )
    shown = fleet.show(task_id)
    assert (shown["status"], shown["attempts"]) == ("done", 1)


def test_fifty_thousand_events_arrive_in_order_without_a_gap(fleet: Fleet) -> None:
    count = 50_000
    project = fleet.project("many")
    lines = (json.dumps({"event": "text", "text": f"line {n}"}) for n in range(1, count + 1))
    (project / "many.jsonl").write_text("".join(f"{line}\n" for line in lines) + json.dumps(CLOSE))
    task_id = fleet.add(project, "many.jsonl")
    fleet.finish(task_id, timeout=240)  # ~8 s on an idle machine
    out = fleet.box.run(
        "journalctl",
        "--no-pager",
        "-o",
        "json",
        "--output-fields=FLEET_SEQ,FLEET_ATTEMPT,MESSAGE",
        f"FLEET_TASK_ID={task_id}",
        "FLEET_EVENT=text",
    ).stdout.splitlines()
    assert len(out) == count
    got = [json.loads(line) for line in out]
    assert [int(e["FLEET_SEQ"]) for e in got] == list(range(1, count + 1))
    assert {e["FLEET_ATTEMPT"] for e in got} == {"1"}
    mismatched = [e for n, e in enumerate(got, 1) if e["MESSAGE"] != f"line {n}"]
    assert mismatched == []


def test_a_two_megabyte_event_arrives_whole(fleet: Fleet) -> None:
    big = "".join(f"{n:08d}" for n in range(1 << 18))  # 2 MiB, every offset distinct
    project = fleet.project("big")
    name = replay(project / "big.jsonl", {"event": "text", "text": big}, CLOSE)
    task_id = fleet.add(project, name)
    fleet.finish(task_id)
    [entry] = fleet.entries(task_id, "FLEET_EVENT=text")
    assert len(big.encode()) == 2 << 20
    assert json.loads(text(entry["FLEET_RAW"])) == {"event": "text", "text": big}
    assert text(entry["MESSAGE"]) == big[:MAX_MESSAGE]
    assert entry["_SYSTEMD_UNIT"] == f"fleet-task@{task_id}.service"


def test_secrets_never_reach_the_journal(fleet: Fleet) -> None:
    anthropic = "sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0_Lz-XcVbNm"
    bearer = "xyzAbC123.dEf456-gHi789"
    env_secret = "hunter2-correct-horse"
    project = fleet.project("leaky")
    (project / "leak.sh").write_text(
        f'echo "anthropic key {anthropic}"\n'
        f'echo "Authorization: Bearer {bearer}"\n'
        'echo "token is $MY_API_TOKEN here"\n'
    )
    dropin = "fleet-task@.service.d/secret.conf"
    fleet.box.write_unit(dropin, f"[Service]\nEnvironment=MY_API_TOKEN={env_secret}\n")
    try:
        task_id = fleet.add(project, "sh leak.sh", "--coder", "command")
        fleet.finish(task_id)
    finally:
        (fleet.box.units / dropin).unlink()
        fleet.box.systemctl("daemon-reload")
    output = fleet.entries(task_id, "FLEET_EVENT=output")
    assert [e["MESSAGE"] for e in output] == [
        "anthropic key [REDACTED]",
        "Authorization: Bearer [REDACTED]",
        "token is [REDACTED] here",
    ]
    unit = fleet.box.journal("-u", f"fleet-task@{task_id}.service")
    everything = fleet.entries(task_id) + unit
    assert len(everything) > len(output)
    secrets = (anthropic, bearer, env_secret, "Zx9Qw8Er7Ty6Ui5", "hunter2")
    leaks = [
        (name, text(value))
        for entry in everything
        for name, value in entry.items()
        if any(secret in text(value) for secret in secrets)
    ]
    assert leaks == []


def fields_of(datagram: bytes) -> dict[str, str]:
    """An entry in journald's native protocol (`KEY=value` lines, or `KEY`, a 64-bit length
    and the value for values with newlines), read back."""
    fields: dict[str, str] = {}
    at = 0
    while at < len(datagram):
        end = datagram.index(b"\n", at)
        line = datagram[at:end]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            at = end + 1
        else:
            key, (size,) = line, struct.unpack("<Q", datagram[end + 1 : end + 9])
            value = datagram[end + 9 : end + 9 + size]
            at = end + 10 + size
        assert key.decode() not in fields, key
        fields[key.decode()] = value.decode()
    return fields


@pytest.fixture
def listener() -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket standing in for journald's (a short path: AF_UNIX allows 108 bytes)."""
    directory = tempfile.mkdtemp(prefix="fleet-j-", dir="/tmp")
    path = os.path.join(directory, "socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(DEADLINE)
    yield path, sock
    sock.close()
    shutil.rmtree(directory)


def test_each_entry_has_every_field_and_no_secret(listener: tuple[str, socket.socket]) -> None:
    # Secrets that only parsing reveals must be masked in what parsing made of them: a key
    # behind a JSON escape, a bearer token whose space was an escaped newline (tool inputs are
    # shown on one line), a configured value.
    path, sock = listener
    key = "sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0_Lz-XcVbNm"
    configured = "hunter2 correct"
    call = {
        "type": "tool_use",
        "id": "t1",
        "name": "Bash",
        "input": {"command": "Bearer\nab.cdefgh"},
    }
    result = {"type": "tool_result", "tool_use_id": "t1", "content": f"pw {configured}"}
    text = {"type": "text", "text": f"the key: {key}"}
    usage = {"input_tokens": 5}
    lines = [
        json.dumps({"type": "assistant", "message": {"id": "m1", "content": [call]}}),
        json.dumps({"type": "user", "message": {"content": [result]}}),
        json.dumps(
            {"type": "assistant", "message": {"id": "m2", "content": [text], "usage": usage}}
        ).replace(key, "\\u0073" + key[1:]),
    ]
    assert key not in lines[2] and "Bearer " not in lines[0]
    # The raw line too: masked as it reads with the escape spelled plainly.
    hidden = lines[2].replace("\\u0073" + key[1:], MASK)
    assert hidden != lines[2]
    journal = Journal(path)
    sink = Sink(Context("fl-x", 2, "claude", "opus"), Redactor([configured]), journal)
    coder = ClaudeCoder(CoderSettings())
    for line in lines:
        for event in coder.parse(line):
            sink.emit(event, line)
    journal.close()
    got = [fields_of(sock.recv(1 << 16)) for _ in range(4)]
    common = {
        "PRIORITY": "6",
        "SYSLOG_IDENTIFIER": "fleet-run",
        "FLEET_TASK_ID": "fl-x",
        "FLEET_ATTEMPT": "2",
        "FLEET_CODER": "claude",
        "FLEET_MODEL": "opus",
    }
    assert got == [
        {
            **common,
            "FLEET_EVENT": "tool_call",
            "FLEET_SEQ": "1",
            "MESSAGE": f"→ Bash: Bearer {MASK}",
            "FLEET_TOOL": "Bash",
            "FLEET_RAW": lines[0],
        },
        {
            **common,
            "FLEET_EVENT": "tool_result",
            "FLEET_SEQ": "2",
            "MESSAGE": f"← pw {MASK}",
            "FLEET_TOOL": "Bash",
            "FLEET_RAW": lines[1].replace(configured, MASK),
        },
        {
            **common,
            "FLEET_EVENT": "text",
            "FLEET_SEQ": "3",
            "MESSAGE": f"the key: {MASK}",
            "FLEET_RAW": hidden,
        },
        {
            **common,
            "FLEET_EVENT": "usage",
            "FLEET_SEQ": "4",
            "MESSAGE": "tokens in 5 out 0",
            "FLEET_TOKENS_IN": "5",
            "FLEET_TOKENS_OUT": "0",
            "FLEET_CONTEXT": "5",
            "FLEET_RAW": hidden,
        },
    ]


def test_a_replaced_journal_socket_is_found_again(listener: tuple[str, socket.socket]) -> None:
    path, first = listener
    journal = Journal(path)
    journal.send({"MESSAGE": "one"})
    assert fields_of(first.recv(1 << 16)) == {"MESSAGE": "one"}
    first.close()
    os.unlink(path)
    with pytest.raises(FileNotFoundError):  # as when journald's socket is gone
        journal.send({"MESSAGE": "lost"})
    second = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    second.bind(path)
    second.settimeout(DEADLINE)
    with second:
        journal.send({"MESSAGE": "two", "FLEET_SEQ": 2}, b"PRIORITY=6\n")
        assert fields_of(second.recv(1 << 16)) == {
            "PRIORITY": "6",
            "MESSAGE": "two",
            "FLEET_SEQ": "2",
        }
    journal.close()


def test_fleet_logs_shows_every_attempt(fleet: Fleet) -> None:
    project = fleet.project("flaky")
    script = 'test -f marker || { touch marker; echo "first try"; exit 1; }; echo "second try"'
    task_id = fleet.add(project, script, "--coder", "command")
    fleet.finish(task_id, attempts=2)
    started = re.compile(rf"attempt ([12]) started: command in {project} \(pid \d+\)")

    def shape(records: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
        """The records with the varying part of the started lines (the pid) taken out."""
        return [(a, e, "started" if started.fullmatch(m) else m) for a, e, m in records]

    everything = [
        (1, "lifecycle", "started"),
        (1, "output", "first try"),
        (1, "lifecycle", "attempt 1 ended: failure (exit status 1)"),
        (2, "lifecycle", "started"),
        (2, "output", "second try"),
        (2, "lifecycle", "attempt 2 ended: success"),
    ]
    logged = [json.loads(line) for line in fleet("logs", task_id, "--json").stdout.splitlines()]
    # The audit trail's entries come along (`fleet history` has them all); the rest is events.
    trail = [r["message"].split()[1] for r in logged if r["event"] == "audit"]
    assert trail == ["added", "claimed", "ended", "claimed", "ended"]
    records = [r for r in logged if r["event"] != "audit"]
    for rec in records:
        assert {"time", "attempt", "event", "message"} <= set(rec), rec
        assert datetime.fromisoformat(rec["time"].replace("Z", "+00:00")).tzinfo is not None
    assert shape([(r["attempt"], r["event"], r["message"]) for r in records]) == everything

    pattern = re.compile(r"\d\d:\d\d:\d\d +#(\d+) (\S+) +(.*)")

    def plain(*options: str) -> list[tuple[int, str, str]]:
        out = fleet("logs", task_id, *options).stdout.splitlines()
        matches = [pattern.fullmatch(line) for line in out if " audit " not in line]
        assert all(matches), out
        return shape([(int(m[1]), m[2], m[3]) for m in matches if m])

    assert plain() == everything
    assert plain("--attempt", "2") == everything[3:]
    assert plain("--attempt", "1") == everything[:3]


class Follower:
    """`fleet logs` in the sandbox as a process of its own, interrupted like Ctrl-C at `stop_at`.

    The SIGINT goes out from the thread that reads fleet's output the moment the entry whose
    message is `stop_at` arrives, as a reader that stops at a given entry would send it: fleet
    has just printed that entry and is saving its cursor. It goes to fleet, the child that
    nsenter forked into the sandbox, and not to nsenter: nsenter would die of it at once
    without reaping fleet, and an orphan of the sandbox's namespace, reparented to the host's
    init, holds up the sandbox's poweroff.
    """

    def __init__(self, box: Sandbox, env: dict[str, str], *args: str, stop_at: str) -> None:
        argv = ["nsenter", "-t", str(box.pid), "-m", "-p", "-u", "-i", "--wd=/", "--"]
        environment = {"PATH": PATH, "LANG": "C.UTF-8", "HOME": "/root", **env}
        self.stop_at = stop_at
        self.interrupted = threading.Event()
        self.proc = subprocess.Popen(
            [*argv, FLEET, "logs", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                record = json.loads(line)
                if record["message"] == self.stop_at and not self.interrupted.is_set():
                    children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
                    [fleet] = children.read_text().split()
                    os.kill(int(fleet), signal.SIGINT)
                    self.interrupted.set()
                self.lines.put(record)
        finally:
            self.lines.put(None)

    def _next(self, timeout: float, what: str, got: list[dict[str, Any]]) -> dict[str, Any] | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no {what} within {timeout:g} s; got {got}") from None

    def read_until(self, message: str, timeout: float = 30) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while (record := self._next(timeout, repr(message), got)) is not None:
            got.append(record)
            if record["message"] == message:
                return got
        raise AssertionError(f"fleet logs ended before {message!r}: {got} {self.stderr()}")

    def rest(self, timeout: float = 30) -> list[dict[str, Any]]:
        """What it printed after the last read_until, until it ended."""
        got: list[dict[str, Any]] = []
        while (record := self._next(timeout, "end", got)) is not None:
            got.append(record)
        self.proc.wait(timeout=timeout)
        assert self.interrupted.is_set(), f"{self.stop_at!r} never came: {got}"
        return got

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.reader.join(timeout=DEADLINE)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def test_follow_then_resume_from_the_cursor_file(fleet: Fleet) -> None:
    project = fleet.project("follow")
    ticks = [{"event": "text", "text": f"tick {n}"} for n in range(1, 31)]

    def gate(name: str) -> dict[str, list[str]]:
        """Waits (at most 30 s) until the test creates the file `name`."""
        loop = f"i=0; until [ -e {name} ] || [ $i -ge 1500 ]; do sleep 0.02; i=$((i+1)); done"
        return {"run": ["sh", "-c", loop]}

    def slowly(items: list[dict[str, str]]) -> list[object]:
        pause = {"sleep": 0.05}
        return [step for item in items for step in (item, pause)]

    name = replay(
        project / "slow.jsonl",
        *ticks[:10],
        gate("go1"),
        *slowly(ticks[10:20]),
        gate("go2"),
        *slowly(ticks[20:]),
        CLOSE,
    )
    task_id = fleet.add(project, name)
    fleet.box.wait_for(
        lambda: bool(fleet.entries(task_id, "MESSAGE=tick 10")), 30, "the first ten ticks"
    )
    cursor = project / "cursor"
    shown: list[dict[str, Any]] = []
    for seen, go, stop in (("tick 10", "go1", "tick 15"), ("tick 20", "go2", "tick 25")):
        follower = Follower(
            fleet.box,
            fleet.env,
            "-f",
            task_id,
            "--json",
            "--cursor-file",
            str(cursor),
            stop_at=stop,
        )
        try:
            # What is there already (the first time eleven entries, more than journalctl -f
            # shows by itself, the second time from the cursor on) ...
            shown += follower.read_until(seen)
            (project / go).touch()
            # ... then entries that only exist once the follower runs, up to the interruption.
            shown += follower.rest()
            assert follower.proc.returncode == 130
            assert follower.stderr().strip() == "fleet: interrupted"
        finally:
            follower.close()
        assert cursor.read_text().strip()
    fleet.finish(task_id)
    resumed = fleet("logs", task_id, "--json", "--cursor-file", str(cursor)).stdout
    rest = [json.loads(line) for line in resumed.splitlines()]
    entries = fleet.entries(task_id)
    journal = [text(e["MESSAGE"]) for e in entries]
    events = [text(e["MESSAGE"]) for e in entries if e.get("FLEET_EVENT") != "audit"]
    assert events[0].startswith("attempt 1 started: replay")
    assert events[-2:] == [task_id, "attempt 1 ended: success"]
    assert len(events) == 33
    assert [r["message"] for r in shown + rest] == journal
    assert rest, "interrupted mid-stream, so the last run has the rest to print"
    again = fleet("logs", task_id, "--json", "--cursor-file", str(cursor))
    assert again.stdout == ""
