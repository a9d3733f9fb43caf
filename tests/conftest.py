"""Shared fixtures: every test gets its own FLEET_HOME and clean FLEET_* environment."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleet.cli import main
from tests.sandbox import wait_for

ROOT = Path(__file__).resolve().parent.parent


def fleet_exe(name: str = "fleet") -> str:
    """The installed console script next to this interpreter, else the checkout's bin/ copy."""
    found = shutil.which(name, path=os.path.dirname(sys.executable))
    return found or str(ROOT / "bin" / name)


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in list(os.environ):
        if var.startswith("FLEET_") or var.startswith("XDG_"):
            monkeypatch.delenv(var)
    fleet_home = tmp_path / "home"
    monkeypatch.setenv("FLEET_HOME", str(fleet_home))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return fleet_home


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


class Fleet:
    """Runs `fleet` in this process (fast) with captured output."""

    def __init__(self, capsys: pytest.CaptureFixture[str], cwd: Path) -> None:
        self.capsys = capsys
        self.cwd = cwd

    def __call__(self, *args: str) -> Result:
        self.capsys.readouterr()
        old = os.getcwd()
        os.chdir(self.cwd)
        try:
            code = main(list(args))
        finally:
            os.chdir(old)
        captured = self.capsys.readouterr()
        return Result(code, captured.out, captured.err)

    def ok(self, *args: str) -> str:
        result = self(*args)
        assert result.code == 0, result.err
        return result.out

    def add(self, *args: str) -> str:
        return self.ok("add", *args).strip()

    def show(self, task_id: str) -> dict[str, Any]:
        obj = json.loads(self.ok("show", task_id, "--json"))
        assert isinstance(obj, dict)
        return obj


@pytest.fixture
def fleet(capsys: pytest.CaptureFixture[str], project: Path) -> Fleet:
    return Fleet(capsys, project)


def run_fleet(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> Result:
    """Runs the installed `fleet` as a separate process, as a user's shell would."""
    proc = subprocess.run(
        [fleet_exe(), *args],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )
    return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def fleet_run(
    task_id: str, cwd: Path, program: Path | None = None, timeout: float = 90, **env: str
) -> subprocess.CompletedProcess[str]:
    """`fleet-run ID` by hand (foreground: events as JSON lines on stdout, outcome settled)."""
    return subprocess.run(
        [str(program or fleet_exe("fleet-run")), task_id],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
        check=False,
    )


def events_of(out: str) -> list[dict[str, Any]]:
    """The JSON events a foreground fleet-run printed."""
    return [json.loads(line) for line in out.splitlines()]


def show_task(fleet: Fleet, task_id: str) -> dict[str, Any]:
    return fleet.show(task_id)


@contextmanager
def run_in_background(task_id: str, cwd: Path, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`fleet-run ID` by hand in the background, its events going to `out` and its standard
    error to `out` + ".err"; killed if it is still running when the block ends."""
    with out.open("wb") as sink, out.with_suffix(".err").open("wb") as errors:
        agent = subprocess.Popen(
            [fleet_exe("fleet-run"), task_id], cwd=cwd, stdout=sink, stderr=errors
        )
        try:
            yield agent
        finally:
            if agent.poll() is None:
                agent.kill()
            agent.wait(timeout=30)


def asked_in_background(
    task_id: str, agent: subprocess.Popen[bytes], out: Path, deadline: float = 60.0
) -> dict[str, Any]:
    """The question the task's agent asks, as `fleet questions --wait` (another process, like a
    person's notifier script) reports it, once it is pending."""
    command = [fleet_exe(), "questions", "--wait", "--json", "--timeout", str(deadline)]
    waiter = subprocess.Popen(
        [*command, "--task", task_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(
            lambda: waiter.poll() is not None or agent.poll() is not None,
            deadline + 10,
            "a question, or the end of the run",
        )
    finally:
        if waiter.poll() is None:
            waiter.kill()
        found, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, (
        f"no question; fleet-run: {agent.poll()}, {err}\n"
        + out.read_text()[-3000:]
        + out.with_suffix(".err").read_text()[-3000:]
    )
    (question,) = json.loads(found)
    assert isinstance(question, dict)
    return question


def store_at_version(home: Path, version: int) -> sqlite3.Connection:
    """A new store in `home` as fleet's schema `version` left it, for migration tests."""
    from fleet.store.schema import MIGRATIONS

    home.mkdir(mode=0o700, parents=True)
    db = sqlite3.connect(home / "fleet.db")
    for statements in MIGRATIONS[:version]:
        for sql in statements:
            db.execute(sql)
    db.execute(f"PRAGMA user_version = {version}")
    return db


def pg_store_at_version(cluster: Any, version: int, *statements: str) -> str:
    """The URL of a new PostgreSQL database as fleet's schema `version` left it, with
    `statements` run in it, for migration tests (the twin of `store_at_version`)."""
    import psycopg

    from fleet.store.pgschema import MIGRATIONS

    url = str(cluster.new_database(template=None))
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for step in MIGRATIONS[:version]:
            for sql in step:
                conn.execute(sql.encode())
        conn.execute(b"CREATE TABLE fleet_schema (version INTEGER NOT NULL)")
        conn.execute(f"INSERT INTO fleet_schema VALUES ({int(version)})".encode())
        for sql in statements:
            conn.execute(sql.encode())
    return url


BACKENDS = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses `backend` runs on each store; one marked `sqlite_only` or
    `postgresql_only` on that one alone."""
    if "backend" in metafunc.fixturenames:
        marked = metafunc.definition.get_closest_marker
        names = [
            b for b in BACKENDS if not marked(f"{'postgresql' if b == 'sqlite' else 'sqlite'}_only")
        ]
        metafunc.parametrize("backend", names, indirect=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A PostgreSQL cluster of this test session's own (tests/pg.py), started on first use."""
    from tests.pg import Cluster

    cluster = Cluster()
    try:
        cluster.start()
        cluster.make_template()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def backend(request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The store the test's fleet uses: SQLite in its FLEET_HOME, or a new, empty PostgreSQL
    database (FLEET_STORE, which fleet processes the test starts inherit)."""
    name = str(request.param)
    if name == "postgresql":
        cluster = request.getfixturevalue("pg_cluster")
        monkeypatch.setenv("FLEET_STORE", cluster.new_database())
    return name


def store_sql(home: Path, sql: str) -> None:
    """Run `sql` (no parameters) straight on the test's store, bypassing fleet (as a person
    with the database's shell would), and commit it: FLEET_STORE's PostgreSQL database if
    set, else SQLite's file in `home`."""
    url = os.environ.get("FLEET_STORE")
    if url:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.encode())
        return
    db = sqlite3.connect(home / "fleet.db")
    try:
        db.execute(sql)
        db.commit()
    finally:
        db.close()


def store_rows(home: Path, sql: str) -> list[tuple[Any, ...]]:
    """The rows of `sql` (no parameters) read straight from the test's store, bypassing fleet:
    FLEET_STORE's PostgreSQL database if set, else SQLite's file in `home`."""
    url = os.environ.get("FLEET_STORE")
    if url:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            return [tuple(r) for r in conn.execute(sql.encode()).fetchall()]
    db = sqlite3.connect(home / "fleet.db")
    try:
        return [tuple(r) for r in db.execute(sql).fetchall()]
    finally:
        db.close()


def tree_command_lines(root: int) -> dict[int, bytes]:
    """pid -> /proc/PID/cmdline (NULs as spaces) of `root` and of every process below it, as
    any local user can read them."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(b")", 1)[1].split()[1])
    found: dict[int, bytes] = {}
    for pid in parent:
        up = pid
        while up > 1 and up != root:
            up = parent.get(up, 0)
        if up == root:
            try:
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
    return found


def command_lines_once(root: int, running: str, deadline: float = 60.0) -> dict[int, bytes]:
    """`tree_command_lines(root)` once one of the processes runs a command containing
    `running` (the agent's tool: the agent is then well under way)."""
    seen: dict[int, bytes] = {}

    def started() -> bool:
        seen.update(tree_command_lines(root))
        return any(running.encode() in line for line in seen.values())

    wait_for(started, deadline, f"a process running {running!r}")
    return seen
